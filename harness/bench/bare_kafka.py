"""The Kafka bare loop: inbox-offset batch consumers with confluent_kafka and psycopg.

Each consumer process does per polled batch what the harness's Kafka stage
(``harness/worker/kafka_stage.py`` with ``db_tx="batch"`` running
``harness.patterns.kafka_consumer:inbox_offset_batch``) does: poll up to ``batch`` records; one
Postgres transaction (psycopg, autocommit off) with one multi-row INSERT (``unnest`` of arrays)
claiming the records' (topic, partition, offset) in the inbox, ``RETURNING`` the new ones, and
one multi-row INSERT of their effects; COMMIT; one output record per input produced (acks=all,
idempotent, linger 2 ms, the ``OutputProducer``'s settings) and flushed; then the offsets
committed synchronously. What it leaves out is the harness: no ledger, no crash points, no
high-water marks, no supervisor, no SQLAlchemy.

Partitions are assigned by hand (consumer ``i`` takes partitions ``i, i + consumers, ...``)
rather than through the group protocol, so no rebalance falls inside the measured time; offsets
are still committed to the group. A producer process produces the input while they consume. The
clock runs from its first record (every process starts at once, after all are connected) to the
last batch's offset commit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from harness.bench.bare_loop import BareResult, Crew, Hand, cleaned_up, pg_connect, pg_run, suffix
from harness.clients.kafka import admin, create_topics, delete_topics, end_offsets
from harness.clients.kafka.records import check
from harness.clients.pg_array import array_literal
from harness.errors import HarnessError
from harness.stack.base import Endpoints

FLUSH_S = 15.0  # the OutputProducer's delivery timeout
# The coordinator is moving or not up yet (a new stack's __consumer_offsets): ask again.
_COORDINATOR_BUSY = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
}


@dataclass(frozen=True)
class _Job:
    """What every process of one Kafka bare loop needs to know."""

    endpoints: Endpoints
    via_proxy: bool
    inbox: str
    effects: str
    topic_in: str
    topic_out: str
    group: str
    partitions: int
    consumers: int
    batch: int

    @property
    def bootstrap(self) -> str:
        ep = self.endpoints.kafka
        return ep.address if self.via_proxy else f"{ep.upstream_host}:{ep.upstream_port}"


class _Producer:
    """A producer with the ``OutputProducer``'s settings that keeps its failed deliveries for ``flush``."""

    def __init__(self, job: _Job, client_id: str) -> None:
        self.failed: list[str] = []
        self.producer = Producer(
            {
                "bootstrap.servers": job.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": int(FLUSH_S * 1000),
                "client.id": client_id,
                "log_level": 3,
            }
        )

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failed.append(str(err))

    def produce(self, topic: str, value: str, key: str, *, tagged: bool = False) -> None:
        """Queue one record; ``tagged`` adds the ``txchaos-op`` header (= ``key``) a stage's outputs carry."""
        headers: dict[str, str | bytes | None] | None = {"txchaos-op": key} if tagged else None
        while True:
            try:
                self.producer.produce(topic, value, key=key, headers=headers, on_delivery=self._delivered)
                break
            except BufferError:
                self.producer.poll(0.5)  # the local queue is full: let deliveries drain first
        self.producer.poll(0)

    def flush(self) -> None:
        """Wait until every queued record is acknowledged; raise if any is not."""
        remaining = self.producer.flush(FLUSH_S)
        if remaining or self.failed:
            raise HarnessError(f"{remaining} record(s) unacknowledged after {FLUSH_S} s; errors: {self.failed[:3]}")


