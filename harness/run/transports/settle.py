"""Which input messages a stage worker took and has not yet settled (committed or NACKed).

An operation can come out of the flow before every copy of its message is settled: a producer
stage killed after its DB commit gets its input message back, while the outbox relay already
carried the operation on. Closing the books before that redelivery is processed would drain the
message as residue and report a healthy flow as ``stuck``. Quiescence therefore also waits until
the latest delivery of every message was settled by the worker process that received it.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Collection, Container
from pathlib import Path
from typing import Any

from harness.ledger.schema import Kind
from harness.ledger.tail import LedgerTail

_SETTLED = {str(Kind.BROKER_COMMIT), str(Kind.NACK)}
_READ = (Kind.DELIVER, Kind.BROKER_COMMIT, Kind.NACK, Kind.FORCED_REDELIVERY)  # the kinds ``_read`` looks at
# A key of ``Settlement._settled_by``'s per-message maps that no process has: some process committed
# the message, so the broker holds it no more (a set of its own held a million more strings at a
# million-operation soak's close).
_COMMITTED = 0
IN_DOUBT_S = 10.0  # a dead receiver's message the broker still held is redelivered well within this


def _given_back_by_nack(event: dict[str, Any]) -> bool:
    """Return whether ``event`` is a forced redelivery done by NACK (the worker NACKs without an event)."""
    if event["kind"] != Kind.FORCED_REDELIVERY:
        return False
    detail = event.get("detail") or "{}"
    return bool(json.loads(detail).get("action") == "nack")


class Settlement:
    """Follow a run's ledger and tell which delivered messages are still unsettled.

    Events are matched by timestamp and process, not by the order they are read in: segments
    are read one after another, so a redelivery can be seen before the delivery it repeats.
    """

    def __init__(self, ledger_dir: Path) -> None:
        self._tail = LedgerTail(ledger_dir)
        self._latest: dict[str, tuple[int, int, int]] = {}  # msg -> (ts_ns, pid, seq) of its latest delivery
        # msg -> pid -> seq of that process's latest settlement of it (a process writes in seq order),
        # and ``_COMMITTED`` once any process committed it
        self._settled_by: defaultdict[str, dict[int, int]] = defaultdict(dict)
        self._op_delivered: dict[str, int] = {}  # op -> ts_ns of its latest delivery, any stage
        self._op_nacked: dict[str, int] = {}  # op -> ts_ns of its latest NACK, any stage
        self._msg_op: dict[str, str] = {}  # msg -> its operation
        self.last_event = time.monotonic()  # when the ledger last grew (monotonic clock)

    def _read(self) -> None:
        lines = self._tail.lines
        for event in self._tail.new(_READ):
            msg, kind, op = event.get("msg"), event["kind"], event.get("op")
            if msg is None:
                continue
            ts, pid, seq = int(event["ts_ns"]), int(event["pid"]), int(event["seq"])
            if kind == Kind.DELIVER:
                seen = (ts, pid, seq)
                self._latest[msg] = max(self._latest.get(msg, seen), seen)
                if op is not None:
                    self._msg_op[msg] = op
                    self._op_delivered[op] = max(self._op_delivered.get(op, ts), ts)
            elif kind in _SETTLED or _given_back_by_nack(event):
                settled = self._settled_by[msg]
                if kind == Kind.BROKER_COMMIT:
                    settled[_COMMITTED] = 0
                settled[pid] = max(settled.get(pid, seq), seq)
                if kind != Kind.BROKER_COMMIT and op is not None:
                    self._op_nacked[op] = max(self._op_nacked.get(op, ts), ts)
        if self._tail.lines != lines:  # any event counts, not only the kinds read here
            self.last_event = time.monotonic()

    def unsettled(self, out: Container[str] = (), live: Collection[int] | None = None) -> set[str]:
        """Return the message ids whose latest delivery has no commit or NACK by its receiver since.

        With ``live`` (the pids of the processes running now), a delivery whose receiver is gone
        counts as settled when the broker can no longer hold its message:

        - another delivery of the message was committed (a ``broker_commit`` after the broker's
          RECEIPT): the broker acknowledged and dropped it, so the dead receiver's copy was a stale
          frame (read from its socket after a freeze, once the broker had given the message to
          another worker). Nothing more can come of it, so quiescence need not wait.
        - its operation is ``out`` and the delivery is older than ``IN_DOUBT_S``: the receiver died
          in the middle of it (its broker connection cut under a fault), the broker took the
          operation's commit from someone, and a message it still held would have come back to a
          live worker (a later delivery) long since.
        """
        self._read()
        old = time.time_ns() - int(IN_DOUBT_S * 1e9)
        return {
            msg
            for msg, (ts, pid, seq) in self._latest.items()
            if self._settled_by[msg].get(pid, -1) < seq
            and not (
                live is not None
                and pid not in live
                and (_COMMITTED in self._settled_by[msg] or (ts < old and self._msg_op.get(msg) in out))
            )
        }

    def given_back(self, out: Container[str]) -> set[str]:
        """Return the operations NACKed since their latest delivery and not in ``out`` (came out).

        A NACKed message is dead-lettered at once by a broker without the redelivery plugin, and
        redelivered a second or more later by one with it: until it is seen again, delivered or
        dead-lettered, the broker still holds it, out of any queue a worker could see.
        """
        self._read()
        return {op for op, ts in self._op_nacked.items() if ts >= self._op_delivered.get(op, 0) and op not in out}
