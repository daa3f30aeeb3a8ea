"""The only module importing the Kafka client (confluent-kafka / librdkafka).

Besides readiness, topic admin and purging between tests, it holds what the Kafka row's
consumers are made of: ``GroupConsumer`` (a consumer-group member whose offsets are stored and
committed by hand, or by librdkafka's defaults for the bad pattern), ``OutputProducer`` (an
idempotent producer, or a transactional one that commits consumed offsets with
``send_offsets_to_transaction``) and ``TopicReader`` (a group-less ``read_committed`` reader for
the sink and the residue). Callers see ``Record`` and plain tuples, never a client type.

Every client talks to the address it is given, which is the Toxiproxy proxy: the broker
advertises the proxy, so a fault on it reaches the data path after metadata too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness.errors import ConfigError, HarnessError

DLT_SUFFIX = "-dlt"
# A crashed member's partitions move after its session times out; the broker's
# group.min.session.timeout.ms (fixtures/kafka/server.properties) allows down to 1 s.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000

TP = tuple[str, int]  # (topic, partition)
OffsetStore = Literal["manual", "auto"]
RebalanceListener = Callable[[str, list[TP]], None]  # ("assign" | "revoke" | "lost", partitions)


def dlt_name(topic: str) -> str:
    """Return the dead-letter topic of ``topic`` (the Spring convention: suffix ``-dlt``)."""
    return topic + DLT_SUFFIX


def admin(bootstrap: str) -> AdminClient:
    # log_level 2: readiness probes hit a broker that is still starting; its refusals are expected.
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000, "log_level": 2})


def broker_ready(bootstrap: str, timeout: float = 2.0) -> bool:
    """Return True when the broker answers a metadata request with at least one broker."""
    try:
        meta = admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(meta.brokers)


def advertised(bootstrap: str, timeout: float = 5.0) -> list[str]:
    """Return the broker addresses the cluster advertises (what clients connect to after metadata)."""
    meta = admin(bootstrap).list_topics(timeout=timeout)
    return [f"{b.host}:{b.port}" for b in meta.brokers.values()]


# -- topic admin ---------------------------------------------------------------------------------
def create_topics(bootstrap: str, names: Iterable[str], *, partitions: int = 3) -> None:
    """Create ``names`` (an existing topic is fine) and wait until the broker has them."""
    client = admin(bootstrap)  # keep it referenced: a collected client cancels its futures
    futures = client.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in dict.fromkeys(names)],
        operation_timeout=10,
    )
    for name, fut in futures.items():
        try:
            fut.result(timeout=15)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise HarnessError(f"creating topic {name} failed: {exc}") from exc


def delete_topics(bootstrap: str, names: Iterable[str]) -> None:
    """Delete ``names``; a topic that is already gone is not an error (cleanup must be idempotent)."""
    names = list(names)
    if not names:
        return
    client = admin(bootstrap)
    for name, fut in client.delete_topics(names, operation_timeout=10).items():
        try:
            fut.result(timeout=15)
        except KafkaException as exc:
            if "UNKNOWN_TOPIC" not in str(exc):
                raise HarnessError(f"deleting topic {name} failed: {exc}") from exc


def partitions_of(bootstrap: str, topic: str, timeout: float = 5.0) -> list[int]:
    """Return the partition numbers of ``topic`` (empty when it does not exist)."""
    # Ask for every topic: a metadata request naming one that does not exist makes a broker with
    # auto.create.topics.enable (ours, as Kafka's default) create it.
    found = admin(bootstrap).list_topics(timeout=timeout).topics.get(topic)
    if found is None or found.error is not None:
        return []
    return sorted(found.partitions)


def watermarks(bootstrap: str, topic: str, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """Return partition -> (low, high): the first offset still stored, and the next one to be written."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "txchaos-probe", "enable.auto.commit": False})
    try:
        return {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            for p in partitions_of(bootstrap, topic)
        }
    except KafkaException as exc:
        raise HarnessError(f"reading the watermarks of {topic} failed: {exc}") from exc
    finally:
        probe.close()


