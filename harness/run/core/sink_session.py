"""``SinkSession``: the lifecycle of a stage flow on a transport, whose sink reads what comes out.

Submitting plain operations, quiescence (every operation out, or the transport's probe says no
more will come out, or the timeout), closing the books with the input's residue and healing the
sink and the transport are written here once for every transport (ActiveMQ, Kafka).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from harness.clients import db
from harness.errors import HarnessError
from harness.ledger.schema import Kind
from harness.poll import deadline_in, poll_until
from harness.run.core.books import Book
from harness.run.core.session import RunSession
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.ops import OpSet
from harness.run.transports.base import Transport


class _Sink(Protocol):
    def check(self) -> None: ...
    def accounted(self) -> OpSet: ...
    def count(self) -> int: ...
    def stop(self, *, idle_s: float = 0.3) -> None: ...


SinkT = TypeVar("SinkT", bound=_Sink)


class SinkSession(RunSession, Generic[SinkT]):
    """A stage flow on a transport: a sink reads what comes out (outputs, dead letters) meanwhile.

    Quiescence is written here once: every operation out (then ``_all_out``), or the transport's
    probe (``_nothing_more``) says nothing more will come out, or the timeout. The subclass
    supplies those two, ``_residue`` (the book of what is still in the input) and ``_effects`` (its
    other books); the
    sink and the transport are healed here.
    """

    transport: Transport
    input_dest: str  # the first stage's input: where submit sends
    _sink: SinkT | None = None

    def _submit(self, count: int, *, poison: bool = False) -> list[str]:
        """Send ``count`` new operations (requester-made ids, each its record's key); return their ids.

        ``poison`` marks them as poison messages (as do the spec's ``poison`` numbers): their
        handler cannot process them, on any delivery. Returns once the broker holds every one;
        the ledger holds a SUBMIT for each before it goes out.
        """
        self.engine("submit")  # refuses a run that is not open
        new = self._mint(count)
        bodies = []
        with self.ledger.batch():  # every SUBMIT written (in one call) before the first goes out
            for n, op in enumerate(new, start=len(self.ops)):
                fields: dict[str, object] = {"op": op, "n": n, "amount": 1 + n % 7}
                if poison or n in self.spec.poison:
                    fields["poison"] = True
                self.ledger.emit(Kind.SUBMIT, op=op, dest=self.input_dest)
                bodies.append(self._body(fields))
        for op, body in zip(new, bodies, strict=True):
            self.transport.send(self.input_dest, body, key=op, headers={"txchaos-op": op})
            self.ops.append(op)
        self.transport.flush()
        self.folder.step(f"submit {count} {'poison ' if poison else ''}operation(s) to {self.input_dest}")
        self.progress(f"submitted {len(self.ops)} operations")
        return new

    def _body(self, fields: dict[str, object]) -> str:
        """Return the body of the operation ``fields`` describe (``op``, ``n``, ``amount``, ``poison``):
        the processes' own (a service's body template), else the fields as JSON."""
        body = self.processes.body(fields)
        return json.dumps(fields) if body is None else body

    def out_count(self) -> int | None:
        sink = self._sink
        return None if sink is None else sink.count()

    def _all_out(self, pool: WorkerPool, deadline: float) -> None:
        """Let what follows every operation out settle (a replaced worker's redelivery)."""

    def _nothing_more(self, sink: SinkT, pool: WorkerPool) -> Callable[[int, int], bool]:
        """Return the probe ``(done, missing) -> bool``: True once nothing more will come out."""
        raise NotImplementedError

    def _after_out(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) for what must settle before the books close."""

    def _residue(self) -> Book:
        """Return the book of what is still in the flow's input (its transport's residue reader)."""
        raise NotImplementedError

    def _effects(self) -> tuple[Book, ...]:
        """Return the books of what the flow did (default: the spec's effect table)."""
        return (self._effect_table(),)

    def _await_quiescence(self, pool: WorkerPool) -> None:
        """Wait until every operation came out, or the probe says no more will; bounded by the timeout."""
        sink = self._sink
        if sink is None:
            raise HarnessError("close() of a run whose sink is gone", hint="open the run again")
        ops, out = self.ops, sink.accounted()
        want = len(ops)
        deadline = deadline_in(self.spec.timeout_s)
        nothing_more = self._nothing_more(sink, pool)
        last_report, all_out = 0, False

        def quiet() -> bool:
            nonlocal last_report, all_out
            sink.check()
            done = out.count_of(ops)
            if done == want:
                all_out = True
                return True
            if nothing_more(done, want - done):
                return True
            if done - last_report >= max(1, want // 10):
                self.progress(f"{done}/{want} operations out, {pool.restarts} worker restart(s)")
                last_report = done
            return False

        if not poll_until(quiet, deadline=deadline):
            self.progress(f"timeout after {self.spec.timeout_s}s: {want - out.count_of(ops)} operation(s) not out")
        elif all_out:
            self._all_out(pool, deadline)
        self._after_out(deadline)
        self._quiescent(lambda: out.count_of(ops), "out", pool)

    def books(self) -> tuple[Book, ...]:
        """The input's residue, then the sink's last reads (``SinkStopped``), then the effects."""
        return (self._residue(), SinkStopped(self), *self._effects())

    def _release(self) -> None:
        if self._sink is not None:
            self._sink.stop(idle_s=0)
            self._sink = None
        self.transport.release()


class SinkStopped:
    """Not an account but a turn of the books: the sink reads what is still on its way, then stops."""

    def __init__(self, session: SinkSession[Any]) -> None:
        self.session = session

    def close(self, engine: db.Engine) -> None:
        if self.session._sink is not None:
            self.session._sink.stop()
            self.session._sink = None
