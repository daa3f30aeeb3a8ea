"""A consumer-group member and an output producer: what the Kafka row's stage workers are made of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from harness.clients.kafka.hung import CallWatch, end_process
from harness.clients.kafka.records import (
    TP,
    GroupMember,
    OffsetStore,
    RebalanceListener,
    Record,
    check,
    parse_group_metadata,
    to_record,
)
from harness.errors import ConfigError, HarnessError

# A crashed member's partitions move after its session times out; the broker's
# group.min.session.timeout.ms (fixtures/kafka/server.properties) allows down to 1 s.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000
# librdkafka doubles its wait between reconnects up to 10 s by default: a broker back after a
# 5 s restart was then found up to 10 s late by every client. 1 s keeps the doubling, capped.
RECONNECT_BACKOFF_MAX_MS = 1000


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
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
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
        return [to_record(m) for m in msgs if check(m)]

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


SERVE_EVERY = 64  # records produced between two servings of the delivery reports (``poll(0)``)


class OutputProducer:
    """An idempotent producer (acks=all); with ``transactional_id``, a transactional one.

    Delivery errors are collected and raised by ``flush``. A transactional producer wraps each
    batch: ``begin()``, ``produce(...)``, ``send_offsets(offsets, consumer)``, ``commit()``. A
    restarted worker that uses the same ``transactional_id`` fences its dead predecessor and
    aborts whatever transaction it left open (``init_transactions``). A transaction call still
    blocked well past ``timeout_s`` calls ``on_hung`` (by default: end the process; ``hung.py``).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        transactional_id: str | None = None,
        linger_ms: int = 2,
        timeout_s: float = 15.0,
        client_id: str = "txchaos-producer",
        log_level: int = 3,
        on_hung: Callable[[str], None] = end_process,
    ) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "message.timeout.ms": int(timeout_s * 1000),
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
            "client.id": client_id,
            "log_level": log_level,
        }
        if transactional_id:
            config["transactional.id"] = transactional_id
            config["transaction.timeout.ms"] = 30_000
        self.timeout_s = timeout_s
        self.transactional = transactional_id is not None
        self._producer = Producer(config)
        self._errors: list[str] = []
        self.acked = 0
        self._queued = 0
        self._on_delivery = self._delivered  # bound once, not a method object a record
        # The transaction calls, each bounded at timeout_s, that librdkafka may leave blocked past it.
        self._watch = CallWatch(timeout_s, on_hung) if transactional_id else None
        if transactional_id:
            self._call("init_transactions", lambda: self._producer.init_transactions(timeout_s))

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self._errors.append(str(err))

    def produce(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: str | None = None,
        headers: dict[str, str | bytes | None] | None = None,
    ) -> None:
        """Queue one record (``value=None``: a tombstone); ``flush`` (or a transaction commit) makes it durable."""
        for attempt in range(2):
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=self._on_delivery)
                break
            except BufferError:
                if attempt:
                    raise HarnessError(f"the producer queue to {topic} stays full") from None
                self._producer.poll(1.0)  # the local queue is full: let deliveries drain first
        self._queued += 1
        if self._queued % SERVE_EVERY == 0:  # delivery reports served as they come, not a call a record
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
            if self._watch is None:
                call()
            else:
                self._watch.run(what, call)
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
        if self._watch is not None:
            self._watch.close()
        self._producer.flush(1.0)
