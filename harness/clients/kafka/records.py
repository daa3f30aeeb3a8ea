"""Records, partitions and group identities as plain values: what the rest of the harness sees of Kafka."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import KafkaError, Message

from harness.errors import HarnessError

DLT_SUFFIX = "-dlt"
TP = tuple[str, int]  # (topic, partition)
OffsetStore = Literal["manual", "auto"]
RebalanceListener = Callable[[str, list[TP]], None]  # ("assign" | "revoke" | "lost", partitions)


def dlt_name(topic: str) -> str:
    """Return the dead-letter topic of ``topic`` (the Spring convention: suffix ``-dlt``)."""
    return topic + DLT_SUFFIX


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and a record is made
# for every message a worker or the sink reads (2.3 us against 0.9). Nothing changes one.
@dataclass(slots=True)
class Record:
    """One consumed record, detached from the client."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)
    # ``topic/partition@offset``: the record's id in the ledger's ``msg`` column (made once: a
    # worker writes it in five events per record)
    coord: str = field(init=False, repr=False, compare=False)
    tp: TP = field(init=False, repr=False, compare=False)  # (topic, partition)

    def __post_init__(self) -> None:
        self.coord = f"{self.topic}/{self.partition}@{self.offset}"
        self.tp = (self.topic, self.partition)


def to_record(msg: Message) -> Record:
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


def check(msg: Message) -> bool:
    """Return True for a data record; raise on an error the consumer cannot carry on from."""
    err = msg.error()
    if err is None:
        return True
    if err.code() == KafkaError._PARTITION_EOF:
        return False
    # A static member fenced by another with its group.instance.id (a rejoin racing a broker
    # restart does it) comes as code _FATAL with fatal() False (confluent-kafka-python issue 869).
    # Taken for a passing error, it left a worker polling a dead consumer for the rest of a soak.
    if err.fatal() or err.code() == KafkaError._FATAL:
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
