"""A Freeze step on an instance whose process just ended stops its replacement, or is skipped, never fatal.

A million-operation soak died at 143,000 operations with "no process 10340 to pause": the nemesis
froze a worker a crash point had killed a moment before. Real processes here: a dead pid, then a
live one in its own process group, paused with SIGSTOP and resumed when the faults close.
"""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

from harness import procfs
from harness.faults.process import Pause
from harness.ledger.writer import LedgerWriter
from harness.run.core.parts import freeze


def _settles(pid: int, want: str, within_s: float = 2.0) -> str | None:
    """Return the process's state once it is ``want``, or the last seen after ``within_s``: a signal
    sent is not yet a state taken, and on a loaded machine the process may still be running."""
    deadline = time.monotonic() + within_s
    while (state := procfs.state(pid)) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    return proc.pid


class _Instances:
    """The processes part as ``freeze`` sees it: each ``pause`` names the next pid of ``pids``."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.asked = 0

    def pause(self, number: int) -> Pause:
        self.asked += 1
        return Pause(self.pids.pop(0))

    def during_fault(self) -> nullcontext[None]:
        return nullcontext()


def _windows(ledger: Path) -> list[dict[str, object]]:
    (segment,) = (ledger / "segments").glob("*.jsonl")
    rows = [json.loads(line) for line in segment.read_text().splitlines()]
    return [{"kind": r["kind"], **json.loads(r["detail"])} for r in rows]


def test_a_freeze_of_an_instance_that_just_ended_stops_its_replacement(tmp_path: Path) -> None:
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        instances = _Instances([_dead_pid(), live.pid])
        ledger = LedgerWriter(tmp_path / "ledger", "driver")
        with ExitStack() as faults:
            assert freeze(instances, 0, ledger, faults)  # type: ignore[arg-type]
            assert _settles(live.pid, "T") == "T"  # stopped
        assert _settles(live.pid, "S") == "S"  # resumed when the faults closed
        kinds = [(w["kind"], w.get("error")) for w in _windows(tmp_path / "ledger")]
        # the failed attempt is a window that ended at once with its error; the second held
        assert kinds == [
            ("fault_start", None),
            ("fault_end", "ProcessGone"),
            ("fault_start", None),
            ("fault_end", None),
        ]
    finally:
        live.kill()
        live.wait()


def test_a_freeze_whose_instance_keeps_ending_is_skipped(tmp_path: Path) -> None:
    instances = _Instances([_dead_pid() for _ in range(3)])
    with ExitStack() as faults:
        assert not freeze(instances, 0, LedgerWriter(tmp_path / "ledger", "driver"), faults)  # type: ignore[arg-type]
    assert instances.asked == 3
