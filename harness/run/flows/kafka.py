"""Run one Kafka consumer-group stage: the ``kafka`` flow's session.

``KafkaRunSession`` supplies ``RunSession``'s hooks for per-run topics ``<ns>.in``, ``<ns>.out``
and ``<ns>.in-dlt`` (``KafkaTopics``) and a consumer group of worker processes. Operations are
records keyed by their id. Quiescence is every operation out, or the group committed all input
and the sink read its topics to their end since; the residue is every input record past the
group's committed offsets: what the group would still have to process.

``drive`` submits the operations before the first fault window before the workers join
(``late_workers``), as a consumer catching up on a backlog: the polled batches are then the
same on every run of a seed (with one partition, exactly ``batch_size`` records in offset
order), so the anomalies are too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.clients import kafka
from harness.poll import poll_until
from harness.run.core.books import Book
from harness.run.core.sink_session import SinkSession
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.flow import Flow, register
from harness.run.transports.kafka import KafkaTransport
from harness.run.transports.kafka_sink import GroupBacklog, KafkaSink
from harness.worker.kafka_options import KAFKA_ACTIONS, KAFKA_POINTS, KafkaStageOptions
from harness.worker.spec import WorkerSpec

COMMITTED_POLL_S = 0.25  # how often quiescence asks the coordinator for the group's offsets


class KafkaRunSession(SinkSession[KafkaSink]):
    """One Kafka run, driven step by step (build it as ``RunSession(spec, endpoints)``).

    >>> with RunSession(spec, endpoints) as run:
    ...     run.submit(20)
    ...     run.arm(Crash("before_offset_commit", op_index=7))
    ...     result = run.close()
    """

    late_workers = True
    transport: KafkaTransport

    def _setup(self) -> None:
        self.opts = self.spec.settings_as(KafkaStageOptions)
        self.bootstrap = self.endpoints.kafka.address
        self.input_topic, self.output_topic = f"{self.ns}.in", f"{self.ns}.out"
        self.input_dest = self.input_topic
        self.dlt = kafka.dlt_name(self.input_topic)
        self.group = f"{self.ns}.group"
        self.transport = KafkaTransport(self.bootstrap, self.folder, partitions=self.opts.partitions)

    # -- hooks ---------------------------------------------------------------------------------
    def _provision(self) -> None:
        self.transport.create([self.input_topic, self.output_topic, self.dlt])
        output = self.output_topic if self.spec.contract.expects_downstream else None
        self._sink = KafkaSink(self.bootstrap, self.ledger, input_topic=self.input_topic, output_topic=output)
        self._sink.start()

    def _announce_workers(self) -> None:
        o = self.opts
        self.folder.step(
            f"start {self.spec.workers} worker(s) running {self.spec.handler} in group {self.group} on "
            f"{self.input_topic}: batch {o.batch_size}, offset store {o.offset_store}, commit {o.commit}, "
            f"db tx per {o.db_tx}"
        )

    # -- acting while the flow runs ------------------------------------------------------------
    # -- phases --------------------------------------------------------------------------------
    def _worker_specs(self) -> list[WorkerSpec]:
        spec = self.spec
        output = self.output_topic if spec.contract.expects_downstream else None
        return [
            self._worker(
                f"worker-{i}",
                spec.handler,
                stage=spec.name,
                input_queue=self.input_topic,
                output_queue=output,
                options={**spec.options, "group": self.group},
                kind="kafka",
            )
            for i in range(spec.workers)
        ]

    def consumed(self) -> bool:
        """Return True when the group has committed every input record (nothing left to process)."""
        return not kafka.backlog(self.bootstrap, self.group, self.input_topic)

    def _all_out(self, pool: WorkerPool, deadline: float) -> None:
        pool.wait_serving(deadline)  # a replaced consumer may still get records back
        self._await_committed(deadline)

    def _nothing_more(self, sink: KafkaSink, pool: WorkerPool) -> Callable[[int, int], bool]:
        """Return the probe: the group has committed all input, the sink has read its topics to
        their end since, and nothing came out for ``settle_s`` (a lost operation never comes out).

        The quiet time counts from when the commit was first seen: with the auto offset store a
        commit covers records whose output is still to come.
        """
        settle = max(self.spec.settle_s, COMMITTED_POLL_S)
        next_check = 0.0
        consumed_at: float | None = None

        def probe(done: int, missing: int) -> bool:
            nonlocal next_check, consumed_at
            now = time.monotonic()
            if consumed_at is None and now >= next_check:
                next_check = now + COMMITTED_POLL_S
                if self.consumed():
                    consumed_at = time.monotonic()  # the outputs were flushed before this commit
            # Every output written before the commit must have been read, or an operation still on
            # its way (a dead letter the sink has not fetched yet) would be reported lost.
            # A consumer being replaced may still get records back: idle means every one serves.
            if (
                consumed_at is not None
                and min(now - consumed_at, sink.quiet_s()) >= settle
                and sink.caught_up_since(consumed_at)
                and pool.serving()
            ):
                self.progress(f"input consumed and committed; {missing} operation(s) never came out")
                return True
            return False

        return probe

    def _await_committed(self, deadline: float) -> None:
        """Wait (bounded) until the group committed all input: a worker killed after its output
        but before its offset commit gets the records back, and its skip commits them."""
        poll_until(self.consumed, deadline=deadline, every_s=COMMITTED_POLL_S)

    def _residue(self) -> Book:
        return GroupBacklog(self.bootstrap, self.group, self.input_topic, self.ledger, self.folder)


def kafka_flow(name: str, session: type[Any], summary: str, **kw: Any) -> Flow:
    """Return a flow of Kafka stages: their crash points and actions; no chain, helpers or outbox."""
    kw.setdefault("parse", KafkaStageOptions.from_options)
    return Flow(
        name,
        "kafka",
        summary,
        session=session,
        points=KAFKA_POINTS,
        actions=KAFKA_ACTIONS,
        accepts=frozenset({"poison", "workers"}),
        refusal="the Kafka run has one consumer stage so far: leave those out",
        label="Kafka",
        **kw,
    )


FLOW = register(kafka_flow("kafka", KafkaRunSession, "one consumer-group stage on topics"))