def _find_coordinator(consumer: Consumer, parts: list[TopicPartition]) -> None:
    """Ask the group's committed offsets until its coordinator answers (NOT_COORDINATOR meanwhile)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            consumer.committed(parts, timeout=10)
            return
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _consumer(hand: Hand, job: _Job, index: int) -> None:
    """One consumer: the stage's batch work until told to stop; a ("batch", (n, t)) report per commit."""
    pg = pg_connect(job.endpoints, job.via_proxy)
    out = _Producer(job, f"bare-{hand.name}")
    config = {
        "bootstrap.servers": job.bootstrap,
        "group.id": job.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "client.id": f"bare-{hand.name}",
        "log_level": 3,
    }
    consumer = Consumer(config)
    claim = (
        f'INSERT INTO {job.inbox} (topic, part, "offset", op_id) '
        "SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::text[]) "
        'ON CONFLICT DO NOTHING RETURNING part, "offset"'
    )
    apply = (
        f'INSERT INTO {job.effects} (op_id, worker, amount, topic, part, "offset") '
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[], %s::int[], %s::bigint[])"
    )
    mine = [TopicPartition(job.topic_in, p) for p in range(index, job.partitions, job.consumers)]
    done, first = 0, 0.0
    try:
        # Connected means knowing the topic and the group's coordinator: on a new stack the first
        # group creates __consumer_offsets (about a second), a cost of the stack, not of a message.
        consumer.list_topics(job.topic_in, timeout=30)
        _find_coordinator(consumer, mine)
        if not hand.ready_then_go():
            return
        consumer.assign(mine)
        first = time.monotonic()
        while not hand.stop.is_set():
            records = [m for m in consumer.consume(job.batch, 0.2) if check(m)]
            if not records:
                continue
            ops = [(m.key() or b"").decode() for m in records]
            bodies = [json.loads(m.value() or b"{}") for m in records]
            parts = [m.partition() or 0 for m in records]
            offsets = [m.offset() or 0 for m in records]
            topics = [job.topic_in] * len(records)
            # Array literals, as the stage's batch handler passes them (harness.clients.pg_array).
            keys: tuple[list[str] | list[int], ...] = (topics, parts, offsets, ops)
            fresh = set(pg.execute(claim, tuple(array_literal(k) for k in keys)).fetchall())
            new = [i for i in range(len(records)) if (parts[i], offsets[i]) in fresh]
            columns: tuple[list[str] | list[int], ...] = (
                [ops[i] for i in new],
                [hand.name] * len(new),
                [int(bodies[i].get("amount", 1)) for i in new],
                [topics[i] for i in new],
                [parts[i] for i in new],
                [offsets[i] for i in new],
            )
            pg.execute(apply, tuple(array_literal(c) for c in columns))
            pg.commit()
            for op in ops:
                out.produce(job.topic_out, json.dumps({"op": op, "from": "bare"}), op, tagged=True)
            out.flush()  # outputs durable before the offsets move past their inputs
            upto: dict[int, int] = {}
            for p, o in zip(parts, offsets, strict=True):
                upto[p] = max(upto.get(p, 0), o + 1)
            consumer.commit(offsets=[TopicPartition(job.topic_in, p, o) for p, o in upto.items()], asynchronous=False)
            done += len(records)
            hand.report("batch", (len(records), time.monotonic()))
        hand.report("done", (done, first))
    finally:
        consumer.close()
        out.producer.flush(1.0)
        pg.close()


def _producer(hand: Hand, job: _Job, prefix: str, messages: int) -> None:
    """Produce ``messages`` records (key: the operation id) to the input topic from the start on,
    as the consumers consume; reports ("filled", first record's time) once all are acknowledged."""
    out = _Producer(job, f"bare-{hand.name}")
    if not hand.ready_then_go():
        return
    first = time.monotonic()
    for i in range(messages):
        out.produce(job.topic_in, json.dumps({"op": f"{prefix}-{i}", "amount": 1}), f"{prefix}-{i}")
    out.flush()
    hand.report("filled", first)
    hand.stop.wait()  # a process that ends early reads as a crash to the crew


def _tables(job: _Job) -> tuple[str, ...]:
    return (
        f'CREATE TABLE {job.inbox} (topic text NOT NULL, part integer NOT NULL, "offset" bigint NOT NULL, '
        'op_id text NOT NULL, PRIMARY KEY (topic, part, "offset"))',
        f"CREATE TABLE {job.effects} (id bigserial PRIMARY KEY, op_id text NOT NULL, worker text NOT NULL, "
        'amount integer NOT NULL, topic text NOT NULL, part integer NOT NULL, "offset" bigint NOT NULL, '
        "applied_at timestamptz NOT NULL DEFAULT now())",
        f"CREATE INDEX ON {job.effects} (op_id)",
    )


