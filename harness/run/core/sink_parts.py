"""The parts of a stage flow whose sink reads what comes out: its workload, quiescence and sink book.

Written once for every transport (ActiveMQ, Kafka) and for a team's service on either: ``Messages``
submits plain operations to the topology's input, ``AllOut`` waits until every operation came out
or the transport's ``Settling`` says nothing more will, and ``SinkStopped`` lets the sink read what
is still on its way before the effect books close. A topology these parts serve is a ``SinkPlace``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from harness.clients import db
from harness.errors import HarnessError
from harness.jsontext import dumps
from harness.ledger.schema import Kind
from harness.poll import deadline_in, poll_until
from harness.run.core.books import EffectTable
from harness.run.core.roles import Plain, Quiescence, SessionView
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.ops import OpSet
from harness.run.spec.scenario import ScenarioSpec
from harness.run.transports.base import Transport
from harness.stack.base import Endpoints


class Sink(Protocol):
    def check(self) -> None: ...
    def accounted(self) -> OpSet: ...
    def count(self) -> int: ...
    def stop(self, *, idle_s: float = 0.3) -> None: ...


class SinkPlace(Protocol):
    """A topology with an input the workload sends to and a sink that reads what comes out."""

    input_dest: str  # the first stage's input: where submit sends
    sink: Any  # a ``Sink`` once provisioned; None before and after

    @property
    def transport(self) -> Transport: ...


class SinkTopology:
    """What every sink flow's topology does alike: the spec's effect table, and releasing sink and transport.

    A transport's topology (``Queues``, ``Topics``) names its destinations, sets ``transport``,
    ``input_dest`` and ``group`` and starts ``sink`` in ``provision``.
    """

    session: SessionView
    transport: Transport
    sink: Any = None

    @classmethod
    def check(cls, spec: ScenarioSpec, endpoints: Endpoints) -> None:
        return None

    def effect_tables(self) -> tuple[tuple[str, str], ...]:
        return ((self.session.spec.effect_table, self.session.spec.effect_column),)

    def release(self) -> None:
        """Stop the sink at once and release the transport (healing)."""
        if self.sink is not None:
            self.sink.stop(idle_s=0)
            self.sink = None
        self.transport.release()


def effect_book(session: SessionView) -> EffectTable:
    """Return the book of the spec's effect table (every sink flow but CQRS closes it)."""
    spec = session.spec
    return EffectTable(session.ledger, session.folder, spec.effect_table, spec.effect_column)


@dataclass
class Messages(Plain):
    """Plain operations: one message (record) each, keyed by its id, sent to the topology's input."""

    session: SessionView
    place: SinkPlace

    def submit(self, count: int, *, poison: bool = False, **extra: Any) -> list[str]:
        """Send ``count`` new operations (requester-made ids, each its record's key); return their ids.

        ``poison`` marks them as poison messages (as do the spec's ``poison`` numbers): their
        handler cannot process them, on any delivery. Returns once the broker holds every one;
        the ledger holds a SUBMIT for each before it goes out.
        """
        s, place = self.session, self.place
        new = s.mint(count)
        bodies = []
        # every SUBMIT written (a few calls, not one a row: ``emit_ops``) before the first goes out
        s.ledger.emit_ops(Kind.SUBMIT, new, dest=place.input_dest)
        for n, op in enumerate(new, start=len(s.ops)):
            fields: dict[str, object] = {"op": op, "n": n, "amount": 1 + n % 7}
            if poison or n in s.spec.poison:
                fields["poison"] = True
            body = s.processes.body(fields)  # a service's body template, else the fields as JSON
            bodies.append(dumps(fields) if body is None else body)
        for op, body in zip(new, bodies, strict=True):
            place.transport.send(place.input_dest, body, key=op, headers={"txchaos-op": op})
            s.ops.append(op)
        place.transport.flush()
        s.folder.step(f"submit {count} {'poison ' if poison else ''}operation(s) to {place.input_dest}")
        s.progress(f"submitted {len(s.ops)} operations")
        return new

    def out_count(self) -> int | None:
        """How many operations came out so far; what killed the sink, raised, when it died.

        A soak asks this every tick: a dead sink counts nothing more, and a closed loop waiting
        for its count would wait forever instead of stopping with the sink's error.
        """
        sink = self.place.sink
        if sink is None:
            return None
        sink.check()
        return int(sink.count())


class Settling(Protocol):
    """A transport's part of ``AllOut``: what settles after every operation came out, and the probe."""

    def all_out(self, pool: WorkerPool, deadline: float) -> None:
        """Let what follows every operation out settle (a replaced worker's redelivery)."""
        ...

    def nothing_more(self, sink: Any, pool: WorkerPool) -> Callable[[int, int], bool]:
        """Return the probe ``(done, missing) -> bool``: True once nothing more will come out."""
        ...

    def after_out(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) for what must settle before the books close."""
        ...


@dataclass
class AllOut:
    """Quiet when every operation came out, or the transport's probe says no more will; bounded by the timeout."""

    session: SessionView
    place: SinkPlace
    settling: Settling

    def wait(self, pool: WorkerPool) -> None:
        s, sink = self.session, self.place.sink
        if sink is None:
            raise HarnessError("close() of a run whose sink is gone", hint="open the run again")
        ops, out = s.ops, sink.accounted()
        want = len(ops)
        deadline = deadline_in(s.spec.timeout_s)
        nothing_more = self.settling.nothing_more(sink, pool)
        all_out = False

        def quiet() -> bool:
            nonlocal all_out
            sink.check()
            done = out.count_of(ops)
            all_out = done == want
            return all_out or nothing_more(done, want - done)

        def report(waited: float) -> None:
            s.progress(f"{out.count_of(ops)}/{want} operations out after {waited:.0f}s, {pool.restarts} restart(s)")

        if not poll_until(quiet, deadline=deadline, report=report):
            s.progress(f"timeout after {s.spec.timeout_s}s: {want - out.count_of(ops)} operation(s) not out")
        elif all_out:
            self.settling.all_out(pool, deadline)
        self.settling.after_out(deadline)
        s.quiescent(lambda: out.count_of(ops), "out", pool)


def all_out(settling: Callable[[Any, Any], Settling]) -> Callable[[SessionView, SinkPlace], Quiescence]:
    """Return the quiescence part of a sink flow whose transport settles as ``settling`` says."""

    def build(session: SessionView, place: SinkPlace) -> Quiescence:
        return AllOut(session, place, settling(session, place))

    return build


@dataclass
class SinkStopped:
    """Not an account but a turn of the books: the sink reads what is still on its way, then stops."""

    place: SinkPlace

    def close(self, engine: db.Engine) -> None:
        if self.place.sink is not None:
            self.place.sink.stop()
            self.place.sink = None
