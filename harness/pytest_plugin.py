"""The txchaos pytest plugin (entry point ``pytest11``): options, markers, fixtures, summary.

Heavy modules load inside the fixtures, so having the plugin installed costs a test run that
never asks for the stack almost nothing.

Fixtures:
- ``txchaos_stack`` (session): the ``Endpoints`` of a running stack; started for the session,
  or the one named by ``--txchaos-endpoints`` / ``$TXCHAOS_ENDPOINTS`` / ``txchaos up``.
- ``txchaos_reset`` (function): a ``Resetter`` that has just emptied tables, purged tracked
  queues and topics, and removed every toxic.
- ``txchaos_run`` (function): ``run(spec) -> RunResult``; the run folder is attached to Allure.
  A requested fault that never fired fails the test unless ``run(spec, allow_unfired=True)``.
  With ``--txchaos-spark-verify`` each run is verified again by the Spark engine (one JVM for the
  session) and the test fails when the two engines' verdicts differ.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from harness.run.core.crosscheck import SparkCrossCheck
    from harness.run.core.outcome import RunResult
    from harness.run.spec.scenario import ScenarioSpec
    from harness.signals import Seen
    from harness.soak.driver import SoakResult
    from harness.soak.spec import Soak
    from harness.stack.base import Endpoints, StackProvider
    from harness.stack.reset import Resetter


class RunScenario(Protocol):
    """What ``txchaos_run`` returns: ``run(spec, allow_unfired=False) -> RunResult``."""

    def __call__(self, spec: ScenarioSpec, *, allow_unfired: bool = False) -> RunResult: ...


class RunSoak(Protocol):
    """What ``txchaos_soak`` returns: ``soak(Soak(...)) -> SoakResult``."""

    def __call__(self, spec: Soak) -> SoakResult: ...


MARKERS = {
    "integration": "needs the real stack (Postgres, ActiveMQ, Kafka, Toxiproxy)",
    "activemq": "exercises ActiveMQ over STOMP",
    "kafka": "exercises Kafka",
    "dtm": "exercises the DTM server",
    "spark": "runs a Spark job",
}
_RUNS = pytest.StashKey[list["RunResult"]]()
_SPARK = pytest.StashKey["SparkCrossCheck | None"]()
_SIGNALS = pytest.StashKey[tuple[contextlib.ExitStack, "Seen"]]()


def _provider(value: str) -> str:
    if value not in ("auto", "local", "docker"):
        raise pytest.UsageError(f"--txchaos-provider={value!r}: use auto, local or docker")
    return value


def _endpoints_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise pytest.UsageError(f"--txchaos-endpoints={value!r} is not a file: pass reports/stacks/<id>/endpoints.json")
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("txchaos", "txchaos chaos harness")
    group.addoption(
        "--txchaos-provider",
        type=_provider,
        default=None,
        help="stack provider: auto (docker when it can run the stack there: a daemon, Compose v2 and the images; "
        "else local), local, docker",
    )
    group.addoption(
        "--txchaos-endpoints",
        type=_endpoints_file,
        default=None,
        help="use the running stack described by this endpoints.json instead of starting one",
    )
    group.addoption(
        "--txchaos-spark-verify",
        action="store_true",
        default=os.environ.get("TXCHAOS_SPARK_VERIFY", "") not in ("", "0"),
        help="verify every run again with the Spark engine and fail a test whose engines disagree "
        "(default: $TXCHAOS_SPARK_VERIFY)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_RUNS] = []
    config.stash[_SPARK] = None


def pytest_sessionstart(session: pytest.Session) -> None:
    # SIGTERM (a CI timeout) and SIGHUP interrupt the session like Ctrl-C: the test's run heals in
    # its `finally` and pytest tears the session's fixtures (the stack) down before it exits.
    from harness.signals import terminating

    handlers = contextlib.ExitStack()
    seen = handlers.enter_context(terminating())
    session.config.stash[_SIGNALS] = (handlers, seen)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Restore the signal handlers once every fixture is torn down; a terminated session exits 3."""
    installed = session.config.stash.get(_SIGNALS, None)
    if installed is None:
        return
    handlers, seen = installed
    handlers.close()
    if seen.signum is not None:
        from harness.signals import message

        session.exitstatus = 3
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"txchaos: {message(seen)}")


def pytest_unconfigure(config: pytest.Config) -> None:
    spark = config.stash.get(_SPARK, None)
    if spark is not None:
        spark.close()


def _cross_check(config: pytest.Config) -> SparkCrossCheck | None:
    """Return the session's Spark cross-check (made on first use), or None when it is off."""
    if not config.getoption("--txchaos-spark-verify"):
        return None
    if config.stash[_SPARK] is None:
        from harness.run.core.crosscheck import SparkCrossCheck

        config.stash[_SPARK] = SparkCrossCheck()
    return config.stash[_SPARK]


@pytest.fixture(scope="session")
def txchaos_stack(request: pytest.FixtureRequest) -> Iterator[Endpoints]:
    """Yield the stack's endpoints; a stack this fixture started is stopped at session end."""
    from harness.stack.base import Endpoints
    from harness.stack.selection import endpoints_from_env

    given: Path | None = request.config.getoption("--txchaos-endpoints")
    existing = Endpoints.load(given) if given else endpoints_from_env()
    if existing is not None:
        yield existing
        return
    endpoints, provider = _start_stack(request.config)
    try:
        yield endpoints
    finally:
        provider.stop()


