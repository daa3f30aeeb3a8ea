"""Spark sessions for the engine: a local driver this process starts, or the stack's Connect server.

A cold ``txchaos verify`` starts a ``local[*]`` driver JVM tuned for one job; a stack started by
``txchaos up`` runs a Spark Connect server (``stack/spark_connect.py``) that a verification reaches
instead, paying no JVM start. The job (``job.py``) uses only the DataFrame and SQL API, which both
kinds of session serve.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from pyspark.sql import SparkSession

from harness.errors import ConfigError
from harness.paths import cache_root
from harness.stack import spark_connect

if TYPE_CHECKING:  # the Connect client pulls in pandas and grpc (0.3-0.4 s): a local verification skips it
    from pyspark.sql.connect.session import SparkSession as RemoteSession

Session: TypeAlias = "SparkSession | RemoteSession"  # what the job runs on: a local driver or a Connect client
REMOTE_MODULE = "pyspark.sql.connect.session"

# The JVM options every driver gets are the Connect server's too (``spark_connect.JVM_OPTIONS``);
# the class-data archive took JVM start 3.7 -> 2.1 s at 10M events, cold.
JVM_OPTIONS = spark_connect.JVM_OPTIONS
# A driver that runs one verification and exits (a cold `txchaos verify`) spends its first job
# compiling: C2's optimizing compiler competes with the two task threads for the 2 cores and its
# code arrives after the job is over. C1 only: the 10M-event cold CLI 25.1-26.1 s -> 21.5-21.8 s.
# A session that runs many jobs (the pytest plugin's, the benchmark's warm one) keeps C2.
ONE_SHOT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
CDS_DUMP_ENV = "TXCHAOS_SPARK_CDS_DUMP"  # set by build_class_archive for its training run

# Settings of every session, local or remote (a Connect client sets them on its own session).
# ANSI arithmetic off (overflow checks on every sum; our sums count events): 13.7 -> 12.6 s at 10M.
# Adaptive execution and the generated two-level hash map only add planning and code for a job
# whose shapes are known; both off.
SQL_CONF: dict[str, bool | float | int | str | None] = {
    "spark.sql.shuffle.partitions": str(2 * (os.cpu_count() or 2)),
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.aggregate.map.twolevel.enabled": "false",
}


# A JDK of this version or newer keeps an AOT cache (JEP 483, 514 and 515): the classes a training
# run loaded and linked, and the profiles of the methods it ran, so a new driver's JIT compiles its
# hot methods sooner. A cold `txchaos verify` (Spark 4.3, interleaved runs), against JDK 17 with a
# class-data archive: 105M events, job 20.7-21.3 -> 18.8-19.1 s; 10.5M events, the same within the
# spread (6.4-7.2 s); the JVM start alike (docs/benchmarks.md).
AOT_MIN_JAVA = 25
JDK_ROOT = Path("/usr/lib/jvm")  # where Debian's and Temurin's packages put their JDKs


def java_version(home: Path) -> int:
    """Return the major version of the JDK at ``home`` from its ``release`` file (0 when unknown)."""
    release = home / "release"
    text = release.read_text(errors="replace") if release.is_file() else ""
    match = re.search(r'^JAVA_VERSION="(\d+)', text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def driver_java_home(master: str | None = None) -> Path | None:
    """Return the JDK a driver this process starts runs on: ``JAVA_HOME`` when set (the user's
    choice); else, for a local master, the newest JDK of ``AOT_MIN_JAVA`` or newer under
    ``JDK_ROOT``; else None (the ``java`` on PATH). A cluster's executors run the JVM of their
    hosts, so a driver for ``spark://`` keeps the machine's default."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    if master is not None and not LOCAL_MASTER.fullmatch(master):
        return None
    homes = [h for h in JDK_ROOT.glob("*") if (h / "bin" / "java").is_file() and not h.is_symlink()]
    newest = max(((java_version(h), h.name, h) for h in homes), default=None)
    return newest[2] if newest is not None and newest[0] >= AOT_MIN_JAVA else None


def _java_binary(home: Path | None) -> Path:
    found = home / "bin" / "java" if home else None
    return (found if found and found.exists() else Path(shutil.which("java") or "java")).resolve()


def class_archive(master: str | None = None) -> Path:
    """Return where the driver's class archive lives (it may not exist yet): an AOT cache (``.aot``)
    for a JDK of ``AOT_MIN_JAVA`` or newer, a class-data archive (``.jsa``) for an older one.

    Named by the pyspark version and the java binary, so a new JDK or pyspark gets a new archive.
    """
    real = _java_binary(driver_java_home(master))
    stamp = f"{real}:{real.stat().st_mtime_ns if real.exists() else 0}:{metadata.version('pyspark')}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    aot = java_version(real.parent.parent) >= AOT_MIN_JAVA
    return cache_root() / "spark" / f"driver-{key}.{'aot' if aot else 'jsa'}"


