"""A fault that never happened does not pass as clean: a real service armed with a trap it never reaches.

The Python STOMP service commits its DB, sends and ACKs without a STOMP transaction, so a
``stomp_before_commit`` trap on it never fires. The run must say so by name, exit with its own
code, and fail a test that does not accept it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness import Crash
from harness.errors import EXIT_UNFIRED, UnfiredFault
from harness.pytest_plugin import RunScenario
from harness.run.spec.files import load_file
from harness.stack.base import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.activemq]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "services" / "services_scenario.py"
EX = load_file(EXAMPLE)
# The run takes the name of the key the file gives its spec: what a replay names again.
HEADLINE = (
    "UNFIRED: trap stomp_before_commit on op py-unreachable-s0-op00003 never fired: the service sent no STOMP COMMIT"
)

SCENARIO = f"""
from pathlib import Path

from harness import Crash
from harness.run.spec.files import load_file

EX = load_file(Path({str(EXAMPLE)!r}))


def variants(seed):
    crash = (Crash("stomp_before_commit", op_index=3),)
    return {{"py-unreachable": EX.scenario("py", "fixed", seed=seed, messages=5, crashes=crash, timeout_s=60)}}
"""


def test_an_unreachable_trap_exits_with_its_own_code_and_names_the_trap(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    scenario = tmp_path / "unreachable_scenario.py"
    scenario.write_text(SCENARIO)
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(txchaos_stack.to_json())
    env = {**os.environ, "TXCHAOS_ENDPOINTS": str(endpoints), "TXCHAOS_REPORTS": str(tmp_path / "reports")}
    env.pop("TXCHAOS_SPARK_VERIFY", None)

    def txchaos(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "harness.cli", *args],
            cwd=ROOT,
            env={**env, "COLUMNS": "400"},  # the headline on one line
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    proc = txchaos("run", f"{scenario}:py-unreachable")
    assert proc.returncode == EXIT_UNFIRED, proc.stdout + proc.stderr
    assert HEADLINE in proc.stdout, proc.stdout
    assert "UNEXPECTED: the scenario expects a clean run" in proc.stdout, proc.stdout
    # and what did happen to that operation: the service took it through to the sink, no COMMIT on the way
    assert "the ledger has of py-unreachable-s0-op00003: submit (driver);" in proc.stdout, proc.stdout
    assert f"replay: txchaos run {scenario}:py-unreachable --seed 0" in proc.stdout, proc.stdout
    assert "downstream (driver)" in proc.stdout, proc.stdout
    (verdict_file,) = (tmp_path / "reports" / "runs").glob("*/verdict.json")
    verdict = json.loads(verdict_file.read_text())
    assert verdict["outcome"] == "unfired"
    assert verdict["clean"] is False
    (trap,) = verdict["faults"]
    assert (trap["type"], trap["name"], trap["op"], trap["fired"]) == (
        "trap",
        "stomp_before_commit",
        "py-unreachable-s0-op00003",
        False,
    )
    # Replayed from its folder with the file named, the same variant runs again, and says how to again.
    again = txchaos("replay", str(verdict_file.parent), "--scenario", str(scenario))
    assert again.returncode == EXIT_UNFIRED, again.stdout + again.stderr
    assert HEADLINE in again.stdout, again.stdout
    assert f" --scenario {scenario}" in again.stdout, again.stdout


def test_the_fixture_fails_an_unfired_run_unless_the_test_accepts_it(txchaos_run: RunScenario) -> None:
    spec = EX.scenario("py", "fixed", messages=5, crashes=(Crash("stomp_before_commit", op_index=3),), timeout_s=60)
    with pytest.raises(UnfiredFault, match="stomp_before_commit on op py-fixed-s0-op00003 never fired") as caught:
        txchaos_run(spec)
    assert caught.value.exit_code == EXIT_UNFIRED
    assert "allow_unfired=True" in str(caught.value)
    assert "the ledger has of py-fixed-s0-op00003: submit (driver);" in str(caught.value)
    accepted = txchaos_run(spec, allow_unfired=True)
    assert accepted.verdict.outcome == "unfired"
    # the same service under a trap it does reach: fired, with its op and instance, and clean
    reached = txchaos_run(replace(spec, crashes=(Crash("pg_after_commit", op_index=3),)))
    assert reached.verdict.clean, reached.verdict.headline()
    (trap,) = reached.verdict.faults
    assert (trap["fired"], trap["fired_op"]) == (True, "py-fixed-s0-op00003")
    assert trap["fired_worker"]
