"""Install what the local stack needs, idempotently, into a cache under the user's home.

Standard library only: ``./txchaos`` runs this file before the project's virtualenv exists, and
``txchaos install`` (the installed package, no checkout) calls ``install`` for the same services.

- the project's virtualenv (``<repo>/.venv``), refreshed when pyproject.toml changes, made from the
  distribution's optimized ``python3`` when there is one (``base_python``);
- Java 17+ (checked), Postgres server binaries (Debian package, installed when root);
- ActiveMQ Classic and Kafka jars resolved by Maven from the pinned POMs in ``fixtures/jars``;
- Toxiproxy's server with the trap toxics (``trapd``, ``harness/traps/trapd``) built with ``go build``;
- the DTM server built with ``go build`` at a pinned release (Go caches kept under the cache);
- the Allure command line from the npm registry, for offline HTML reports.

Each missing tool gives one line: what is missing and how to get it. The cache's integrity is
recorded in ``<cache>/manifest.json`` (size and sha256 of every installed file): ``load_tools``
checks presence and sizes before every stack start, ``txchaos install --verify`` the hashes, and
``txchaos install`` reinstalls just the damaged component.

Run as a script, this file's folder is ``sys.path[0]``: no module beside it may share a name
with a standard library module (``tests/unit/test_architecture.py`` checks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if not __package__:
    # Run as a script from a checkout (developer-only): make the stdlib-only `harness` modules
    # (harness.resources, harness.reporting.allure_cli) importable before the virtualenv exists.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# After the path above, when run as a script. Nothing below imports this module back: run as a
# script it is __main__, and a second copy would hold a second BootstrapError.
from harness.paths import cache_root
from harness.stack.cache_manifest import verify_cache
from harness.stack.go_builds import ensure_dtm, ensure_toxiproxy, trapd_path
from harness.stack.host_tools import digest, ensure_allure, ensure_browser, ensure_jars, ensure_java, ensure_postgres
from harness.stack.install_shell import INSTALL, PREFIX, SAID, BootstrapError, run, say, warn

# BootstrapError is raised by load_tools: its callers catch it from here.
__all__ = ["BootstrapError", "Tools", "ensure_all", "install", "load_tools", "main"]


@dataclass(frozen=True)
class Tools:
    """Where the installed server binaries are; written to ``<cache>/tools.json``."""

    java: str
    postgres_bin: str
    activemq_lib: str
    kafka_lib: str
    toxiproxy: str
    allure: str | None
    # Defaulted so a tools.json written before DTM joined the stack still loads (load_tools says rebuild).
    dtm: str = ""


# The distribution's interpreter. Debian (as Fedora and Ubuntu) builds it with profile-guided and
# link-time optimization, which a default pyenv or source build lacks: on the project's machine it
# ran the Kafka worker's own Python in 23-24 us a record against 30-35 (docs/benchmarks.md).
SYSTEM_PYTHON = Path("/usr/bin/python3")
PYTHON_ENV = "TXCHAOS_PYTHON"  # the interpreter to make the virtualenv from, when set
_CAN_MAKE_VENV = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))"


def _can_make_venv(python: str) -> bool:
    """Whether ``python`` is a Python 3.11+ with ``venv`` and ``ensurepip`` (Debian splits them off)."""
    try:
        probe = subprocess.run([python, "-c", _CAN_MAKE_VENV], capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def base_python() -> str:
    """Return the interpreter the virtualenv is made from: ``$TXCHAOS_PYTHON``; else the
    distribution's ``python3`` when it can make a 3.11+ virtualenv; else the one running this."""
    chosen = os.environ.get(PYTHON_ENV)
    if chosen:
        if not _can_make_venv(chosen):
            raise BootstrapError(
                f"{PYTHON_ENV}={chosen} is not a Python 3.11+ that can make a virtualenv (`-m venv`): "
                f"name one that is, or unset {PYTHON_ENV}"
            )
        return chosen
    if SYSTEM_PYTHON.exists() and _can_make_venv(str(SYSTEM_PYTHON)):
        return str(SYSTEM_PYTHON)
    return sys.executable


