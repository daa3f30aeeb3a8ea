"""Run a chain of ActiveMQ (STOMP) queue stages: the ``activemq`` flow's parts.

``Queues`` is the topology: a chain of stages, each a pool of workers on its input queue (the
first fed by the ``Messages`` workload, each next by the one before), with helper processes (an
outbox relay, a service) and an optional transactional outbox. ``QueuesSettle`` is how the
``AllOut`` quiescence settles on queues: every operation out (downstream or dead-lettered) and
every delivery settled, or the flow idle (``_Idleness``) with some never out. The books close with
the queues' residue, the effect table and the unrelayed outbox rows (``queue_books``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from harness.clients import db
from harness.errors import HarnessError
from harness.poll import poll_until
from harness.run.core.books import Book, UnsentOutbox
from harness.run.core.parts import worker_spec
from harness.run.core.roles import SessionView
from harness.run.core.sink_parts import Messages, SinkStopped, SinkTopology, all_out, effect_book
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.flow import OPTIONAL_FIELDS, Flow, Parts, register
from harness.run.spec.ops import OpSet
from harness.run.transports.activemq import ActiveMQTransport
from harness.run.transports.activemq_sink import QueueResidue, Sink
from harness.run.transports.settle import IN_DOUBT_S, Settlement
from harness.worker.crash import ACTIONS, STAGE_POINTS
from harness.worker.spec import WorkerSpec

__all__ = ["IDLE_S", "QUEUE_PARTS", "Queues"]

# How long the flow must stay idle before operations that never came out are judged (``_Idleness``):
# twice the redelivery plugin's 1 s delay, and room for a restarted broker to dispatch again.
IDLE_S = 2.0


class Queues(SinkTopology):
    """The topology of a chain of queue stages: ``<ns>.in``, a queue per further stage, ``<ns>.out``."""

    late_workers: ClassVar[bool] = False
    submits_via: ClassVar[frozenset[str]] = frozenset({"activemq_stomp"})

    def __init__(self, session: SessionView) -> None:
        self.session = session
        spec, ns = session.spec, session.ns
        self.group = f"{ns}.group"  # a service's consumer group, where its transport has one
        self.input_queue, self.output_queue = f"{ns}.in", f"{ns}.out"
        self.input_dest = self.input_queue
        # The input queue of every stage: the first is fed by submit, each next by the one before.
        self.stage_queues = [self.input_queue, *(f"{ns}.{s.name}" for s in spec.chain)]
        if spec.service is not None:
            # A service's inner queues are read like stage queues: residue, and their dead letters.
            self.stage_queues.extend(spec.service.inner_queues(self.input_queue))
        self.own_stomp = session.endpoints.stomp.direct() if session.bypass_faults else session.endpoints.stomp
        self.transport = ActiveMQTransport(self.own_stomp, session.folder)
        self.sink: Sink | None = None

    def provision(self) -> None:
        s = self.session
        output = self.output_queue if s.spec.contract.expects_downstream else None
        self.sink = Sink(self.own_stomp, s.ledger, input_queues=self.stage_queues, output_queue=output)
        self.sink.start()
        self.transport.create(self.stage_queues)

    def announce(self) -> None:
        spec, folder = self.session.spec, self.session.folder
        folder.step(f"start {spec.workers} worker(s) running {spec.handler} on {self.input_queue}")
        for stage, queue in zip(spec.chain, self.stage_queues[1:], strict=True):
            folder.step(f"start {stage.workers} {stage.name} worker(s) running {stage.handler} on {queue}")
        for helper in spec.helpers:
            folder.step(f"start helper {helper.name} running {helper.handler}")

    def worker_specs(self) -> list[WorkerSpec]:
        """Return the workers of every stage, then the helper processes."""
        s = self.session
        spec, run_dir = s.spec, s.folder.path
        urls = {f"{name}_url": f"http://127.0.0.1:{port}" for name, port in s.helper_ports.items()}
        final = self.output_queue if spec.contract.expects_downstream else None
        outputs = [*self.stage_queues[1:], final]
        stages = [
            ("worker", spec.name, spec.handler, spec.workers, spec.options),
            *((st.name, st.name, st.handler, st.workers, st.options) for st in spec.chain),
        ]
        out = [
            worker_spec(
                run_dir,
                f"{prefix}-{i}",
                handler,
                stage=stage,
                input_queue=queue,
                output_queue=output,
                options={**urls, **options},
                kind="stage",
            )
            for (prefix, stage, handler, count, options), queue, output in zip(
                stages, self.stage_queues, outputs, strict=True
            )
            for i in range(count)
        ]
        # A helper that feeds a stage (an outbox relay) finds its input queue here, keyed like the
        # stage's worker names: "worker" for the first stage, then each chain stage's name.
        queues = {prefix: queue for (prefix, *_), queue in zip(stages, self.stage_queues, strict=True)}
        for h in spec.helpers:
            port = {"port": s.helper_ports[h.name]} if h.port else {}
            options = {**urls, "queues": queues, **h.options, **port}
            out.append(
                worker_spec(
                    run_dir,
                    h.name,
                    h.handler,
                    input_queue=self.input_queue,
                    output_queue=None,
                    options=options,
                    kind="process",
                )
            )
        return out


@dataclass
class QueuesSettle:
    """How quiescence settles on queues: deliveries settled, the flow idle, the outbox relayed."""

    session: SessionView
    place: Queues

    def all_out(self, pool: WorkerPool, deadline: float) -> None:
        # A worker killed after its DB commit gets its message back once it is replaced, and the
        # replacement must settle it before the queues are drained as residue.
        s = self.session
        if pool.wait_serving(deadline):
            self._await_settled(deadline)
            sink = self.place.sink
            if s.arms and not s.processes.ledgers_deliveries and sink is not None:
                # A trap may have cut off or killed a service instance that had already sent its
                # output but not its ACK: it notices a moment later, ends, and its message comes
                # back to the instance started in its place. No ledger says a message is pending, so
                # wait until the flow has been idle a while, or that message would be drained as
                # residue (stuck) instead of applied again (a duplicate effect).
                idle = _Idleness(Settlement(s.folder.path / "ledger"), pool, sink, IDLE_S)
                poll_until(lambda: idle.idle(self._outbox_empty), deadline=deadline, every_s=0.05)

    def nothing_more(self, sink: Sink, pool: WorkerPool) -> Callable[[int, int], bool]:
        """Return the probe: the flow idle (``_Idleness``) with some never out, or a crash loop."""
        # A crash loop (a poison message) never ends on its own: once the workers have died more
        # often than the contract's max_deliveries with nothing coming out, stop waiting for it.
        s = self.session
        limit = s.spec.contract.max_deliveries
        progressed, restarts_then = -1, pool.restarts
        idle = _Idleness(Settlement(s.folder.path / "ledger"), pool, sink, max(s.spec.settle_s, IDLE_S))

        def probe(done: int, missing: int) -> bool:
            nonlocal progressed, restarts_then
            if idle.idle(self._outbox_empty):
                s.progress(f"the flow is idle; {missing} operation(s) never came out")
                s.folder.step(f"quiescence: idle for {idle.quiet_s}s with {missing} operation(s) not out")
                return True
            if done > progressed:
                progressed, restarts_then = done, pool.restarts
            elif limit is not None and pool.restarts - restarts_then > limit:
                looped = pool.restarts - restarts_then
                s.progress(f"crash loop: {looped} worker restarts and no operation out; not waiting longer")
                s.folder.step(f"crash loop: {looped} restarts with {missing} operation(s) not out")
                return True
            return False

        return probe

    def after_out(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) until the outbox holds no unsent row.

        An operation can come out before its outbox row is marked sent (a relay killed between
        send and mark): the sweeper sends it again and marks it later. Snapshotting before then
        would report a row that is about to be relayed as an orphan.
        """
        poll_until(self._outbox_empty, deadline=deadline, every_s=0.05)

    def _await_settled(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) until every delivered input message is committed or NACKed."""
        s = self.session
        settlement = Settlement(s.folder.path / "ledger")

        pending: set[str] = set()

        def settled() -> bool:
            sink, pool = self.place.sink, s.pool
            out = sink.accounted() if sink is not None else OpSet()
            live = {p.pid for p in pool.procs.values() if p.alive()} if pool is not None else None
            pending.clear()
            pending.update(settlement.unsettled(out, live))
            return not pending

        def report(waited: float) -> None:
            s.progress(
                f"{len(pending)} delivered message(s) not yet committed or given back after {waited:.0f}s "
                f"(a dead worker's copy counts once its operation is out and {IN_DOUBT_S:g}s old)"
            )

        if not poll_until(settled, deadline=deadline, report=report, report_every_s=3.0):
            s.folder.step(f"quiescence: {len(pending)} delivered message(s) never settled")

    def _outbox_empty(self) -> bool:
        outbox = self.session.spec.outbox_table
        if outbox is None:
            return True
        try:
            engine = self.session.engine("outbox")
        except HarnessError:  # the run closed meanwhile: nothing to wait for
            return True
        return not db.column_values(engine, outbox, "op_id", where_null="sent_at")


def queue_books(session: SessionView, place: Queues) -> tuple[Book, ...]:
    """The queues' residue, the sink's last reads, the effect table, then the unrelayed outbox rows."""
    s, spec = session, session.spec
    idle = min(0.3, max(0.1, spec.settle_s))
    outbox = spec.outbox_table
    return (
        QueueResidue(s.endpoints.stomp, tuple(place.stage_queues), s.ledger, s.folder, idle),
        SinkStopped(place),
        effect_book(s),
        *([UnsentOutbox(s.ledger, s.folder, outbox)] if outbox else []),
    )


class _Idleness:
    """Tell when every piece of evidence about the operations still out is in.

    Idle means, unbroken for ``quiet_s``: every worker alive and subscribed (none dead or being
    replaced), every delivered message settled by the process that received it (a message a
    killed worker held comes back), no operation NACKed and not seen since (a redelivery the
    broker's plugin holds a second or more), nothing new in the ledger or at the sink, no worker
    restarted, and no unsent outbox row. A message still in a queue would have been delivered to
    one of the idle workers (prefetch 1) within that time; an operation still out then never
    comes out, and the books can close on it without waiting out the timeout.
    """

    def __init__(self, settlement: Settlement, pool: WorkerPool, sink: Sink, quiet_s: float) -> None:
        self.settlement, self.pool, self.sink, self.quiet_s = settlement, pool, sink, quiet_s
        self._since: float | None = None
        self._restarts = pool.restarts

    def idle(self, outbox_empty: Callable[[], bool]) -> bool:
        """Return whether the flow has been idle for ``quiet_s``; call it in the waiting loop."""
        now = time.monotonic()
        busy = (
            self.pool.restarts != self._restarts
            or not self.pool.serving()
            or bool(self.settlement.unsettled())
            or bool(self.settlement.given_back(self.sink.accounted()))
        )
        self._restarts = self.pool.restarts
        if busy:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        quiet_for = min(now - self._since, now - self.settlement.last_event, self.sink.quiet_s())
        # The outbox is asked last and rarely: a database query, not a look at files.
        return quiet_for >= self.quiet_s and outbox_empty()


QUEUE_PARTS = Parts(Queues, Messages, all_out(QueuesSettle), queue_books)
FLOW = register(
    Flow(
        "activemq",
        "activemq",
        "a chain of STOMP queue stages with helpers and an outbox",
        parts=QUEUE_PARTS,
        points=STAGE_POINTS,
        actions=ACTIONS,
        accepts=frozenset(OPTIONAL_FIELDS),
        label="stage",
    )
)
