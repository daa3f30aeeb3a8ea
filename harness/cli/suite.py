"""The commands that run the test suite in a pytest child (``test``, ``flagship``) and report it (``report``).

The child gets the terminal's signals and time to heal (stop its stack) before it is killed; the
flagship's Allure results become an offline HTML report with the trend of the previous one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.cli.output import console
from harness.errors import ConfigError

# Where `test` and `flagship` run pytest: the checkout `./txchaos` ran from, else the working directory.
REPO = Path(os.environ.get("TXCHAOS_REPO") or Path.cwd())
# How long a pytest child interrupted with us gets to heal (stop its stack) before SIGKILL.
CHILD_HEAL_S = 120.0


def _with_spark_verify() -> dict[str, str]:
    """Return the environment with every scenario run also verified by Spark, unless the user chose."""
    return {**os.environ, "TXCHAOS_SPARK_VERIFY": os.environ.get("TXCHAOS_SPARK_VERIFY", "1")}


def _call(cmd: list[str], *, env: dict[str, str]) -> int:
    """Run ``cmd`` in the repository and return its exit code; an interrupt is passed on to it.

    ``subprocess.call`` answers an interrupt by SIGKILLing the child, so a pytest session holding
    a stack would never heal. A termination signal is passed on to the child instead (Ctrl-C
    reached it already: the terminal signals the whole group), and it gets time to heal.
    """
    from harness.signals import Terminated

    child = subprocess.Popen(cmd, cwd=REPO, env=env)
    try:
        return child.wait()
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            child.send_signal(exc.signum)
        try:
            child.wait(CHILD_HEAL_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def cmd_test(args: argparse.Namespace) -> int:
    from harness.paths import reports_root

    cmd = [sys.executable, "-m", "pytest", *args.pytest_args]
    if not any(a.startswith("--junitxml") or a.startswith("--junit-xml") for a in args.pytest_args):
        # gates that read only JUnit XML get it; a --junitxml of the caller's own wins
        cmd.append(f"--junitxml={reports_root() / 'junit.xml'}")
    return _call(cmd, env=_with_spark_verify())


# The flagship: every ActiveMQ pattern, bad and fixed, under its faults (crash gap first).
FLAGSHIP_SCENARIOS = (
    "onepc_crash_gap",
    "onepc_redelivery",
    "onepc_faults",
    "poison_message",
    "send_money",
    "outbox_relay",
)


def _flagship_files() -> list[str]:
    """Return the flagship's scenario files: a checkout's own (``scenarios/``), else the installed package's."""
    from harness import resources

    names = [f"{name}_scenario.py" for name in FLAGSHIP_SCENARIOS]
    if all((REPO / "scenarios" / n).is_file() for n in names):
        return [f"scenarios/{n}" for n in names]
    return [str(resources.scenarios_dir() / n) for n in names]


def cmd_flagship(args: argparse.Namespace) -> int:
    from harness.paths import reports_root

    root = reports_root() / "flagship"
    previous = _latest_report(root)  # its history fills this report's trend graphs
    out = root / time.strftime("%Y%m%d-%H%M%S")
    results = out / "allure-results"
    console.rule("txchaos flagship: messaging patterns, naive vs fixed, under crashes, redeliveries and faults")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *_flagship_files(),
        "-v",
        "-p",
        "no:cacheprovider",
        f"--alluredir={results}",
        f"--junitxml={out / 'junit.xml'}",
    ]
    if args.provider:
        cmd.append(f"--txchaos-provider={args.provider}")
    code = _call(cmd, env=_with_spark_verify())
    html = _allure_html(results, out / "allure-report", previous=previous, provider=args.provider or "auto")
    console.rule("flagship done")
    console.print(f"run folders: {reports_root() / 'runs'}")
    if html:
        console.print(f"report: {html}")
    return code if code in (0, 1) else 3


def _latest_report(root: Path) -> Path | None:
    """Return the newest ``<run>/allure-report`` under ``root`` that holds a history, if any."""
    reports = sorted(root.glob("*/allure-report/history/history-trend.json")) if root.is_dir() else []
    return reports[-1].parent.parent if reports else None


def _allure_html(results: Path, out: Path, *, previous: Path | None = None, provider: str = "local") -> Path | None:
    from dataclasses import asdict

    from harness.reporting.allure_cli import generate_html
    from harness.reporting.allure_results import finish_results
    from harness.stack.bootstrap import BootstrapError, load_tools

    try:
        tools = {k: str(v) for k, v in asdict(load_tools()).items() if v}
    except BootstrapError:
        tools = {}
    allure = tools.get("allure")
    if not allure or not results.is_dir():
        console.print("no Allure command line: HTML report skipped (run `txchaos install`)", style="yellow")
        return None
    done = finish_results(results, previous=previous, provider=provider, tools=tools)
    history = f"history from {previous}" if done["history"] else "no earlier history"
    console.print(f"allure: categories, environment, {done['executor'] or 'no CI'} executor, {history}")
    return generate_html(Path(allure), results, out)


def cmd_report(args: argparse.Namespace) -> int:
    results = Path(args.results)
    if not results.is_dir():
        raise ConfigError(f"no allure results in {results}", hint="pass the allure-results folder of a pytest run")
    previous = Path(args.history) if args.history else None
    if previous is not None and not (previous / "history").is_dir():
        raise ConfigError(
            f"--history {previous} holds no history/ folder",
            hint="pass the folder of an earlier report made by `txchaos report` or `txchaos flagship` "
            "(it holds index.html and history/)",
        )
    out = Path(args.out) if args.out else results.parent / "allure-report"
    html = _allure_html(results, out, previous=previous, provider=args.provider)
    if html:
        console.print(f"report: {html}")
    return 0 if html else 3