def _made_from(venv: Path) -> str:
    """Return the interpreter ``venv`` was made from, as its ``pyvenv.cfg`` records it ('' if none)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "executable":
            return os.path.realpath(value.strip())
    return ""


def ensure_venv(repo: Path) -> Path:
    """Return ``<repo>/.venv``, creating it and installing the project when pyproject.toml changed;
    made again from scratch when it was made from another interpreter than ``base_python``'s."""
    venv = repo / ".venv"
    stamp = venv / ".txchaos-stamp"
    stamped = stamp.read_text() if stamp.exists() and (venv / "bin" / "txchaos").exists() else ""
    project = digest(repo / "pyproject.toml") + ":" + str(repo) + ":"
    # The interpreter it would be made from, unprobed: a probe costs 70 ms, at every ./txchaos.
    likely = os.environ.get(PYTHON_ENV) or str(SYSTEM_PYTHON if SYSTEM_PYTHON.exists() else sys.executable)
    if stamped == project + os.path.realpath(likely):
        return venv
    python = base_python()
    real = os.path.realpath(python)
    if stamped == project + real:
        return venv
    made = (venv / "bin" / "python").exists()
    if not made or _made_from(venv) != real:
        # --clear: the project's own virtualenv, nothing of a user's in it
        say(f"making the virtualenv {venv} from {python}...")
        run([python, "-m", "venv", *(["--clear"] if made else []), str(venv)], what="creating the virtualenv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    say(f"installing the project and its dependencies into {venv} (pyspark is large: a few minutes once)...")
    run([*pip, "-e", f"{repo}[dev]"], what="installing the project into .venv")
    stamp.write_text(project + real)
    return venv


def ensure_spark_archive(venv: Path) -> str | None:
    """Return the Spark driver's class archive (an AOT cache on JDK 25+), recording it once per
    virtualenv and pyspark version (~30 s once).

    Without it every verification's JVM loads and verifies Spark's classes from the jars again
    (measured: JVM start 3.7 s -> 2.1 s with it; on JDK 25 its method profiles also take a 105M-event
    cold job from 20.7-21.3 s to 18.8-19.1 s). A failure only costs that speed: warn, go on.
    """
    stamp = venv / ".txchaos-spark-archive"
    # the archive is named by the pyspark version: a new one (pyproject.toml changed) records again
    want = ",".join(sorted(p.name for p in venv.glob("lib/python*/site-packages/pyspark-*.dist-info")))
    recorded = stamp.read_text().splitlines() if stamp.exists() else []
    if len(recorded) == 2 and recorded[1] == want and Path(recorded[0]).is_file():
        return recorded[0]
    say("recording the Spark driver's class archive (once, about 30 s)...")
    code = "from harness.verify.spark import build_class_archive as b; print(b() or '')"
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    archive = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not archive:
        print("txchaos bootstrap: no Spark class archive (verification starts slower)", file=sys.stderr)
        return None
    stamp.write_text(f"{archive}\n{want}")
    return archive


def _current_venv() -> Path | None:
    """Return the virtualenv this Python runs in (``txchaos install`` from a pip install), if any."""
    prefix = Path(sys.prefix)
    return prefix if sys.prefix != sys.base_prefix and (prefix / "bin" / "python").exists() else None


def ensure_all(venv: Path | None = None, *, verify: bool = False, announce: bool = False) -> Tools:
    """Install every service's tools into the cache, record their paths, return them.

    ``venv``: also record the Spark class-data archive for that virtualenv. ``verify``: hash every
    installed file again (a damaged component is reinstalled). ``announce``: one line per
    component even when nothing had to be done (``txchaos install``).
    """
    started = time.monotonic()
    worked = SAID[0]
    steps: list[tuple[str, object]] = []
    if venv is not None:
        steps.append(("spark archive", ensure_spark_archive(venv)))
    tools = Tools(
        java=ensure_java(),
        postgres_bin=ensure_postgres(),
        activemq_lib=ensure_jars("activemq", verify=verify),
        kafka_lib=ensure_jars("kafka", verify=verify),
        toxiproxy=ensure_toxiproxy(verify=verify),
        allure=ensure_allure(verify=verify),
        dtm=ensure_dtm(verify=verify),
    )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    (root / "tools.json").write_text(json.dumps(asdict(tools), indent=2))
    verbose = announce or bool(os.environ.get("TXCHAOS_BOOTSTRAP_VERBOSE"))
    for key, value in [*steps, *asdict(tools).items()]:
        if verbose:
            warn(f"{key:<13} {value or '-'}")
    took = time.monotonic() - started
    checked = "every file hashed again, " if verify else ""
    if announce and SAID[0] == worked:
        warn(f"everything is in place ({checked}cache {root}, {took:.1f}s)")
    elif announce or took > 5:
        warn(f"ready in {took:.0f}s ({checked}cache {root})")
    return tools


def load_tools() -> Tools:
    """Return the tools recorded by the last install after checking the cache (presence and sizes).

    Raise BootstrapError, whose message says to run ``txchaos install``, when there is none or a
    file is missing or changed.
    """
    path = cache_root() / "tools.json"
    if not path.exists():
        raise BootstrapError(f"no {path}: run {INSTALL} (from a checkout, `./txchaos` runs it too)")
    tools = Tools(**json.loads(path.read_text()))
    if not tools.dtm:
        raise BootstrapError(f"{path} predates the DTM server: run {INSTALL} again")
    if tools.toxiproxy != str(trapd_path()):
        # The stack's Toxiproxy carries the traps, whose control channel this package speaks: the
        # build of this package's sources, not an older one the last install recorded.
        tools = replace(tools, toxiproxy=ensure_toxiproxy())
    for value in (tools.java, tools.postgres_bin, tools.activemq_lib, tools.kafka_lib, tools.toxiproxy, tools.dtm):
        if not Path(value).exists():
            raise BootstrapError(f"{value} is gone: run {INSTALL} to reinstall")
    verify_cache()
    return tools


def install(*, verify: bool = False) -> int:
    """Install the services into the cache for ``txchaos install``; return the exit code (2: a tool is missing)."""
    PREFIX[0] = "txchaos install"
    try:
        ensure_all(_current_venv(), verify=verify, announce=True)
    except BootstrapError as exc:
        print(f"txchaos install: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the checkout's bootstrap (``./txchaos``): the virtualenv first, then the services."""
    if sys.version_info < (3, 11):  # noqa: UP036 - runs under whatever python3 the machine has
        print(f"txchaos bootstrap: Python {sys.version.split()[0]} is too old: install Python 3.11+", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Developer-only default: the checkout that holds this file (a wheel has no checkout to bootstrap).
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--no-venv", action="store_true", help="only the services' tools")
    parser.add_argument("--verify", action="store_true", help="hash every installed file again")
    parser.add_argument("--browser", action="store_true", help="also Chromium, for the report's browser test")
    args = parser.parse_args(argv)
    try:
        venv = None if args.no_venv else ensure_venv(args.repo.resolve())
        ensure_all(venv, verify=args.verify)
        if args.browser:
            ensure_browser()
    except BootstrapError as exc:
        print(f"txchaos bootstrap: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