def end_offsets(bootstrap: str, topic: str, timeout: float = 5.0) -> dict[int, int]:
    """Return partition -> high watermark (the offset the next record will get)."""
    return {p: high for p, (_low, high) in watermarks(bootstrap, topic, timeout).items()}


def committed_offsets(bootstrap: str, group: str, topic: str, timeout: float = 10.0) -> dict[int, int | None]:
    """Return partition -> the group's committed offset (None: the group never committed one)."""
    # A consumer that never subscribes does not join the group: it only asks the coordinator.
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in partitions_of(bootstrap, topic)]
        found = probe.committed(parts, timeout=timeout) if parts else []
    except KafkaException as exc:
        raise HarnessError(f"reading the committed offsets of group {group} failed: {exc}") from exc
    finally:
        probe.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}


def purge_topics(bootstrap: str, names: Iterable[str]) -> None:
    """Delete every record of each topic (records before the high watermark), keeping the topics."""
    names = list(names)
    if not names:
        return
    client = admin(bootstrap)
    meta = client.list_topics(timeout=5)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "txchaos-purge"})
    try:
        targets = []
        for name in names:
            topic = meta.topics.get(name)
            if topic is None:
                continue
            for pid in topic.partitions:
                _low, high = probe.get_watermark_offsets(TopicPartition(name, pid), timeout=5)
                if high > 0:
                    targets.append(TopicPartition(name, pid, high))
    finally:
        probe.close()
    if targets:
        for fut in client.delete_records(targets, operation_timeout=10).values():
            fut.result(timeout=15)


# -- records -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """One consumed record, detached from the client."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def coord(self) -> str:
        """Return ``topic/partition@offset``: the record's id in the ledger's ``msg`` column."""
        return f"{self.topic}/{self.partition}@{self.offset}"

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


def _record(msg: Message) -> Record:
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    headers = {k: (v.decode(errors="replace") if isinstance(v, bytes) else str(v)) for k, v in pairs}
    key = msg.key()
    return Record(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=key.decode(errors="replace") if key is not None else None,
        value=msg.value() or b"",
        headers=headers,
    )


def _check(msg: Message) -> bool:
    """Return True for a data record; raise on an error the consumer cannot carry on from."""
    err = msg.error()
    if err is None:
        return True
    if err.code() == KafkaError._PARTITION_EOF:
        return False
    if err.fatal():
        raise HarnessError(f"Kafka consumer error: {err}", hint="read the worker log; the broker may be down")
    # Anything else (a broker or proxy down, a reconnect) librdkafka recovers from by itself: a
    # network fault must not look like a consumer crash.
    return False


@dataclass(frozen=True)
class GroupMember:
    """A consumer's identity in its group: which member, in which generation of the group."""

    member_id: str
    generation: int


def parse_group_metadata(blob: bytes) -> GroupMember | None:
    """Read member id and generation out of librdkafka's serialized consumer group metadata.

    The layout (``CGMDv2:``, int32 generation in host order, then NUL-terminated group id and
    member id) is librdkafka's ``rd_kafka_consumer_group_metadata_write``; Python exposes no
    other way to the generation. None when the blob is not in that layout.
    """
    magic = b"CGMDv2:"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return None
    generation = int.from_bytes(blob[len(magic) : len(magic) + 4], "little", signed=True)
    parts = blob[len(magic) + 4 :].split(b"\0")
    if len(parts) < 2:
        return None
    return GroupMember(parts[1].decode(errors="replace"), generation)


