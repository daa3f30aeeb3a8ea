"""Group-less reading: the sink's and the residue's view of a topic, and small helpers for tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from harness.clients.kafka.admin import end_offsets, topic_partitions, watermarks
from harness.clients.kafka.group import SESSION_TIMEOUT_MS, OutputProducer
from harness.clients.kafka.records import TP, Record, check, to_record
from harness.errors import HarnessError


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
                "log_level": 2,  # a reader rides out a broker or proxy down; refusals are expected
                # caught_up()'s watermark queries wait behind a pending fetch, which the broker may
                # hold this long (the default 500 ms made each question 1.5 s on 3 partitions)
                "fetch.wait.max.ms": 50,
            }
        )
        start = start or {}
        try:  # the reader's own client asks: no admin client opened for one question
            found = topic_partitions(self._consumer, topics)
        except KafkaException as exc:
            self._consumer.close()
            raise HarnessError(f"reading the partitions of {topics} failed: {exc}") from exc
        parts = [
            TopicPartition(t, p, start.get((t, p), -2))  # -2: the beginning of the partition
            for t in topics
            for p in found.get(t, [])
        ]
        if not parts:
            self._consumer.close()
            raise HarnessError(f"no partitions found for {topics}", hint="create the topics before reading them")
        self._consumer.assign(parts)
        self._parts = [TopicPartition(tp.topic, tp.partition) for tp in parts]

    def poll(self, max_records: int = 500, timeout: float = 0.1) -> list[Record]:
        try:
            msgs = self._consumer.consume(max_records, timeout)
        except KafkaException as exc:
            raise HarnessError(f"Kafka read failed: {exc}") from exc
        return [to_record(m) for m in msgs if check(m)]

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


# A partition read up to one before its end offset: after this long, the end is a commit marker.
MARKER_GRACE_S = 0.3


def read_visible(bootstrap: str, topic: str, timeout_s: float = 3.0) -> list[Record]:
    """Return the committed records of ``topic`` (read_committed: an aborted dead letter is no record).

    A transaction's commit marker takes an offset too, so the end offset may be one past the
    last record: a partition is read once its last offset came, or ``MARKER_GRACE_S`` after the
    one before it (the last is then a marker), or at the timeout (only aborted records).
    """
    ends = {p: e for p, e in end_offsets(bootstrap, topic).items() if e > 0}
    if not ends:
        return []
    reader = TopicReader(bootstrap, [topic], client_id="txchaos-visible")
    out: list[Record] = []
    near: dict[int, float] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for rec in reader.poll(500, 0.1):
                out.append(rec)
                end = ends.get(rec.partition, 0)
                if rec.offset >= end - 1:
                    ends.pop(rec.partition, None)
                elif rec.offset == end - 2:
                    near[rec.partition] = time.monotonic()
            for p, since in list(near.items()):
                if time.monotonic() - since >= MARKER_GRACE_S:
                    ends.pop(p, None)
                    del near[p]
    finally:
        reader.close()
    return out
