"""The Kafka row's pure parts: options, spec checks, group metadata, record ids, redelivery marks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from harness import Crash
from harness.clients.kafka import GroupMember, Record, dlt_name, parse_group_metadata
from harness.clients.kafka.records import check
from harness.errors import HarnessError
from harness.worker.high_water import HighWater
from harness.worker.kafka_context import op_of
from harness.worker.kafka_options import KAFKA_POINTS, KafkaStageOptions
from tests.support import KAFKA, make_spec, refused


def test_options_default_to_the_at_least_once_discipline() -> None:
    o = KafkaStageOptions.from_options({"table": "ignored: a handler option", "batch_size": 5})
    assert (o.batch_size, o.offset_store, o.commit, o.db_tx, o.batch_errors) == (
        5,
        "manual",
        "batch",
        "record",
        "isolate",
    )
    assert (o.session_timeout_ms, o.heartbeat_ms, o.static_membership) == (6000, 1000, False)


@pytest.mark.parametrize(
    ("options", "named", "fix"),
    [
        ({"offset_store": "later"}, "offset_store='later'", "manual, auto"),
        ({"commit": "never"}, "commit='never'", "batch, record, timer, transaction"),
        ({"db_tx": "none"}, "db_tx='none'", "record, batch"),
        ({"batch_errors": "skip"}, "batch_errors='skip'", "isolate, retry_batch, index"),
        ({"batch_size": 0}, "batch_size=0", "from 1 to 10000"),
        ({"batch_size": True}, "batch_size=True", "whole number"),
        ({"session_timeout_ms": 500}, "session_timeout_ms=500", "from 1000"),
        ({"heartbeat_ms": 3000}, "heartbeat_ms=3000", "a third of the session timeout"),
        ({"commit": "transaction", "offset_store": "auto"}, "commit='transaction'", "leave offset_store"),
    ],
)
def test_bad_options_name_value_and_fix(options: dict[str, object], named: str, fix: str) -> None:
    refused(lambda: KafkaStageOptions.from_options(options), named, fix)


@pytest.mark.parametrize(
    ("kw", "named", "fix"),
    [
        ({"flow": "rabbitmq"}, "rabbitmq", "'activemq' or 'kafka'"),
        ({"crashes": (Crash("after_broker_commit", op_index=1),)}, "after_broker_commit", "before_offset_commit"),
        ({"crashes": (Crash("after_poll", op_index=1, action="nack"),)}, "nack", "kill, disconnect"),
        ({"options": {"commit": "sometimes"}}, "commit='sometimes'", "batch"),
        ({"outbox_table": "outbox"}, "outbox_table", "one consumer stage"),
    ],
)
def test_kafka_spec_checks_points_actions_and_options(kw: dict[str, object], named: str, fix: str) -> None:
    refused(lambda: make_spec(KAFKA, **kw), named, fix)


def test_kafka_spec_accepts_every_kafka_point() -> None:
    crashes = tuple(Crash(p, op_index=i) for i, p in enumerate(KAFKA_POINTS))
    assert make_spec(KAFKA, crashes=crashes).crashes == crashes
    # An ActiveMQ stage has no poll.
    refused(lambda: make_spec(crashes=(Crash("after_poll", op_index=1),)), "after_poll")


def test_group_metadata_yields_member_and_generation() -> None:
    # What librdkafka 2.x wrote for a member of group "g-1" in generation 7 (host order: little).
    blob = b"CGMDv2:" + (7).to_bytes(4, "little") + b"g-1\0rdkafka-5e0c-8729\0\x01"
    assert parse_group_metadata(blob) == GroupMember("rdkafka-5e0c-8729", 7)
    assert parse_group_metadata(b"something else") is None
    assert parse_group_metadata(b"CGMDv2:\x01") is None


class _Errored:
    """What ``consume`` hands back for an error: a message whose ``error()`` is set."""

    def __init__(self, err: KafkaError) -> None:
        self._err = err

    def error(self) -> KafkaError:
        return self._err


FENCED = "Fatal error: Broker: Static consumer fenced by other consumer with same group.instance.id"


@pytest.mark.parametrize(
    "err",
    [
        # as librdkafka 2.x hands a fenced static member to confluent-kafka: _FATAL, fatal() False
        KafkaError(KafkaError._FATAL, FENCED, fatal=False),
        KafkaError(KafkaError.FENCED_INSTANCE_ID, FENCED, fatal=True),
    ],
)
def test_a_fenced_consumer_ends_the_worker(err: KafkaError) -> None:
    # A saga soak under broker restarts left its payment worker polling a fenced consumer for two
    # minutes: the error was taken for a passing one, the worker never exited to be restarted.
    with pytest.raises(HarnessError, match="Static consumer fenced"):
        check(_Errored(err))  # type: ignore[arg-type]


def test_a_passing_consumer_error_is_not_a_crash() -> None:
    for code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._PARTITION_EOF):
        assert check(_Errored(KafkaError(code, "broker down"))) is False  # type: ignore[arg-type]


def test_record_ids_and_dead_letter_topic() -> None:
    rec = Record("orders", 2, 41, "op-1", b'{"op": "op-1"}')
    assert rec.coord == "orders/2@41"
    assert rec.tp == ("orders", 2)
    assert dlt_name("orders") == "orders-dlt"
    assert op_of(rec) == "op-1"
    assert op_of(Record("orders", 0, 3, None, json.dumps({"op": "op-9"}).encode())) == "op-9"
    assert op_of(Record("orders", 0, 3, None, b"not json")) == "orders/0@3"


def test_high_water_marks_tell_redeliveries(tmp_path: Path) -> None:
    marks = HighWater(tmp_path / "kafka-high")
    assert marks.mark(("t", 0), 4) == -1  # offsets 0-4 handed out for the first time
    assert marks.mark(("t", 0), 9) == 4  # 5-9: new
    assert marks.mark(("t", 0), 9) == 9  # 5-9 again (after a crash): every offset <= 9 is a redelivery
    assert marks.mark(("t", 1), 0) == -1  # partitions are apart
    assert HighWater(tmp_path / "kafka-high").mark(("t", 0), 3) == 9  # shared with a restarted worker


def test_a_mark_that_is_not_a_number_counts_as_none_and_is_replaced(tmp_path: Path) -> None:
    marks = HighWater(tmp_path / "kafka-high")
    (tmp_path / "kafka-high" / "t.0").write_text("")  # a mark file left empty
    assert marks.mark(("t", 0), 4) == -1
    assert (tmp_path / "kafka-high" / "t.0").read_text() == "4"
    assert [p.name for p in (tmp_path / "kafka-high").iterdir()] == ["t.0"]  # nothing left aside
