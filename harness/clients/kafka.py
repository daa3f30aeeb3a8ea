"""The only module importing the Kafka client (confluent-kafka / librdkafka).

The foundation needs readiness, a produce/consume round trip and purging between tests; the
Kafka row builds consumers with manual offset storage and transactional producers here too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
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


def create_topics(bootstrap: str, names: Iterable[str], *, partitions: int = 3) -> None:
    client = admin(bootstrap)  # keep it referenced: a collected client cancels its futures
    futures = client.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names], operation_timeout=10
    )
    for name, fut in futures.items():
        try:
            fut.result(timeout=15)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise HarnessError(f"creating topic {name} failed: {exc}") from exc


def produce(bootstrap: str, topic: str, values: Iterable[tuple[str, str]], *, timeout: float = 10.0) -> int:
    """Produce (key, value) pairs with acks=all; returns how many were acknowledged."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": int(timeout * 1000),
        }
    )
    acked: list[int] = []
    for key, value in values:
        producer.produce(
            topic, value=value.encode(), key=key.encode(), on_delivery=lambda err, _msg: acked.append(0 if err else 1)
        )
    remaining = producer.flush(timeout)
    if remaining:
        raise HarnessError(f"{remaining} Kafka messages to {topic} not acknowledged in {timeout}s")
    return sum(acked)


def consume_all(bootstrap: str, topic: str, *, expect: int, timeout: float = 15.0) -> list[tuple[str, str]]:
    """Read ``topic`` from the beginning with a throwaway group until ``expect`` records or timeout."""
    import time

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txchaos-read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
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
