"""Which input messages a stage worker took and has not yet settled (committed or NACKed).

An operation can come out of the flow before every copy of its message is settled: a producer
stage killed after its DB commit gets its input message back, while the outbox relay already
carried the operation on. Closing the books before that redelivery is processed would drain the
message as residue and report a healthy flow as ``stuck``. Quiescence therefore also waits until
the latest delivery of every message was settled by the worker process that received it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from harness.ledger.schema import Kind
from harness.ledger.tail import LedgerTail

_SETTLED = {str(Kind.BROKER_COMMIT), str(Kind.NACK)}


class Settlement:
    """Follow a run's ledger and tell which delivered messages are still unsettled.

    Events are matched by timestamp and process, not by the order they are read in: segments
    are read one after another, so a redelivery can be seen before the delivery it repeats.
    """

    def __init__(self, ledger_dir: Path) -> None:
        self._tail = LedgerTail(ledger_dir)
        self._latest: dict[str, tuple[int, int]] = {}  # msg -> (ts_ns, pid) of its latest delivery
        self._settled_by: defaultdict[str, set[int]] = defaultdict(set)  # msg -> pids that settled it

    def unsettled(self) -> set[str]:
        """Return the message ids whose latest delivery has no commit or NACK by its receiver."""
        for event in self._tail.new():
            msg, kind = event.get("msg"), event["kind"]
            if msg is None:
                continue
            if kind == Kind.DELIVER:
                seen = (int(event["ts_ns"]), int(event["pid"]))
                self._latest[msg] = max(self._latest.get(msg, seen), seen)
            elif kind in _SETTLED:
                self._settled_by[msg].add(int(event["pid"]))
        return {msg for msg, (_, pid) in self._latest.items() if pid not in self._settled_by[msg]}
