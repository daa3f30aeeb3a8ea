"""Run a chain of ActiveMQ (STOMP) queue stages: the ``activemq`` flow's session.

``StageRunSession`` supplies ``RunSession``'s hooks for a chain of stages, each a pool of
workers on its input queue (the first fed by ``submit``, each next by the one before), with
helper processes (an outbox relay, a service) and an optional transactional outbox. Quiescence
is every operation out (downstream or dead-lettered) or the flow idle (``_Idleness``) with some
never out; the books close with the queues' residue, the effect table and the unrelayed outbox
rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness.clients import db
from harness.poll import poll_until
from harness.run.core.books import Book, UnsentOutbox
from harness.run.core.sink_session import SinkSession
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.flow import OPTIONAL_FIELDS, Flow, register
from harness.run.spec.ops import OpSet
from harness.run.transports.activemq import ActiveMQTransport
from harness.run.transports.activemq_sink import QueueResidue, Sink
from harness.run.transports.settle import Settlement
from harness.worker.crash import ACTIONS, STAGE_POINTS
from harness.worker.spec import WorkerSpec

__all__ = ["IDLE_S", "StageRunSession"]

# How long the flow must stay idle before operations that never came out are judged (``_Idleness``):
# twice the redelivery plugin's 1 s delay, and room for a restarted broker to dispatch again.
IDLE_S = 2.0


class StageRunSession(SinkSession[Sink]):
    """One run of a chain of queue stages, driven step by step (build it as ``RunSession(spec, endpoints)``).

    >>> with RunSession(spec, endpoints) as run:
    ...     ops = run.submit(5)
    ...     run.arm(Crash("after_db_commit", op_index=2))
    ...     result = run.close()
    """

    transport: ActiveMQTransport

    def _setup(self) -> None:
        self.input_queue, self.output_queue = f"{self.ns}.in", f"{self.ns}.out"
        self.input_dest = self.input_queue
        # The input queue of every stage: the first is fed by submit, each next by the one before.
        self.stage_queues = [self.input_queue, *(f"{self.ns}.{s.name}" for s in self.spec.chain)]
        if self.spec.service is not None:
            # A service's inner queues are read like stage queues: residue, and their dead letters.
            self.stage_queues.extend(self.spec.service.inner_queues(self.input_queue))
        self.own_stomp = self.endpoints.stomp.direct() if self.bypass_faults else self.endpoints.stomp
        self.transport = ActiveMQTransport(self.own_stomp, self.folder)

    # -- hooks ---------------------------------------------------------------------------------
    def _provision(self) -> None:
        output = self.output_queue if self.spec.contract.expects_downstream else None
        self._sink = Sink(self.own_stomp, self.ledger, input_queues=self.stage_queues, output_queue=output)
        self._sink.start()
        self.transport.create(self.stage_queues)

    def _announce_workers(self) -> None:
        spec, folder = self.spec, self.folder
        folder.step(f"start {spec.workers} worker(s) running {spec.handler} on {self.input_queue}")
        for stage, queue in zip(spec.chain, self.stage_queues[1:], strict=True):
            folder.step(f"start {stage.workers} {stage.name} worker(s) running {stage.handler} on {queue}")
        for helper in spec.helpers:
            folder.step(f"start helper {helper.name} running {helper.handler}")

    # -- acting while the flow runs ------------------------------------------------------------
    # -- phases --------------------------------------------------------------------------------
    def _worker_specs(self) -> list[WorkerSpec]:
        """Return the workers of every stage, then the helper processes."""
        spec = self.spec
        urls = {f"{name}_url": f"http://127.0.0.1:{port}" for name, port in self.helper_ports.items()}
        final = self.output_queue if spec.contract.expects_downstream else None
        outputs = [*self.stage_queues[1:], final]
        stages = [
            ("worker", spec.name, spec.handler, spec.workers, spec.options),
            *((s.name, s.name, s.handler, s.workers, s.options) for s in spec.chain),
        ]
        out = [
            self._worker(
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
            port = {"port": self.helper_ports[h.name]} if h.port else {}
            options = {**urls, "queues": queues, **h.options, **port}
            out.append(
                self._worker(
                    h.name, h.handler, input_queue=self.input_queue, output_queue=None, options=options, kind="process"
                )
            )
        return out

    def _all_out(self, pool: WorkerPool, deadline: float) -> None:
        # A worker killed after its DB commit gets its message back once it is replaced, and the
        # replacement must settle it before the queues are drained as residue.
        if pool.wait_serving(deadline):
            self._await_settled(deadline)
            if self.arms and not self.processes.ledgers_deliveries and self._sink is not None:
                # A trap may have cut off or killed a service instance that had already sent its
                # output but not its ACK: it notices a moment later, ends, and its message comes
                # back to the instance started in its place. No ledger says a message is pending, so
                # wait until the flow has been idle a while, or that message would be drained as
                # residue (stuck) instead of applied again (a duplicate effect).
                idle = _Idleness(Settlement(self.folder.path / "ledger"), pool, self._sink, IDLE_S)
                poll_until(lambda: idle.idle(self._outbox_empty), deadline=deadline, every_s=0.05)

    def _nothing_more(self, sink: Sink, pool: WorkerPool) -> Callable[[int, int], bool]:
        """Return the probe: the flow idle (``_Idleness``) with some never out, or a crash loop."""
        # A crash loop (a poison message) never ends on its own: once the workers have died more
        # often than the contract's max_deliveries with nothing coming out, stop waiting for it.
        limit = self.spec.contract.max_deliveries
        progressed, restarts_then = -1, pool.restarts
        idle = _Idleness(Settlement(self.folder.path / "ledger"), pool, sink, max(self.spec.settle_s, IDLE_S))

        def probe(done: int, missing: int) -> bool:
            nonlocal progressed, restarts_then
            if idle.idle(self._outbox_empty):
                self.progress(f"the flow is idle; {missing} operation(s) never came out")
                self.folder.step(f"quiescence: idle for {idle.quiet_s}s with {missing} operation(s) not out")
                return True
            if done > progressed:
                progressed, restarts_then = done, pool.restarts
            elif limit is not None and pool.restarts - restarts_then > limit:
                looped = pool.restarts - restarts_then
                self.progress(f"crash loop: {looped} worker restarts and no operation out; not waiting longer")
                self.folder.step(f"crash loop: {looped} restarts with {missing} operation(s) not out")
                return True
            return False

        return probe

    def _after_out(self, deadline: float) -> None:
        self._await_outbox(deadline)

    def _await_settled(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) until every delivered input message is committed or NACKed."""
        settlement = Settlement(self.folder.path / "ledger")

        pool = self._pool

        def unsettled() -> set[str]:
            out = self._sink.accounted() if self._sink is not None else OpSet()
            live = {p.pid for p in pool.procs.values() if p.alive()} if pool is not None else None
            return settlement.unsettled(out, live)

        if not poll_until(lambda: not unsettled(), deadline=deadline):
            self.folder.step(f"quiescence: {len(unsettled())} delivered message(s) never settled")

    def _outbox_empty(self) -> bool:
        outbox, engine = self.spec.outbox_table, self._engine
        return outbox is None or engine is None or not db.column_values(engine, outbox, "op_id", where_null="sent_at")

    def _await_outbox(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) until the outbox holds no unsent row.

        An operation can come out before its outbox row is marked sent (a relay killed between
        send and mark): the sweeper sends it again and marks it later. Snapshotting before then
        would report a row that is about to be relayed as an orphan.
        """
        poll_until(self._outbox_empty, deadline=deadline, every_s=0.05)

    def _residue(self) -> Book:
        idle = min(0.3, max(0.1, self.spec.settle_s))
        return QueueResidue(self.endpoints.stomp, tuple(self.stage_queues), self.ledger, self.folder, idle)

    def _effects(self) -> tuple[Book, ...]:
        outbox = self.spec.outbox_table
        return (self._effect_table(), *([UnsentOutbox(self.ledger, self.folder, outbox)] if outbox else []))


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


FLOW = register(
    Flow(
        "activemq",
        "activemq",
        "a chain of STOMP queue stages with helpers and an outbox",
        session=StageRunSession,
        points=STAGE_POINTS,
        actions=ACTIONS,
        accepts=frozenset(OPTIONAL_FIELDS),
        label="stage",
    )
)