@contextmanager
def _driver_java(master: str | None) -> Iterator[None]:
    """Give the driver JVM started inside the block ``driver_java_home``'s JDK (spark-submit runs
    ``$JAVA_HOME/bin/java``); the process's own ``JAVA_HOME`` is back as it was after it."""
    home = driver_java_home(master)
    saved = os.environ.get("JAVA_HOME")
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("JAVA_HOME", None)
        else:
            os.environ["JAVA_HOME"] = saved


# The driver's log4j configuration when the CLI is not asked to be verbose: errors only, so a
# verification prints its verdict and not the JVM's start-up warnings (NativeCodeLoader, the
# default-profile banner). PySpark counts as a shell, and a shell whose repl logger has no level of
# its own is told "Setting default log level to WARN": the repl logger gets the root's level.
QUIET_LOG4J = spark_connect.log4j("error", repl="org.apache.spark.repl.Main")


def quiet_log_config() -> Path:
    """Return the errors-only log4j2 file for the driver, written once under the cache."""
    path = cache_root() / "spark" / "log4j2-quiet.properties"
    if not path.is_file() or path.read_text() != QUIET_LOG4J:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(QUIET_LOG4J)
        tmp.replace(path)
    return path


def _java_options(*, verbose: bool = True, one_shot: bool = False, master: str | None = None) -> str:
    base = f"{JVM_OPTIONS} {ONE_SHOT_JVM_OPTIONS}" if one_shot else JVM_OPTIONS
    if not verbose:
        base += f" -Dlog4j2.configurationFile={quiet_log_config().as_uri()}"
    archive = class_archive(master)
    aot = archive.suffix == ".aot"
    dump = os.environ.get(CDS_DUMP_ENV)
    if dump:
        return f"{base} -XX:{'AOTCacheOutput' if aot else 'ArchiveClassesAtExit'}={dump}"
    if not archive.is_file():
        return base
    # a stale or foreign archive is ignored by the JVM; its warnings would only be noise
    if aot:
        return f"{base} -XX:AOTCache={archive} -Xlog:aot=off -Xlog:cds=off"
    return f"{base} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


# The training run's ledger: an AOT cache holds the profiles of what it ran, and those of 1M events
# served the 10.5M-event cold job better than 100k events' (6.5-6.8 s against 6.9-7.2); the training
# takes about 30 s either way, most of it the JVM writing the cache when it exits.
TRAINING_EVENTS = 1_000_000


def build_class_archive(events: int = TRAINING_EVENTS) -> Path | None:
    """Record what a verification's driver loads (and, with an AOT cache, the profiles of what it
    runs) into ``class_archive``; return it (None on failure).

    One training run (a small synthetic ledger) in a child process; the JVM writes the archive
    when it exits, and only a complete one is moved into place. Every later driver JVM maps it
    instead of loading and verifying those classes from the jars.
    """
    archive = class_archive()
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="txchaos-cds-") as tmp:
        dump = Path(tmp) / f"driver{archive.suffix}"
        code = (
            "import sys; from pathlib import Path; from harness.ledger.synth import synth_run; "
            "from harness.verify.cli import verify_run; "
            f"verify_run(synth_run(Path(sys.argv[1]), {int(events)}, seed=1), master='local[*]')"
        )
        env = dict(os.environ, **{CDS_DUMP_ENV: str(dump)})
        proc = subprocess.run(
            [sys.executable, "-c", code, str(Path(tmp) / "run")], env=env, capture_output=True, check=False
        )
        if proc.returncode != 0 or not dump.is_file():
            return None
        shutil.move(dump, archive.with_suffix(".tmp"))
        archive.with_suffix(".tmp").rename(archive)
    return archive


LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9][0-9]*)(,[0-9]+)?\])?")
MASTER_PROBE_S = 2.0  # a master on a reachable host answers a TCP connect in milliseconds


def check_master(master: str) -> None:
    """Refuse a master URL that is neither ``local[...]`` nor ``spark://HOST:PORT[,HOST:PORT...]``,
    or whose masters do not answer a TCP connect (Spark itself would retry for a minute)."""
    if LOCAL_MASTER.fullmatch(master):
        return
    hint = "use spark://HOST:PORT (e.g. spark://127.0.0.1:7077) or local[*]; omit --master to run local[*]"
    if not master.startswith("spark://"):
        raise ConfigError(f"Spark master {master!r} is not a spark:// or local[...] URL", hint=hint)
    addrs: list[tuple[str, int]] = []
    for part in master.removeprefix("spark://").split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"Spark master {master!r}: {part!r} is not HOST:PORT", hint=hint)
        addrs.append((host.strip("[]"), int(port)))
    for host, port_no in addrs:
        try:
            with socket.create_connection((host, port_no), timeout=MASTER_PROBE_S):
                return
        except OSError:
            continue
    where = ", ".join(f"{h}:{n}" for h, n in addrs)
    raise ConfigError(
        f"no Spark master answers at {where}",
        hint="start it (sbin/start-master.sh) or omit --master to run local[*]",
    )


