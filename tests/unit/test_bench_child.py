"""A benchmark's soak child is interrupted with the benchmark, and its folder still comes back.

The child here stands in for a soak: under ``terminating()`` it waits, and on the signal it "heals"
(writes a file) and sends its folder back, as ``run_soak`` does when its driver is interrupted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.bench.soak import in_child
from harness.errors import HarnessError
from harness.signals import Terminated, terminating


def _soak_stand_in(folder: str, out: Any) -> None:
    with terminating():
        Path(folder, "ready").touch()
        try:
            time.sleep(60)
        except KeyboardInterrupt as exc:
            Path(folder, "healed").write_text(type(exc).__name__)
    out.put(folder)


def _dies(out: Any) -> None:
    os._exit(7)


def _sigterm_self_once(ready: Path) -> None:
    def send() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send, daemon=True).start()


def test_a_sigterm_reaches_the_child_which_heals_before_the_benchmark_stops(tmp_path: Path) -> None:
    started = time.monotonic()
    _sigterm_self_once(tmp_path / "ready")  # once the child's handler is in place
    with terminating(), pytest.raises(Terminated):
        in_child(_soak_stand_in, str(tmp_path), label="stand-in")
    assert (tmp_path / "healed").read_text() == "Terminated"
    assert time.monotonic() - started < 30


def test_a_child_that_dies_without_a_folder_fails_the_benchmark_with_its_exit_code() -> None:
    with pytest.raises(HarnessError, match=r"ended \(exit 7\) without a verdict"):
        in_child(_dies, label="dies")