class GroupConsumer:
    """A member of consumer group ``group`` subscribed to ``topics``.

    ``offset_store="manual"`` sets ``enable.auto.offset.store=false``: nothing is committed
    before ``store(record)`` says the record is done. ``"auto"`` is librdkafka's default: the
    offset is stored when a record is handed to the application, before it is processed.
    ``auto_commit`` turns on librdkafka's commit timer (its default, every 5 s); otherwise
    ``commit()`` commits the stored offsets. ``read_committed`` hides aborted transactions.

    >>> c = GroupConsumer(ep.kafka.address, "orders", ["orders"])
    >>> for record in c.poll_batch(50, 0.5):
    ...     handle(record); c.store(record)
    >>> c.commit()
    """

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: list[str],
        *,
        offset_store: OffsetStore = "manual",
        auto_commit: bool = False,
        auto_commit_ms: int = 5000,
        read_committed: bool = True,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_ms: int = HEARTBEAT_MS,
        instance_id: str | None = None,
        client_id: str | None = None,
        on_rebalance: RebalanceListener | None = None,
        on_commit: Callable[[dict[TP, int]], None] | None = None,
    ) -> None:
        if offset_store not in ("manual", "auto"):
            raise ConfigError(f"offset_store={offset_store!r}", hint="use 'manual' or 'auto'")
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": offset_store == "auto",
            "enable.auto.commit": auto_commit,
            "auto.commit.interval.ms": auto_commit_ms,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_ms,
            "client.id": client_id or f"txchaos-{group}",
            "log_level": 3,
        }
        if instance_id:
            # Static membership: a restarted member with the same id takes its partitions back at
            # once, without waiting for the dead one's session to time out.
            config["group.instance.id"] = instance_id
        self._on_commit = on_commit
        if on_commit is not None:
            config["on_commit"] = self._committed_cb
        self._consumer = Consumer(config)
        self._listener = on_rebalance
        self.group = group
        try:
            self._consumer.subscribe(topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)
        except KafkaException as exc:
            raise HarnessError(f"subscribing group {group} to {topics} failed: {exc}") from exc

    # librdkafka calls these from inside poll/consume, on this thread.
    def _assigned(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        if self._listener:
            self._listener("assign", [(p.topic, p.partition) for p in parts])

    def _revoked(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        if self._listener:
            self._listener("revoke", [(p.topic, p.partition) for p in parts])

    def _lost(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        if self._listener:
            self._listener("lost", [(p.topic, p.partition) for p in parts])

    def _committed_cb(self, err: KafkaError | None, parts: list[TopicPartition]) -> None:
        if err is None and self._on_commit is not None:
            self._on_commit({(p.topic, p.partition): p.offset for p in parts if p.error is None and p.offset >= 0})

    def poll_batch(self, max_records: int, timeout: float) -> list[Record]:
        """Return up to ``max_records`` records (fewer once ``timeout`` seconds pass)."""
        try:
            msgs = self._consumer.consume(max_records, timeout)
        except KafkaException as exc:
            raise HarnessError(f"Kafka consume failed: {exc}") from exc
        return [_record(m) for m in msgs if _check(m)]

    def store(self, record: Record) -> None:
        """Mark ``record`` done: the next commit covers it (manual offset store)."""
        self.store_offsets({record.tp: record.offset + 1})

    def store_offsets(self, offsets: dict[TP, int]) -> None:
        try:
            self._consumer.store_offsets(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        except KafkaException as exc:
            # A partition revoked since its records were handed out: its next owner redoes them.
            if exc.args[0].code() != KafkaError._STATE:
                raise HarnessError(f"storing offsets {offsets} failed: {exc}") from exc

    def commit(self) -> dict[TP, int]:
        """Commit the stored offsets synchronously; returns what was committed (may be empty)."""
        try:
            parts = self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._NO_OFFSET:
                return {}
            raise HarnessError(f"committing offsets of group {self.group} failed: {exc}") from exc
        return {(p.topic, p.partition): p.offset for p in parts if p.error is None and p.offset >= 0}

    def member(self) -> GroupMember:
        """Return this consumer's member id and the group generation it last joined."""
        found = parse_group_metadata(bytes(self._consumer.consumer_group_metadata()))
        return found or GroupMember(self._consumer.memberid() or "", -1)

    def assignment(self) -> list[TP]:
        return [(p.topic, p.partition) for p in self._consumer.assignment()]

    def rewind(self) -> dict[TP, int]:
        """Seek every assigned partition back to the group's committed offset (a seek-back redelivery)."""
        parts = self._consumer.assignment()
        if not parts:
            return {}
        out: dict[TP, int] = {}
        for tp in self._consumer.committed(parts, timeout=10):
            # No committed offset yet: back to the start of the partition (auto.offset.reset).
            offset = tp.offset if tp.offset >= 0 else -2
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            out[(tp.topic, tp.partition)] = offset
        return out

    def close(self) -> None:
        """Leave the group (its partitions move at once) and close."""
        self._consumer.close()

    def _group_metadata(self) -> Any:
        return self._consumer.consumer_group_metadata()


class OutputProducer:
    """An idempotent producer (acks=all); with ``transactional_id``, a transactional one.

    Delivery errors are collected and raised by ``flush``. A transactional producer wraps each
    batch: ``begin()``, ``produce(...)``, ``send_offsets(offsets, consumer)``, ``commit()``. A
    restarted worker that uses the same ``transactional_id`` fences its dead predecessor and
    aborts whatever transaction it left open (``init_transactions``).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        transactional_id: str | None = None,
        linger_ms: int = 2,
        timeout_s: float = 15.0,
        client_id: str = "txchaos-producer",
    ) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "message.timeout.ms": int(timeout_s * 1000),
            "client.id": client_id,
            "log_level": 3,
        }
        if transactional_id:
            config["transactional.id"] = transactional_id
            config["transaction.timeout.ms"] = 30_000
        self.timeout_s = timeout_s
        self.transactional = transactional_id is not None
        self._producer = Producer(config)
        self._errors: list[str] = []
        self.acked = 0
        if transactional_id:
            self._call("init_transactions", lambda: self._producer.init_transactions(timeout_s))

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self._errors.append(str(err))

    def produce(
        self, topic: str, value: bytes | str | None, *, key: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        """Queue one record (``value=None``: a tombstone); ``flush`` (or a transaction commit) makes it durable."""
        hdrs: dict[str, str | bytes | None] | None = dict(headers) if headers else None
        for attempt in range(2):
            try:
                self._producer.produce(topic, value=value, key=key, headers=hdrs, on_delivery=self._delivered)
                break
            except BufferError:
                if attempt:
                    raise HarnessError(f"the producer queue to {topic} stays full") from None
                self._producer.poll(1.0)  # the local queue is full: let deliveries drain first
        self._producer.poll(0)

    def flush(self) -> None:
        """Wait until every queued record is acknowledged; raise if any failed."""
        remaining = self._producer.flush(self.timeout_s)
        if remaining or self._errors:
            errors, self._errors = self._errors, []
            raise HarnessError(
                f"{remaining} record(s) unacknowledged after {self.timeout_s}s; errors: {errors[:3]}",
                hint="the broker or its proxy is down or slow",
            )

    def _call(self, what: str, call: Callable[[], None]) -> None:
        try:
            call()
        except KafkaException as exc:
            raise HarnessError(f"Kafka {what} failed: {exc}") from exc

    def begin(self) -> None:
        self._call("begin_transaction", self._producer.begin_transaction)

    def send_offsets(self, offsets: dict[TP, int], consumer: GroupConsumer) -> None:
        """Add the consumer's ``offsets`` (next offset to read, per partition) to the transaction."""
        positions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        self._call(
            "send_offsets_to_transaction",
            lambda: self._producer.send_offsets_to_transaction(positions, consumer._group_metadata(), self.timeout_s),
        )

    def commit(self) -> None:
        self._call("commit_transaction", lambda: self._producer.commit_transaction(self.timeout_s))

    def abort(self) -> None:
        self._call("abort_transaction", lambda: self._producer.abort_transaction(self.timeout_s))

    def close(self) -> None:
        self._producer.flush(1.0)


class TopicReader:
    """Read every partition of ``topics`` from ``start`` offsets, outside any group (no commits).

    ``read_committed`` by default: records of aborted or still-open transactions stay hidden,
    which is what a downstream consumer of a transactional flow sees.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        *,
        start: dict[TP, int] | None = None,
        read_committed: bool = True,
        client_id: str = "txchaos-reader",
    ) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"txchaos-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed" if read_committed else "read_uncommitted",
                "enable.partition.eof": False,
                "client.id": client_id,
                "log_level": 3,
            }
        )
        start = start or {}
        parts = [
            TopicPartition(t, p, start.get((t, p), -2))  # -2: the beginning of the partition
            for t in topics
            for p in partitions_of(bootstrap, t)
        ]
        if not parts:
            raise HarnessError(f"no partitions found for {topics}", hint="create the topics before reading them")
        self._consumer.assign(parts)
        self._parts = [TopicPartition(tp.topic, tp.partition) for tp in parts]

    def poll(self, max_records: int = 500, timeout: float = 0.1) -> list[Record]:
        try:
            msgs = self._consumer.consume(max_records, timeout)
        except KafkaException as exc:
            raise HarnessError(f"Kafka read failed: {exc}") from exc
        return [_record(m) for m in msgs if _check(m)]

    def caught_up(self) -> bool:
        """Return whether every partition was read to its end as the broker sees it now.

        Under ``read_committed`` the end is the last stable offset: a transaction still open does
        not hold this back, and the reader's position moves past transaction markers and aborted
        records (measured on the pinned Kafka). Call it from the thread that polls.
        """
        try:
            for tp in self._consumer.position(self._parts):
                low, end = self._consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), cached=False)
                if (tp.offset if tp.offset >= 0 else low) < end:
                    return False
        except KafkaException as exc:
            raise HarnessError(f"Kafka position query failed: {exc}") from exc
        return True

    def close(self) -> None:
        self._consumer.close()


def read_range(
    bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int], *, timeout: float = 10.0
) -> list[Record]:
    """Return the records of ``topic`` from ``start`` (inclusive) to ``end`` (exclusive) per partition."""
    lows = {p: low for p, (low, _high) in watermarks(bootstrap, topic).items()}
    # Records below the low watermark were deleted (a purge): there is nothing to wait for there.
    firsts = {p: max(start.get(p, 0), lows.get(p, 0)) for p in end}
    want = {p: (firsts[p], e) for p, e in end.items() if e > firsts[p]}
    if not want:
        return []
    reader = TopicReader(bootstrap, [topic], start={(topic, p): s for p, (s, _) in want.items()}, read_committed=False)
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        pending = dict(want)
        while pending and time.monotonic() < deadline:
            for rec in reader.poll(500, 0.2):
                rng = pending.get(rec.partition)
                if rng is None or rec.offset >= rng[1]:
                    continue
                out.append(rec)
                if rec.offset >= rng[1] - 1:
                    del pending[rec.partition]
    finally:
        reader.close()
    if pending:
        raise HarnessError(f"reading {topic} {pending} did not finish in {timeout}s", hint="is the broker up?")
    return out


# -- small helpers for tests and the stack's own checks -------------------------------------------
def produce(bootstrap: str, topic: str, values: Iterable[tuple[str, str]], *, timeout: float = 10.0) -> int:
    """Produce (key, value) pairs with acks=all; returns how many were acknowledged."""
    producer = OutputProducer(bootstrap, timeout_s=timeout)
    for key, value in values:
        producer.produce(topic, value.encode(), key=key)
    producer.flush()
    return producer.acked


def consume_all(bootstrap: str, topic: str, *, expect: int, timeout: float = 15.0) -> list[tuple[str, str]]:
    """Read ``topic`` from the beginning with a throwaway group until ``expect`` records or timeout."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txchaos-read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
        }
    )
    out: list[tuple[str, str]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(out) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            out.append(((msg.key() or b"").decode(), (msg.value() or b"").decode()))
    finally:
        consumer.close()
    return out
