"""Readiness, topic admin and offsets: what the stack, the resets and the runners ask the broker."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness.errors import HarnessError


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


def backlog(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """Return partition -> (first, end): the records of ``topic`` past ``group``'s committed offset.

    Only partitions with something left appear, so an empty answer means the group has committed
    every record (a group that never committed starts at 0). Under transactions ``end`` may be one
    past the last record (a commit marker takes an offset too).
    """
    committed = committed_offsets(bootstrap, group, topic)
    first = {p: committed.get(p) or 0 for p in partitions_of(bootstrap, topic)}
    return {p: (first.get(p, 0), end) for p, end in end_offsets(bootstrap, topic).items() if first.get(p, 0) < end}
