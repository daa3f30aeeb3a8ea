"""An instance's ready file carries the time its ready line was written, not the pool's polling round."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.ledger.writer import LedgerWriter
from harness.run.processes.service_pool import Instance, ServicePool, ready_since


def test_the_ready_file_is_stamped_with_the_time_the_log_got_the_ready_line(tmp_path: Path) -> None:
    # The service prints READY and nothing after: its log's time is the ready line's. The
    # start benchmark (`txchaos bench services --starts`) reads the ready file's time.
    (tmp_path / "logs").mkdir()
    script = "import sys, time; print('READY', flush=True); time.sleep(60)"
    instance = Instance("svc-0", "svc", (sys.executable, "-c", script), {}, None)
    pool = ServicePool([instance], tmp_path, LedgerWriter(tmp_path / "ledger", "driver"), ready="READY")
    pool.start(timeout=30)
    try:
        ready = tmp_path / "workers" / "svc-0.ready"
        log = tmp_path / "logs" / "svc-0.log"
        assert b"READY" in log.read_bytes()
        assert ready.stat().st_mtime_ns == log.stat().st_mtime_ns
    finally:
        pool.stop()


def test_a_ready_line_written_between_the_stat_and_the_read_waits_for_the_next_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test above failed once in a full suite: the pool stat-ed the log, the service then wrote
    # READY, and the read found it: the ready file got the log's older time.
    log = tmp_path / "svc-0.log"
    log.write_bytes(b"starting\n")
    os.utime(log, ns=(1_000, 1_000))
    opened = Path.open

    def write_then_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == log and not getattr(write_then_open, "done", False):
            write_then_open.done = True  # type: ignore[attr-defined]
            with opened(self, "ab") as f:
                f.write(b"READY\n")
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", write_then_open)
    ready = re.compile(b"READY")
    assert ready_since(log, 0, ready) is None  # the stat saw no ready line: not this round
    assert ready_since(log, 0, ready) == log.stat().st_mtime_ns != 1_000  # the next round, with its time
    assert ready_since(log, log.stat().st_size, ready) is None  # a restart reads from its own offset
