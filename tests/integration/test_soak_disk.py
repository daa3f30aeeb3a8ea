"""A soak on a small disk, as a user runs it: ``txchaos soak`` with ``TXCHAOS_REPORTS`` on a 600 MB
tmpfs. A soak too large for it is refused before anything runs; one bounded by time stops
submitting once the disk is short of what its close needs, closes its books and exits 3, and its
folder verifies again to a complete verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import Endpoints
from harness.verify.checker import check_run
from harness.verify.cli import contract_of

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
ROOT = Path(__file__).resolve().parents[2]
BATCH = ["kafka_consumer:inbox-offset-batch", "--workers", "1", "--option", "batch_size=500"]
BATCH += ["--option", "partitions=3", "--nemesis", "none", "--engine", "in-process"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 600 MB tmpfs (root only), unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (root only): {made.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _soak(stack: Endpoints, folder: Path, *args: str) -> tuple[int, str, float]:
    endpoints = folder.parent / "endpoints.json"
    endpoints.write_text(stack.to_json())
    env = {**os.environ, "TXCHAOS_ENDPOINTS": str(endpoints), "TXCHAOS_REPORTS": str(folder / "reports")}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "soak", *BATCH, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def test_a_soak_too_large_for_the_disk_is_refused_before_anything_runs(
    txchaos_stack: Endpoints, small_disk: Path
) -> None:
    code, text, _ = _soak(txchaos_stack, small_disk, "--ops", "1000000")
    assert code == 2, text
    assert "soak of 1,000,000 operations needs about 5.1 GB" in text, text
    assert "operations fit" in text, text
    assert not (small_disk / "reports").exists(), "nothing was written"


def test_a_soak_stops_when_its_disk_fills_and_closes_its_books(txchaos_stack: Endpoints, small_disk: Path) -> None:
    code, text, took = _soak(txchaos_stack, small_disk, "--duration", "5m")
    assert code == 3, text
    assert "the soak stopped submitting" in text, text
    assert took < 240, f"it stopped early: {took:.0f}s\n{text}"
    (run_dir,) = (small_disk / "reports" / "runs").iterdir()
    summary = json.loads((run_dir / "soak.json").read_text())
    assert summary["stats"]["stopped"].startswith(f"the disk under {run_dir / 'ledger'} has"), summary["stats"]
    assert summary["stats"]["submitted"] > 10_000, summary["stats"]
    assert summary["outcome"] == "clean", summary
    again = check_run(run_dir, contract_of(run_dir))
    assert again.outcome == "clean", again.headline()  # complete: the books were closed
    assert again.stats["operations"] == summary["stats"]["submitted"], again.stats