def _warehouse() -> str:
    """Return a warehouse folder for this process, removed when it exits (no job writes tables there)."""
    path = tempfile.mkdtemp(prefix="txchaos-spark-wh-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def spark_session(
    master: str | None = None,
    *,
    driver_memory: str = "2g",
    executor_memory: str = "1g",
    verbose: bool = False,
    one_shot: bool = False,
) -> SparkSession:
    """Return a lean local or cluster session: no UI, 2 x cores shuffle partitions, bounded driver
    memory; the JVM logs errors only unless ``verbose``; ``one_shot``: the session runs one
    verification and stops (its JVM skips the optimizing compiler, ``ONE_SHOT_JVM_OPTIONS``).

    Raises ``ConfigError`` for a master URL of the wrong form or with no master answering there.
    """
    if master is not None:
        check_master(master)
    builder = (
        SparkSession.builder.appName("txchaos-verify")
        .master(master or "local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.default.parallelism", str(2 * (os.cpu_count() or 2)))
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", _java_options(verbose=verbose, one_shot=one_shot, master=master))
        .config("spark.executor.memory", executor_memory)
        .config("spark.sql.warehouse.dir", _warehouse())
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config(map=SQL_CONF)
    )
    if SparkSession.getActiveSession() is not None:
        session = builder.getOrCreate()
    else:
        with _driver_java(master), contextlib.nullcontext() if verbose else _jvm_stderr_to_log():
            session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def remote_session(url: str) -> RemoteSession:
    """Return a new client session of the Connect server at ``url``, with ``SQL_CONF`` set on it.

    Once a process holds one, pyspark builds every Column for Connect: that process runs its Spark
    work remotely from then on (``session_for`` keeps to one kind per process).
    """
    # pyspark's own builder, not the Connect module's: only it switches the process to Connect
    # mode, which the functions read to build their Columns (``is_remote``)
    session = SparkSession.builder.remote(url).config(map=SQL_CONF).create()
    return cast("RemoteSession", session)


def connect_url() -> str | None:
    """Return the URL of the running stack's Connect server, or None (no stack up, or none answering)."""
    if "SPARK_CONNECT_MODE_ENABLED" not in os.environ and _has_local_session():
        return None  # this process already drives a local JVM: its Columns are classic ones
    return spark_connect.current_address()


def _has_local_session() -> bool:
    return session_alive(SparkSession.getActiveSession())


def session_for(
    master: str | None = None, *, driver_memory: str = "2g", verbose: bool = False, one_shot: bool = False
) -> tuple[Session, str]:
    """Return a session and where it runs: the stack's Connect server when no ``master`` is named and
    one answers (``connect sc://...``), else a local driver (``local[*]``, or ``master``)."""
    url = None if master is not None else connect_url()
    if url is not None:
        return remote_session(url), f"connect {url}"
    session = spark_session(master, driver_memory=driver_memory, verbose=verbose, one_shot=one_shot)
    return session, master or "local[*]"


@contextmanager
def _jvm_stderr_to_log() -> Iterator[None]:
    """Give the JVMs started inside the block a log file as their stderr instead of ours.

    The JVM itself prints "WARNING: Using incubator modules" at start, below any log4j setting;
    the driver inherits our stderr when it is spawned, so it is swapped only for that moment. The
    file (removed when this process exits) keeps whatever the JVM writes there later; a failing
    job still raises its error in Python.
    """
    fd, path = tempfile.mkstemp(prefix="txchaos-spark-driver-", suffix=".log")
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def bare_start() -> None:
    """Start a default ``local[*]`` session, run one trivial job and stop: the benchmark's floor for
    what any PySpark verification pays before it reads a byte."""
    with _driver_java("local[*]"):  # the JDK a verification's driver runs on, without its archive
        session = SparkSession.builder.master("local[*]").getOrCreate()
    try:
        session.range(1).count()
    finally:
        session.stop()


def _is_remote(session: object) -> bool:
    """Tell a Connect client session (its module is imported once one was made) from a local one."""
    remote = sys.modules.get(REMOTE_MODULE)
    return remote is not None and isinstance(session, remote.SparkSession)


def session_alive(session: Session | None) -> bool:
    """Return True when ``session`` exists and has not been stopped (a local one: its SparkContext)."""
    if _is_remote(session):
        return not cast("RemoteSession", session).is_stopped
    return session is not None and getattr(session.sparkContext, "_jsc", None) is not None


def driver_jvm_pid(spark: Session) -> int | None:
    """Return the OS pid of a local session's driver JVM (for its peak memory), None for a remote one."""
    if _is_remote(spark):
        return None
    jvm: Any = cast(SparkSession, spark).sparkContext._jvm
    return int(jvm.java.lang.ProcessHandle.current().pid())
