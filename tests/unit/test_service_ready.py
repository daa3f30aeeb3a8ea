"""An instance's ready file carries the time its ready line was written, not the pool's polling round."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.ledger.writer import LedgerWriter
from harness.run.processes.service_pool import Instance, ServicePool


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
