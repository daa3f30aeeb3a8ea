"""A soak's ledger compacted in the background while it runs, so its close reads only the tails.

A million-operation soak writes about 3 GB of segments; compacting them all at the close took
half a minute, more than the rest of the close together. A low-priority thread of the driver
instead spills the whole lines written every ``TAKE_EVERY_S`` (``Compaction.take``) until the
close finishes that compaction (``RunSession.close(compaction=...)``; a take after that does
nothing). What it writes is what compacting at the close writes (tests/unit/test_ledger.py holds
the two equal).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pyarrow as pa

from harness.ledger.reader import Compaction

TAKE_EVERY_S = 2.0
TAKE_BYTES = 16 << 20  # of JSON lines a take: Arrow's parse and the spill hold a few times that
NICE = 10  # the flow under test comes first: this thread gets what the machine has to spare


class LiveCompaction:
    """Take the ledger's new lines every ``every_s`` on a thread of its own until ``close``.

    The process's Arrow memory pool becomes the system allocator. Arrow's default (mimalloc) kept
    what the takes freed: fed a 200,000-op Kafka soak's segments in 60 MB steps, a process held
    175-230 MB more after its takes under mimalloc, about 65 MB more under the system allocator,
    and compacted in the same time either way. The close's ``finish`` sorts and writes under Arrow's
    own allocator again (``harness.ledger.reader``): there the system allocator's trims cost more.
    """

    def __init__(self, ledger_dir: Path, *, every_s: float = TAKE_EVERY_S) -> None:
        pa.set_memory_pool(pa.system_memory_pool())
        self.compaction = Compaction(ledger_dir)
        self.every_s = every_s
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txchaos-live-compaction", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's nice value is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        while not self._stop.wait(self.every_s):
            try:
                while not self._stop.is_set() and self._backlog_taken():
                    pass  # a backlog in small takes: each holds memory for its bytes only
            except Exception as exc:  # ``finish`` reads the whole ledger again: nothing is lost
                self.error = exc
                return

    def _backlog_taken(self) -> bool:
        """Take once; return True when that take met a backlog (it filled most of its byte bound).

        Not "it found new lines": the run writes all the time, so a thread that takes again while
        anything is new never waits. It took the few events written during each take, over and
        over: 4.3 s of CPU in the first 13,000 operations of a 20,000-op ActiveMQ soak, where
        taking every 2 s costs about 1.2 s for the whole ledger.
        """
        before = self.compaction.taken_bytes
        self.compaction.take(max_bytes=TAKE_BYTES)
        return self.compaction.taken_bytes - before >= TAKE_BYTES // 2

    def close(self) -> None:
        """Stop taking and drop whatever was spilled and not finished (a soak ended without a verdict)."""
        self._stop.set()
        self._thread.join()
        self.compaction.discard()

    def __enter__(self) -> LiveCompaction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