def _say(config: pytest.Config, line: str) -> None:
    """Write one line to the terminal, outside any test's captured output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        sys.stderr.write(line + "\n")
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write_line(line)


def _start_stack(config: pytest.Config) -> tuple[Endpoints, StackProvider]:
    """Start the session's stack, or end the session once with one message (not one error per test)."""
    from harness.errors import TxChaosError
    from harness.stack.selection import make_provider

    try:
        provider = make_provider(config.getoption("--txchaos-provider"), announce=lambda line: _say(config, line))
        return provider.start(), provider
    except TxChaosError as exc:
        pytest.exit(f"txchaos: the stack cannot start: {type(exc).__name__}: {exc}", returncode=exc.exit_code)
    except Exception as exc:
        _say(config, traceback.format_exc())
        pytest.exit(f"txchaos: the stack cannot start (a harness bug; traceback above): {exc!r}", returncode=3)


@pytest.fixture(scope="session")
def _txchaos_resetter(txchaos_stack: Endpoints) -> Iterator[Resetter]:
    from harness.stack.reset import Resetter

    resetter = Resetter(txchaos_stack)
    try:
        yield resetter
    finally:
        resetter.close()


@pytest.fixture
def txchaos_reset(_txchaos_resetter: Resetter) -> Resetter:
    """Return the session's resetter after resetting the stack for this test."""
    _txchaos_resetter.reset()
    return _txchaos_resetter


@pytest.fixture
def txchaos_run(request: pytest.FixtureRequest, txchaos_stack: Endpoints, txchaos_reset: Resetter) -> RunScenario:
    """Return ``run(spec, allow_unfired=False)``: run a scenario, attach its folder to Allure,
    remember it for the summary. A requested crash, trap or fault window that never fired fails
    the test (``UnfiredFault``, naming it) unless the test says it accepts that."""
    from harness.reporting.allure import attach_run
    from harness.reporting.plots import render_run
    from harness.run.core.session import run_scenario

    def run(spec: ScenarioSpec, *, allow_unfired: bool = False) -> RunResult:
        result = run_scenario(spec, txchaos_stack)
        txchaos_reset.track_queues([f"txchaos.{result.run_dir.name}.in", f"txchaos.{result.run_dir.name}.out"])
        request.config.stash[_RUNS].append(result)
        render_run(result.run_dir)
        spark = _cross_check(request.config)
        check = spark.verify(result) if spark is not None else None
        attach_run(result.run_dir)
        if check is not None and not check.agree:
            from harness.errors import HarnessError

            raise HarnessError(
                f"the Spark and in-process engines disagree on {result.run_dir}: {'; '.join(check.diffs)}",
                hint=f"compare verdict.json with verdict-spark.json in {result.run_dir}",
            )
        if result.verdict.outcome == "unfired" and not allow_unfired:
            from harness.errors import UnfiredFault

            said = "; ".join((*result.verdict.unfired, *result.unfired_stories()))
            raise UnfiredFault(
                f"{spec.label}: {said}; the run proves nothing about it (run folder {result.run_dir})",
                hint="arm a point the flow reaches (docs/traps.md lists what each trap waits for), "
                "or pass txchaos_run(spec, allow_unfired=True) if not firing is the point of the test",
            )
        return result

    return run


@pytest.fixture
def txchaos_soak(request: pytest.FixtureRequest, txchaos_stack: Endpoints, txchaos_reset: Resetter) -> RunSoak:
    """Return ``soak(Soak(...))``: run a soak on the session's stack, draw its ``soak.png``, attach its
    folder (verdicts, plots, ``soak.json``, logs) to Allure and list it in the summary."""
    from harness.reporting.allure import attach_file, attach_run
    from harness.reporting.soak_plots import render_soak
    from harness.soak.driver import run_soak

    def soak(spec: Soak) -> SoakResult:
        result = run_soak(spec, txchaos_stack, progress=lambda _: None)
        txchaos_reset.track_queues([f"txchaos.{result.run_dir.name}.in", f"txchaos.{result.run_dir.name}.out"])
        request.config.stash[_RUNS].append(result)
        render_soak(result)
        attach_run(result.run_dir)
        attach_file(result.run_dir / "soak.json", "soak.json", "json")
        return result

    return soak


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    runs = config.stash.get(_RUNS, [])
    if not runs:
        return
    tr = terminalreporter
    tr.section("txchaos verdicts")
    for r in runs:
        mark = "as expected" if r.as_expected else "UNEXPECTED"
        tr.write_line(f"{r.spec.label:<40} seed {r.spec.seed:<4} {mark:<11} {r.verdict.headline()}")
        tr.write_line(f"{'':<40} {os.path.relpath(r.run_dir)}")
        note = getattr(r, "nemesis_note", None)  # a soak's (SoakResult): kinds it never opened
        if note:
            tr.write_line(f"{'':<40} nemesis: {note}")
    spark = config.stash.get(_SPARK, None)
    if spark is not None and spark.checks:
        agreed = sum(c.agree for c in spark.checks)
        job = sum(c.spark.timing.get("job_s", 0.0) for c in spark.checks)
        tr.write_line(
            f"spark engine: {agreed} of {len(spark.checks)} runs verified to the same verdict ({job:.1f}s of jobs"
            f" on {spark.where})"  # hook (issue 31): which Spark ran them
        )
        for c in spark.checks:
            if not c.agree:
                tr.write_line(f"  {c.result.spec.label}: {c.line()}")
