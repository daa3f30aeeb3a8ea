"""Run one Kafka consumer-group stage: the ``kafka`` flow's parts.

``Topics`` is the topology: per-run topics ``<ns>.in``, ``<ns>.out`` and ``<ns>.in-dlt``
(``KafkaTopics``) and a consumer group of worker processes. Operations are records keyed by
their id (the ``Messages`` workload). ``GroupCommitted`` is how the ``AllOut`` quiescence settles:
every operation out, or the group committed all input and the sink read its topics to their end
since; the residue is every input record past the group's committed offsets: what the group would
still have to process (``topic_books``).

``drive`` submits the operations before the first fault window before the workers join
(``late_workers``), as a consumer catching up on a backlog: the polled batches are then the
same on every run of a seed (with one partition, exactly ``batch_size`` records in offset
order), so the anomalies are too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.clients import kafka
from harness.poll import poll_until
from harness.run.core.books import Book
from harness.run.core.parts import worker_spec
from harness.run.core.roles import SessionView
from harness.run.core.sink_parts import Messages, SinkStopped, SinkTopology, all_out, effect_book
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.flow import Flow, Parts, register
from harness.run.transports.kafka import KafkaTransport
from harness.run.transports.kafka_sink import GroupBacklog, KafkaSink
from harness.worker.kafka_options import KAFKA_ACTIONS, KAFKA_POINTS, KafkaStageOptions
from harness.worker.spec import WorkerSpec

COMMITTED_POLL_S = 0.25  # how often quiescence asks the coordinator for the group's offsets


class Topics(SinkTopology):
    """The topology of one consumer-group stage: its input, output and dead-letter topics and its group."""

    late_workers: ClassVar[bool] = True
    submits_via: ClassVar[frozenset[str]] = frozenset({"kafka"})
    transport: KafkaTransport

    def __init__(self, session: SessionView) -> None:
        self.session = session
        self.opts = session.spec.settings_as(KafkaStageOptions)
        # The harness's own clients (submissions, the sink, backlog probes); a soak's skip the proxy
        # like the ActiveMQ flow's, or its nemesis would fault the driver instead of the flow.
        self.bootstrap = session.endpoints.kafka_bootstrap(direct=session.bypass_faults)
        ns = session.ns
        self.input_topic, self.output_topic = f"{ns}.in", f"{ns}.out"
        self.input_dest = self.input_topic
        self.dlt = kafka.dlt_name(self.input_topic)
        self.group = f"{ns}.group"
        self.transport = KafkaTransport(self.bootstrap, session.folder, partitions=self.opts.partitions)
        self.sink: KafkaSink | None = None

    def provision(self) -> None:
        self.transport.create([self.input_topic, self.output_topic, self.dlt])
        output = self.output_topic if self.session.spec.contract.expects_downstream else None
        self.sink = KafkaSink(
            self.bootstrap, self.session.ledger, input_topic=self.input_topic, output_topic=output, group=self.group
        )
        self.sink.start()

    def announce(self) -> None:
        o, spec = self.opts, self.session.spec
        self.session.folder.step(
            f"start {spec.workers} worker(s) running {spec.handler} in group {self.group} on "
            f"{self.input_topic}: batch {o.batch_size}, offset store {o.offset_store}, commit {o.commit}, "
            f"db tx per {o.db_tx}"
        )

    def worker_specs(self) -> list[WorkerSpec]:
        spec = self.session.spec
        output = self.output_topic if spec.contract.expects_downstream else None
        return [
            worker_spec(
                self.session.folder.path,
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
        return not self.transport.probe.backlog(self.group, self.input_topic)


@dataclass
class GroupCommitted:
    """How quiescence settles on a consumer group: the group committed all input, the sink caught up."""

    session: SessionView
    place: Topics

    def all_out(self, pool: WorkerPool, deadline: float) -> None:
        pool.wait_serving(deadline)  # a replaced consumer may still get records back
        # A worker killed after its output but before its offset commit gets the records back,
        # and its skip commits them.
        poll_until(self.place.consumed, deadline=deadline, every_s=COMMITTED_POLL_S)

    def nothing_more(self, sink: KafkaSink, pool: WorkerPool) -> Callable[[int, int], bool]:
        """Return the probe: the group has committed all input, the sink has read its topics to
        their end since, and nothing came out for ``settle_s`` (a lost operation never comes out).

        The quiet time counts from when the commit was first seen: with the auto offset store a
        commit covers records whose output is still to come.
        """
        settle = max(self.session.spec.settle_s, COMMITTED_POLL_S)
        next_check = 0.0
        consumed_at: float | None = None

        def probe(done: int, missing: int) -> bool:
            nonlocal next_check, consumed_at
            now = time.monotonic()
            if consumed_at is None and now >= next_check:
                next_check = now + COMMITTED_POLL_S
                if self.place.consumed():
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
                self.session.progress(f"input consumed and committed; {missing} operation(s) never came out")
                return True
            return False

        return probe

    def after_out(self, deadline: float) -> None:
        return None


def group_residue(session: SessionView, place: Topics) -> Book:
    """Return the book of the input records past the group's committed offsets."""
    return GroupBacklog(place.transport.probe, place.group, place.input_topic, session.ledger, session.folder)


def topic_books(session: SessionView, place: Topics) -> tuple[Book, ...]:
    """The group's backlog, the sink's last reads, then the effect table."""
    return (group_residue(session, place), SinkStopped(place), effect_book(session))


def kafka_flow(name: str, summary: str, **kw: Any) -> Flow:
    """Return a flow of Kafka stages: their crash points and actions; no chain, helpers or outbox."""
    kw.setdefault("parse", KafkaStageOptions.from_options)
    return Flow(
        name,
        "kafka",
        summary,
        points=KAFKA_POINTS,
        actions=KAFKA_ACTIONS,
        accepts=frozenset({"poison", "workers"}),
        refusal="the Kafka run has one consumer stage so far: leave those out",
        label="Kafka",
        **kw,
    )


TOPIC_PARTS = Parts(Topics, Messages, all_out(GroupCommitted), topic_books)
FLOW = register(kafka_flow("kafka", "one consumer-group stage on topics", parts=TOPIC_PARTS))
