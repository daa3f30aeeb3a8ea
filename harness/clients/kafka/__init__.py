"""The only package importing the Kafka client (confluent-kafka / librdkafka).

Besides readiness, topic admin, offsets and purging between tests (``admin``), it holds what the
Kafka row's consumers are made of (``group``): ``GroupConsumer`` (a consumer-group member whose
offsets are stored and committed by hand, or by librdkafka's defaults for the bad pattern) and
``OutputProducer`` (an idempotent producer, or a transactional one that commits consumed offsets
with ``send_offsets_to_transaction``); and ``TopicReader`` (``reader``: a group-less
``read_committed`` reader for the sink and the residue). Callers see ``Record`` and plain tuples
(``records``), never a client type.

Every client talks to the address it is given, which is the Toxiproxy proxy: the broker
advertises the proxy, so a fault on it reaches the data path after metadata too.
"""

from harness.clients.kafka.admin import (
    OffsetProbe,
    admin,
    advertised,
    backlog,
    broker_ready,
    committed_offsets,
    create_topics,
    delete_topics,
    end_offsets,
    partitions_of,
    purge_topics,
    watermarks,
)
from harness.clients.kafka.group import HEARTBEAT_MS, SESSION_TIMEOUT_MS, GroupConsumer, OutputProducer
from harness.clients.kafka.reader import TopicReader, consume_all, produce, read_range, read_visible
from harness.clients.kafka.records import (
    DLT_SUFFIX,
    TP,
    GroupMember,
    OffsetStore,
    RebalanceListener,
    Record,
    dlt_name,
    parse_group_metadata,
)

__all__ = [
    "DLT_SUFFIX",
    "HEARTBEAT_MS",
    "SESSION_TIMEOUT_MS",
    "TP",
    "GroupConsumer",
    "GroupMember",
    "OffsetProbe",
    "OffsetStore",
    "OutputProducer",
    "RebalanceListener",
    "Record",
    "TopicReader",
    "admin",
    "advertised",
    "backlog",
    "broker_ready",
    "committed_offsets",
    "consume_all",
    "create_topics",
    "delete_topics",
    "dlt_name",
    "end_offsets",
    "parse_group_metadata",
    "partitions_of",
    "produce",
    "purge_topics",
    "read_range",
    "read_visible",
    "watermarks",
]
