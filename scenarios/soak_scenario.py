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

import json
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
    options: dict[str, object] = {"duration_s": 40.0, "workers": 2, "nemesis": ("freeze",), "pace": FREEZES}
    return Soak(spec, **{**options, **fields})  # type: ignore[arg-type]


RACY = {"expect": frozenset({"duplicate-effect"})}


def test_the_racy_check_then_skip_is_caught_by_a_soak(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    result = txchaos_soak(soak_of("check-then-skip", **RACY))
    verdict = result.verdict
    assert set(verdict.found()) == {"duplicate-effect"}, verdict.headline()
    # A freeze at a crash point is an arm (the ledger has it as that crash's firing), not a window.
    assert (result.stats.crashes_armed >= 5, result.stats.windows) == (True, 0), result.stats
    assert not result.stats.interrupted
    # Every witness's chain holds the freeze that opened the race: a person sees why.
    for witness in verdict.witnesses:
        assert any(e.get("kind") == "crash" and "freeze" in str(e) for e in witness.events), witness
    # soak.json: counts per class, and a bounded sample of witnesses naming the freeze.
    summary = json.loads((result.run_dir / "soak.json").read_text())
    assert summary["counts"] == verdict.found()
    sample = summary["witnesses"]["duplicate-effect"]
    assert 1 <= len(sample) <= 5
    assert all("freeze at before_db_commit" in " ".join(w["crashes"]) for w in sample), sample
    assert (result.run_dir / "soak.png").stat().st_size > 10_000
    assert '"action": "freeze"' in (result.run_dir / "steps.jsonl").read_text()
    # The folder verifies again to the same verdict.
    again = check_run(result.run_dir, contract_of(result.run_dir))
    assert again.found() == verdict.found()
    assert again.ops("duplicate-effect") == verdict.ops("duplicate-effect")


def test_the_locked_check_holds_under_the_same_soak(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    result = txchaos_soak(soak_of("check-then-skip-locked"))
    assert result.verdict.clean, result.verdict.headline()
    assert (result.stats.crashes_armed >= 5, result.stats.windows) == (True, 0), result.stats
    assert result.stats.submitted > 1000
    # The freezes happened (the run proves something): each armed freeze fired in a worker.
    assert result.verdict.stats["crashes"] >= 5, result.verdict.stats
    assert not result.verdict.unfired


def _opened_a_window(reports: Path) -> bool:
    """Tell whether a soak under ``reports`` has opened its first fault window (its steps say so)."""
    return any('"step": "open"' in steps.read_text() for steps in reports.glob("runs/*/steps.jsonl"))


def test_an_interrupted_soak_heals_closes_its_books_and_says_what_it_judged(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(txchaos_stack.to_json())
    env = {**os.environ, "TXCHAOS_ENDPOINTS": str(endpoints), "TXCHAOS_REPORTS": str(tmp_path / "reports")}
    command = [sys.executable, "-m", "harness.cli", "soak", "onepc_crash_gap:check-then-skip-locked"]
    command += ["--duration", "10m", "--nemesis", "pause,latency", "--engine", "in-process"]
    proc = subprocess.Popen(command, env=env, cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Past the stack check, the workers' start and the first fault window: waited for, not slept
    # for. A fixed 12 s once ended before the soak had made its run folder (a cold page cache:
    # 10 s of imports before the first line).
    deadline = time.monotonic() + 120
    while not _opened_a_window(tmp_path / "reports") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    text = out.decode(errors="replace")
    assert proc.returncode == 3, text
    assert "interrupted" in text, text
    (run_dir,) = (tmp_path / "reports" / "runs").iterdir()
    verdict = check_run(run_dir, contract_of(run_dir))
    assert verdict.outcome == "clean", verdict.headline()  # complete: the books were closed
    assert '"step": "heal"' in (run_dir / "steps.jsonl").read_text()
    assert '"outcome": "clean"' in (run_dir / "soak.json").read_text()
    assert not list((run_dir / "ledger").glob("events.parquet.spill*"))  # the live compaction left nothing
