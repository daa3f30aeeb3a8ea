"""Soaks: a bug only a long run with two workers finds, its fix, and an interrupted soak.

``onepc_crash_gap:check-then-skip`` reads before it writes, with neither a lock nor a unique key.
Its short scenario (one worker, one crash) is clean. Under a soak with two workers and a nemesis
that freezes a worker (SIGSTOP) in the middle of its transaction, the broker drops the frozen
consumer and hands its message to the other worker, whose check sees nothing yet: both apply it
-> ``duplicate-effect``, each witness inside a ``pause`` window. ``check-then-skip-locked`` takes
an advisory lock on the operation first and holds under the same soak.

Run one: ``txchaos soak onepc_crash_gap:check-then-skip --duration 40s --nemesis pause``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import Endpoints
from harness.run.spec.files import resolve
from harness.soak import Pace, Soak
from harness.verify.checker import check_run
from harness.verify.cli import contract_of

pytestmark = [pytest.mark.integration, pytest.mark.activemq]
HERE = Path(__file__).parent
FREEZES = Pace(rest_s=2.0, hold_s=3.5, first_s=2.0)


def soak_of(variant: str, **fields: object) -> Soak:
    (spec,) = resolve(f"onepc_crash_gap:{variant}", 0, HERE)
    options: dict[str, object] = {"duration_s": 40.0, "workers": 2, "nemesis": ("pause",), "pace": FREEZES}
    return Soak(spec, **{**options, **fields})  # type: ignore[arg-type]


def test_the_racy_check_then_skip_is_caught_by_a_soak(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    result = txchaos_soak(soak_of("check-then-skip"))
    verdict = result.verdict
    assert set(verdict.found()) == {"duplicate-effect"}, verdict.headline()
    assert result.stats.windows >= 5 and not result.stats.interrupted
    # Every sampled witness names the freeze it happened in: a person sees why.
    summary = (result.run_dir / "soak.json").read_text()
    for witness in verdict.witnesses:
        assert any(f.get("fault") == "pause" for f in witness.faults), witness
        assert witness.op in summary
    assert (result.run_dir / "soak.png").stat().st_size > 10_000
    assert '"step": "freeze"' in (result.run_dir / "steps.jsonl").read_text()
    # The folder verifies again to the same verdict.
    again = check_run(result.run_dir, contract_of(result.run_dir))
    assert again.found() == verdict.found() and again.ops("duplicate-effect") == verdict.ops("duplicate-effect")


def test_the_locked_check_holds_under_the_same_soak(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    result = txchaos_soak(soak_of("check-then-skip-locked"))
    assert result.verdict.clean, result.verdict.headline()
    assert result.stats.windows >= 5 and result.stats.submitted > 1000
    # The freezes happened (the run proves something): each is a fault window in the ledger.
    assert sum(f.get("fault") == "pause" for f in result.verdict.faults) >= 5, result.verdict.faults


def test_an_interrupted_soak_heals_closes_its_books_and_says_what_it_judged(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(txchaos_stack.to_json())
    env = {**os.environ, "TXCHAOS_ENDPOINTS": str(endpoints), "TXCHAOS_RUNS": str(tmp_path / "runs")}
    command = [sys.executable, "-m", "harness.cli", "soak", "onepc_crash_gap:check-then-skip-locked"]
    command += ["--duration", "10m", "--nemesis", "pause,latency", "--engine", "in-process"]
    proc = subprocess.Popen(command, env=env, cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(12)  # past the stack check, the workers' start and the first fault window
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    text = out.decode(errors="replace")
    assert proc.returncode == 3, text
    assert "interrupted" in text, text
    (run_dir,) = (tmp_path / "runs").iterdir()
    verdict = check_run(run_dir, contract_of(run_dir))
    assert verdict.outcome == "clean", verdict.headline()  # complete: the books were closed
    assert '"step": "heal"' in (run_dir / "steps.jsonl").read_text()
    assert '"outcome": "clean"' in (run_dir / "soak.json").read_text()
