"""Readiness, topic admin and offsets: what the stack, the resets and the runners ask the broker."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness.errors import HarnessError

PROBE_GROUP = "txchaos-probe"  # the group of the consumer that reads watermarks (it joins none)


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


def topic_partitions(client: AdminClient | Consumer, topics: list[str], timeout: float = 5.0) -> dict[str, list[int]]:
    """Return topic -> its partition numbers, from one metadata request on ``client`` (a topic that
    does not exist is left out)."""
    # Ask for every topic: a metadata request naming one that does not exist makes a broker with
    # auto.create.topics.enable (ours, as Kafka's default) create it.
    meta = client.list_topics(timeout=timeout).topics
    found = {t: meta.get(t) for t in topics}
    return {t: sorted(m.partitions) for t, m in found.items() if m is not None and m.error is None}


class OffsetProbe:
    """The broker's answers on topics and group offsets, from clients kept open between questions.

    A new client pays a connection and a first metadata round before its question (about 50 ms
    each); quiescence asks for a group's backlog every quarter second, and each answer opened five
    such clients (three admin clients, two consumers). A run keeps one probe
    (``KafkaTransport.probe``) and asks it again and again.

    >>> with OffsetProbe(bootstrap) as probe:
    ...     probe.backlog("txchaos.r1.group", "txchaos.r1.in")
    {}
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin: AdminClient | None = None
        self._consumers: dict[str, Consumer] = {}  # group -> a consumer that never subscribes

    def __enter__(self) -> OffsetProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _consumer(self, group: str) -> Consumer:
        # A consumer that never subscribes does not join its group: it only asks the coordinator.
        found = self._consumers.get(group)
        if found is None:
            # log_level 2: a probe asks while a broker restarts too; its refusals are expected.
            config = {
                "bootstrap.servers": self.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "log_level": 2,
            }
            found = self._consumers[group] = Consumer(config)
        return found

    def partitions(self, topic: str, timeout: float = 5.0) -> list[int]:
        """Return the partition numbers of ``topic`` (empty when it does not exist)."""
        if self._admin is None:
            self._admin = admin(self.bootstrap)
        return topic_partitions(self._admin, [topic], timeout).get(topic, [])

    def watermarks(
        self, topic: str, timeout: float = 5.0, parts: list[int] | None = None
    ) -> dict[int, tuple[int, int]]:
        """Return partition -> (low, high): the first offset still stored, and the next one to be written."""
        try:
            probe = self._consumer(PROBE_GROUP)
            chosen = self.partitions(topic) if parts is None else parts
            return {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout) for p in chosen}
        except KafkaException as exc:
            raise HarnessError(f"reading the watermarks of {topic} failed: {exc}") from exc

    def end_offsets(self, topic: str, timeout: float = 5.0, parts: list[int] | None = None) -> dict[int, int]:
        """Return partition -> high watermark (the offset the next record will get)."""
        return {p: high for p, (_low, high) in self.watermarks(topic, timeout, parts).items()}

    def committed(
        self, group: str, topic: str, timeout: float = 10.0, parts: list[int] | None = None
    ) -> dict[int, int | None]:
        """Return partition -> ``group``'s committed offset (None: the group never committed one)."""
        try:
            chosen = self.partitions(topic) if parts is None else parts
            asked = [TopicPartition(topic, p) for p in chosen]
            found = self._consumer(group).committed(asked, timeout=timeout) if asked else []
        except KafkaException as exc:
            raise HarnessError(f"reading the committed offsets of group {group} failed: {exc}") from exc
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}

    def backlog(self, group: str, topic: str) -> dict[int, tuple[int, int]]:
        """Return partition -> (first, end): the records of ``topic`` past ``group``'s committed offset.

        Only partitions with something left appear, so an empty answer means the group has committed
        every record (a group that never committed starts at 0). Under transactions ``end`` may be one
        past the last record (a commit marker takes an offset too).
        """
        parts = self.partitions(topic)
        committed = self.committed(group, topic, parts=parts)
        first = {p: committed.get(p) or 0 for p in parts}
        ends = self.end_offsets(topic, parts=parts)
        return {p: (first[p], end) for p, end in ends.items() if first[p] < end}

    def close(self) -> None:
        """Close the consumers (the admin client has nothing to close)."""
        consumers, self._consumers, self._admin = self._consumers, {}, None
        for consumer in consumers.values():
            consumer.close()


def partitions_of(bootstrap: str, topic: str, timeout: float = 5.0) -> list[int]:
    """Return the partition numbers of ``topic`` (empty when it does not exist)."""
    with OffsetProbe(bootstrap) as probe:
        return probe.partitions(topic, timeout)


def watermarks(bootstrap: str, topic: str, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """Return partition -> (low, high): the first offset still stored, and the next one to be written."""
    with OffsetProbe(bootstrap) as probe:
        return probe.watermarks(topic, timeout)


def end_offsets(bootstrap: str, topic: str, timeout: float = 5.0) -> dict[int, int]:
    """Return partition -> high watermark (the offset the next record will get)."""
    with OffsetProbe(bootstrap) as probe:
        return probe.end_offsets(topic, timeout)


def committed_offsets(bootstrap: str, group: str, topic: str, timeout: float = 10.0) -> dict[int, int | None]:
    """Return partition -> the group's committed offset (None: the group never committed one)."""
    with OffsetProbe(bootstrap) as probe:
        return probe.committed(group, topic, timeout)


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


def backlog(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """Return ``OffsetProbe.backlog`` from a probe opened for this one question."""
    with OffsetProbe(bootstrap) as probe:
        return probe.backlog(group, topic)
