"""A Spark Connect server beside a stack, so a verification pays no JVM start.

``txchaos up`` starts it (detached, like the stack's servers) and ``txchaos down`` stops it; it
listens on loopback only. Its address goes to ``<stack folder>/spark-connect.json``, its log to
``<stack folder>/logs/spark-connect.log``, its scratch space (warehouse, shuffle files) to
``<stack folder>/spark-connect/``, claimed in the process registry so a reaper removes it with
the process. The server is the ``spark-connect`` jar the pyspark wheel ships, launched through
that wheel's ``spark-submit``: this module starts a process and never imports pyspark.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from harness.errors import ConfigError, TxChaosError
from harness.stack.procs import claim_paths, free_ports, reap_orphans, spawn
from harness.stack.waits import Wait, port_open

RECORD = "spark-connect.json"
LOG = "spark-connect.log"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 90.0  # about 5 s on an idle 2-core machine; a busy one is slower
PROBE_S = 0.5  # a loopback server answers a TCP connect in milliseconds
DRIVER_MEMORY = "2g"

# Measured on 2 cores (10M events, cold JVM): the parallel collector instead of G1 (its concurrent
# threads compete with the two task threads) 17.2 s -> 14.5 s. Generated methods over 8000
# bytecodes (the per-operation overlay of 60 fault windows is one) stay interpreted unless
# DontCompileHugeMethods is off: the overlay step at 10M events took 11.0 s with it on, 2.3 s off.
JVM_OPTIONS = "-XX:+UseParallelGC -XX:-DontCompileHugeMethods"


def log4j(level: str, **loggers: str) -> str:
    """Return a log4j2 properties text: everything at ``level`` (each of ``loggers``, key=name, too) to stderr."""
    named = "".join(f"logger.{key}.name = {name}\nlogger.{key}.level = {level}\n" for key, name in loggers.items())
    return (
        f"rootLogger.level = {level}\n{named}rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\nappender.console.name = console\nappender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
    )


# The server logs warnings and errors only: at INFO it writes lines for every query it plans.
SERVER_LOG4J = log4j("warn")


def spark_home() -> Path:
    """Return the pyspark installation (its ``bin/spark-submit`` and ``jars/``) without importing it."""
    spec = find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("pyspark is not installed", hint="run `txchaos install` (or pip install txchaos)")
    return Path(next(iter(spec.submodule_search_locations)))


def server_argv(home: Path, port: int, scratch: Path, log_config: Path) -> list[str]:
    """Return the ``spark-submit`` command line of a loopback-only Connect server on ``port``."""
    cores = os.cpu_count() or 2
    java = f"{JVM_OPTIONS} -Dlog4j2.configurationFile={log_config.as_uri()}"
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": java,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.default.parallelism": str(2 * cores),
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.local.dir": str(scratch / "tmp"),
    }
    argv = [str(home / "bin" / "spark-submit"), "--master", "local[*]", "--driver-memory", DRIVER_MEMORY]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, "--name", "txchaos-spark-connect", "--class", SERVER_CLASS, "spark-internal"]


def _tag(stack_id: str) -> str:
    return f"stack/{stack_id}/spark-connect"


def start(state_dir: Path, stack_id: str, *, timeout: float = START_TIMEOUT_S) -> str:
    """Start the stack's Connect server (detached: only ``stop`` ends it); return its ``sc://`` URL
    once it accepts connections. Raises ``StackError`` with the server's log tail when it does not."""
    home = spark_home()
    port = free_ports(1)[0]
    scratch = state_dir / "spark-connect"
    claim_paths(_tag(stack_id), [scratch], detached=True)  # before creating it: a reaper removes it
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    log_config = scratch / "log4j2.properties"
    log_config.write_text(SERVER_LOG4J)
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")  # loopback only
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)  # the server is a classic driver, whoever starts it
    proc = spawn(
        server_argv(home, port, scratch, log_config),
        name="spark-connect",
        tag=_tag(stack_id),
        log_path=state_dir / "logs" / LOG,
        env=env,
        cwd=scratch,
        detached=True,
    )
    try:
        Wait("spark connect server", port_open("127.0.0.1", port), timeout=timeout, hint=f"read {proc.log_path}").run(
            proc
        )
    except BaseException:
        stop(state_dir, stack_id)  # a server still starting after the timeout must not outlive the failure
        raise
    url = f"sc://127.0.0.1:{port}"
    (state_dir / RECORD).write_text(json.dumps({"url": url, "pid": proc.pid}))
    return url


def address(state_dir: Path) -> str | None:
    """Return the ``sc://`` URL of the stack's Connect server when it answers, else None."""
    try:
        url = str(json.loads((state_dir / RECORD).read_text())["url"])
        host, _, port = url.removeprefix("sc://").rpartition(":")
        with socket.create_connection((host, int(port)), timeout=PROBE_S):
            return url
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop(state_dir: Path, stack_id: str) -> list[str]:
    """Stop the stack's Connect server and remove its scratch folder (its log stays); return what was reaped."""
    reaped = reap_orphans(include_detached_tag=_tag(stack_id))
    with contextlib.suppress(OSError):
        (state_dir / RECORD).unlink()
    return reaped


ENV = "TXCHAOS_SPARK_CONNECT"  # "off": never reach a server; "sc://HOST:PORT": reach that one


def current_address() -> str | None:
    """Return the Connect server URL of the stack ``txchaos up`` started (or ``$TXCHAOS_ENDPOINTS`` names),
    when it answers; None otherwise. ``$TXCHAOS_SPARK_CONNECT`` overrides: ``off``, or a server's URL."""
    chosen = os.environ.get(ENV, "")
    if chosen == "off":
        return None
    if chosen:
        if not chosen.startswith("sc://"):
            raise ConfigError(f"{ENV}={chosen!r} is neither off nor sc://HOST:PORT", hint=f"unset {ENV} or fix it")
        return chosen
    from harness.stack.selection import endpoints_from_env, load_current  # reads two small JSON files

    try:
        endpoints = endpoints_from_env() or load_current()
    except (OSError, ValueError, KeyError, ConfigError):
        return None
    return None if endpoints is None else address(Path(endpoints.state_dir))


def up(state_dir: str | Path, stack_id: str, *, enabled: bool = True, warm: Sequence[str] = ()) -> str:
    """Start the server for ``txchaos up`` and return the line to print; a server that fails to start
    leaves the stack up (a verification then starts a local session), and the line says why.

    ``warm``: a command run in the background once the server answers (``$TXCHAOS_SPARK_CONNECT``
    names it), detached like the server and stopped with it: a fresh server's first job compiles
    what every later one reuses.
    """
    if not enabled:
        return "spark connect: not started (--no-spark); `txchaos verify` starts a local session"
    try:
        url = start(Path(state_dir), stack_id)
    except TxChaosError as exc:
        first = str(exc).splitlines()[0]
        return f"spark connect: did not start ({first}); `txchaos verify` starts a local session instead"
    if warm:
        log = Path(state_dir) / "logs" / "spark-connect-warm.log"
        env = dict(os.environ, **{ENV: url})
        scratch = Path(state_dir) / "spark-connect"  # claimed: what it leaves goes with the server
        tag = f"{_tag(stack_id)}-warm"
        spawn(list(warm), name="spark-connect-warm", tag=tag, log_path=log, env=env, cwd=scratch, detached=True)
    return f"spark connect: {url}  (`txchaos verify` and the pytest plugin run their Spark jobs there)"
