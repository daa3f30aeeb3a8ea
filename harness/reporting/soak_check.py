"""Measure ``plot_soak`` on a large synthetic ledger: its seconds and its process's peak memory.

``python -m harness.reporting.soak_check [--events N]`` writes a synthetic run of about N events
(``ledger/synth.py``; 11.5M events is a million operations) into a temporary folder, then plots it
in a fresh child process, so the peak resident memory is the plot's alone and not the generator's,
and prints one JSON line. A measurement to read, not a test: timings vary with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness.ledger.synth import synth_run
from harness.reporting.soak_plots import plot_soak

MILLION_OPS_EVENTS = 11_500_000  # synth.EVENTS_PER_OP events per operation


def peak_rss_mb() -> int:
    """Return this process's peak resident memory in MB.

    Linux's ``VmHWM`` first: it belongs to the program this process runs. ``ru_maxrss`` carries
    the parent's size at the fork into a child process across its exec (the generator's 1 GB here).
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # KiB on Linux


def plot_once(run: Path) -> dict[str, Any]:
    """Plot ``run`` with the anomalies its manifest samples; return the seconds and peak RSS (MB)."""
    manifest = json.loads((run / "manifest.json").read_text())
    flagged = {cls: set(ops) for cls, ops in manifest["ground_truth_sample"].items()}
    started = time.perf_counter()
    out = plot_soak(run, run / "soak.png", anomalies=flagged, title=f"synthetic soak, {manifest['operations']:,} ops")
    return {
        "operations": manifest["operations"],
        "events": manifest["events"],
        "seconds": round(time.perf_counter() - started, 2),
        "peak_rss_mb": peak_rss_mb(),
        "png_bytes": out.stat().st_size,
    }


def measure(events: int = MILLION_OPS_EVENTS, seed: int = 1) -> dict[str, Any]:
    """Write a synthetic run of about ``events`` events and plot it in a child process; return its numbers."""
    # The child imports the harness this process imported (a checkout's, whatever else is installed).
    root = str(Path(harness.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="txchaos-soak-check-") as tmp:
        run = synth_run(Path(tmp) / "run", events, seed)
        child = subprocess.run(
            [sys.executable, "-m", "harness.reporting.soak_check", "--plot", str(run)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    numbers: dict[str, Any] = json.loads(child.stdout)
    return numbers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=MILLION_OPS_EVENTS, help="synthetic ledger size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", type=Path, help="plot this run folder in this process (what the child does)")
    args = parser.parse_args(argv)
    numbers = plot_once(args.plot) if args.plot else measure(args.events, args.seed)
    sys.stdout.write(json.dumps(numbers) + "\n")


if __name__ == "__main__":
    main()