def _delete_group(job: _Job) -> None:
    """Delete the loop's consumer group (its committed offsets); a group that never committed is fine."""
    client = admin(job.bootstrap)  # keep it referenced: a collected client cancels its futures
    for attempt in range(10):
        try:
            client.delete_consumer_groups([job.group], request_timeout=10)[job.group].result(timeout=15)
            return
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return
            if code not in _COORDINATOR_BUSY or attempt == 9:
                raise
            time.sleep(0.5)


def _cleanup(job: _Job) -> None:
    """Delete the loop's topics and group, then drop its tables."""
    try:
        delete_topics(job.bootstrap, [job.topic_in, job.topic_out])
        _delete_group(job)
    finally:
        pg_run(job.endpoints, job.via_proxy, f"DROP TABLE IF EXISTS {job.inbox}", f"DROP TABLE IF EXISTS {job.effects}")


def bare_kafka(
    endpoints: Endpoints,
    *,
    messages: int = 200000,
    consumers: int = 1,
    partitions: int = 3,
    batch: int = 500,
    via_proxy: bool = True,
) -> BareResult:
    """Run ``consumers`` bare inbox-offset batch consumers over ``messages`` records; return the figure.

    A producer produces the records from the start, as the consumers consume them (a soak submits
    while its flow runs). The clock runs from the producer's first record to the last batch's
    offset commit; ``consume_seconds`` from the consumers' first poll, or from the first record when
    the consumers polled before the producer started (their idle wait is no consuming).

    Raises ``HarnessError`` unless every record left exactly one inbox row, one effect row and one output.
    """
    if min(messages, consumers, partitions, batch) < 1:
        raise ValueError(f"messages={messages}, consumers={consumers}, partitions={partitions}, batch={batch}: >= 1")
    tag = suffix()
    job = _Job(
        endpoints,
        via_proxy,
        f"bare_inbox_{tag}",
        f"bare_effects_{tag}",
        f"txchaos.bare.{tag}.in",
        f"txchaos.bare.{tag}.out",
        f"txchaos.bare.{tag}",
        partitions,
        consumers,
        batch,
    )
    names = [f"c{i}" for i in range(consumers)]
    with cleaned_up(lambda: _cleanup(job)):
        pg_run(endpoints, via_proxy, *_tables(job))
        create_topics(job.bootstrap, [job.topic_in], partitions=partitions)
        create_topics(job.bootstrap, [job.topic_out], partitions=partitions)
        deadline = time.monotonic() + 120 + messages / 500
        with Crew() as crew:
            crew.spawn("producer", _producer, job, f"bare-{tag}", messages)
            for i, name in enumerate(names):
                crew.spawn(name, _consumer, job, i)
            crew.start_all(deadline)
            committed, last, submitted = 0, 0.0, 0.0
            while committed < messages or not submitted:
                kind, _, payload = crew.next(deadline)
                if kind == "batch":
                    committed += payload[0]
                    last = max(last, payload[1])
                elif kind == "filled":
                    submitted = payload
            crew.stop.set()
            done: dict[str, Any] = crew.collect("done", names, deadline)
            roles = crew.roles(names)
        first = max(submitted, min(f for _, f in done.values()))
        inbox, effects, distinct = pg_run(
            endpoints,
            via_proxy,
            f"SELECT (SELECT count(*) FROM {job.inbox}), count(*), count(DISTINCT op_id) FROM {job.effects}",
        )[0]
        outputs = sum(end_offsets(job.bootstrap, job.topic_out).values())
        if not (inbox == effects == distinct == outputs == committed == messages):
            raise HarnessError(
                f"Kafka bare loop lost or doubled records: {messages} produced, {committed} committed, "
                f"{inbox} inbox rows, {effects} effect rows ({distinct} ops), {outputs} outputs"
            )
    return BareResult("kafka", messages, last - submitted, consumers, via_proxy, effects, last - first, roles=roles)
