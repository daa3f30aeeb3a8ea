"""``SinkBase``: what every transport's sink shares; a thread records what comes out of the flow.

A sink reads the flow's outputs and dead letters in a thread until ``stop``, writing one
``downstream`` or ``dead_letter`` event per message or record; the session asks it which
operations came out (``accounted``), how long nothing did (``quiet_s``) and whether it died
(``check``). A transport's sink supplies only ``_run``, its reading loop, which calls ``_saw``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.poll import deadline_in, poll_until
from harness.run.spec.ops import OpSet


class SinkBase:
    """The state and the stopping of a sink; subclasses read in ``_run``."""

    def __init__(self, ledger: LedgerWriter, kinds: dict[str, Kind], *, name: str) -> None:
        self.ledger = ledger
        self.kinds = kinds  # destination -> the event a message read there is
        self.out = OpSet()  # the operations that came out (downstream or dead letter): a byte each
        self.received = 0
        # Where an output names its operation when it is not the harness's convention (the
        # ``txchaos-op`` header, the record key, the body's ``op``): a JSON path into the body.
        self.op_path: tuple[str, ...] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = time.monotonic()  # when a message last arrived (or the sink started)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def op_in(self, headers: dict[str, str], body: str | bytes | None, default: str | None) -> str | None:
        """Return the operation an output names: the ``txchaos-op`` header, else the body at ``op_path``."""
        if self.op_path is None or headers.get("txchaos-op"):
            return default
        return json_path(body, self.op_path)

    def _saw(self, op: str | None) -> None:
        """Count one message of ``op`` that came out (its event is already in the ledger)."""
        self._saw_all([op])

    def _saw_all(self, ops: Sequence[str | None]) -> None:
        """Count one message of each of ``ops`` that came out (their events are already in the ledger)."""
        if not ops:
            return
        with self._lock:
            self._last = time.monotonic()
            self.received += len(ops)
            for op in ops:
                if op:
                    self.out.add(op)

    def start(self) -> None:
        self._thread.start()

    def accounted(self) -> OpSet:
        """Return the operations that came out so far: the live set (it only grows), not a copy."""
        return self.out

    def count(self) -> int:
        """Return how many operations came out so far."""
        with self._lock:
            return len(self.out)

    def quiet_s(self) -> float:
        """Return how long nothing has arrived."""
        with self._lock:
            return time.monotonic() - self._last

    def check(self) -> None:
        """Raise what killed the sink's thread, if anything did."""
        if self._error is not None:
            raise self._error

    def stop(self, *, idle_s: float = 0.3) -> None:
        """Wait until nothing arrived for ``idle_s`` (bounded), then stop reading."""
        poll_until(
            lambda: not self._thread.is_alive() or self.quiet_s() >= idle_s, deadline=deadline_in(max(idle_s, 0.1) * 10)
        )
        self._stop.set()
        self._thread.join(10)
        self.check()


def json_path(body: str | bytes | None, path: tuple[str, ...]) -> str | None:
    """Return the value at ``path`` (keys, from the top) of a JSON body as text; None when it is not there.

    >>> json_path('{"order": {"id": "op-1"}}', ("order", "id"))
    'op-1'
    """
    try:
        value: object = json.loads(body or "")
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
    except ValueError:
        return None
    return None if value is None or isinstance(value, dict | list) else str(value)
