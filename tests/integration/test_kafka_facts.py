"""BROKER_FACTS.md's Kafka section, proven on the pinned Kafka 4.1 through its Toxiproxy proxy.

Every client here is the harness's own adapter (``harness.clients.kafka``), so these tests also
pin down what the Kafka stage runtime relies on: which offsets a commit covers under each offset
store, how fast a dead member's partitions move, and what a transaction hides.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from harness.clients import kafka
from harness.clients.kafka import GroupConsumer, OutputProducer, TopicReader
from harness.stack.base import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _topic(ep: Endpoints, records: int = 10, partitions: int = 1) -> str:
    name = f"txchaos.facts.{uuid.uuid4().hex[:8]}"
    kafka.create_topics(ep.kafka.address, [name], partitions=partitions)
    if records:
        kafka.produce(ep.kafka.address, name, [(f"op-{i}", f'{{"op": "op-{i}"}}') for i in range(records)])
    return name


def _poll(consumer: GroupConsumer, want: int, timeout: float = 20.0) -> list[kafka.Record]:
    out: list[kafka.Record] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += consumer.poll_batch(want - len(out), 0.2)
    return out


def _read(ep: Endpoints, topic: str, *, read_committed: bool, settle: float = 1.5) -> list[str]:
    reader = TopicReader(ep.kafka.address, [topic], read_committed=read_committed)
    keys: list[str] = []
    deadline = time.monotonic() + settle
    try:
        while time.monotonic() < deadline:
            keys += [r.key or "" for r in reader.poll(500, 0.1)]
    finally:
        reader.close()
    return keys


def test_auto_offset_store_commits_records_not_yet_processed(txchaos_stack: Endpoints) -> None:
    bs, topic, group = txchaos_stack.kafka.address, _topic(txchaos_stack), f"g-{uuid.uuid4().hex[:8]}"
    consumer = GroupConsumer(bs, group, [topic], offset_store="auto")
    try:
        batch = _poll(consumer, 5)
        assert [r.offset for r in batch] == [0, 1, 2, 3, 4]
        # Nothing was processed, yet a commit of "what is stored" covers the whole batch.
        assert consumer.commit() == {(topic, 0): 5}
    finally:
        consumer.close()
    assert kafka.committed_offsets(bs, group, topic) == {0: 5}


def test_manual_offset_store_commits_only_what_was_stored(txchaos_stack: Endpoints) -> None:
    bs, topic, group = txchaos_stack.kafka.address, _topic(txchaos_stack), f"g-{uuid.uuid4().hex[:8]}"
    consumer = GroupConsumer(bs, group, [topic], offset_store="manual")
    try:
        batch = _poll(consumer, 5)
        assert consumer.commit() == {}  # nothing stored: nothing to commit
        consumer.store(batch[0])
        consumer.store(batch[1])
        assert consumer.commit() == {(topic, 0): 2}
        member = consumer.member()
        assert member.member_id
        assert member.generation >= 1
    finally:
        consumer.close()
    assert kafka.committed_offsets(bs, group, topic) == {0: 2}


def test_a_probe_kept_open_answers_what_the_broker_holds_now(txchaos_stack: Endpoints) -> None:
    """Quiescence asks one ``OffsetProbe`` again and again: its answers follow produces and commits."""
    bs, topic = txchaos_stack.kafka.address, _topic(txchaos_stack, records=0, partitions=2)
    group = f"g-probe-{uuid.uuid4().hex[:8]}"
    with kafka.OffsetProbe(bs) as probe:
        assert probe.partitions(topic) == [0, 1]
        assert probe.backlog(group, topic) == {}
        kafka.produce(bs, topic, [(f"op-{i}", "{}") for i in range(6)])
        ends = probe.end_offsets(topic)
        assert sum(ends.values()) == 6
        assert probe.backlog(group, topic) == {p: (0, end) for p, end in ends.items() if end}
        assert probe.committed(group, topic) == {0: None, 1: None}
        consumer = GroupConsumer(bs, group, [topic], offset_store="auto")
        try:
            assert len(_poll(consumer, 6)) == 6
            consumer.commit()
        finally:
            consumer.close()
        committed = probe.committed(group, topic)  # a partition that got no record has no commit
        assert {p: c for p, c in committed.items() if c is not None} == {p: e for p, e in ends.items() if e}
        assert probe.backlog(group, topic) == {}
    assert kafka.backlog(bs, group, topic) == {}  # the one-question form agrees


CHILD = """
import os, signal, sys, time
from harness.clients.kafka import GroupConsumer
consumer = GroupConsumer(sys.argv[1], sys.argv[2], [sys.argv[3]], instance_id=sys.argv[4] or None)
got = []
deadline = time.monotonic() + 20
while len(got) < 5 and time.monotonic() < deadline:
    got += consumer.poll_batch(5 - len(got), 0.2)
print(len(got), consumer.member().generation, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no commit, no leave-group: a crash
"""


def _crashed_member(ep: Endpoints, group: str, topic: str, instance: str = "") -> int:
    """Run a member that polls a batch and dies without committing; return its generation."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), ep.kafka.address, group, topic, instance],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    got, generation = proc.stdout.split()
    assert got == "5"
    return int(generation)


@pytest.mark.parametrize(("static", "low", "high"), [(False, 4.0, 12.0), (True, 0.0, 3.0)])
def test_a_crashed_members_batch_comes_back(txchaos_stack: Endpoints, static: bool, low: float, high: float) -> None:
    """Its partitions move once its 6 s session times out (at once for a static member), and
    the whole uncommitted batch is delivered again."""
    bs, topic, group = txchaos_stack.kafka.address, _topic(txchaos_stack), f"g-{uuid.uuid4().hex[:8]}"
    instance = "member-a" if static else ""
    dead_generation = _crashed_member(txchaos_stack, group, topic, instance)
    started = time.monotonic()
    consumer = GroupConsumer(bs, group, [topic], instance_id=instance or None)
    try:
        again = _poll(consumer, 5, timeout=30)
        took = time.monotonic() - started
        assert [r.offset for r in again] == [0, 1, 2, 3, 4]
        assert low <= took <= high, f"partition moved after {took:.1f}s"
        generation = consumer.member().generation
    finally:
        consumer.close()
    # A dynamic member's return is a new generation; a static member rejoins the one it left.
    assert generation == dead_generation if static else generation > dead_generation


def test_a_static_member_fenced_by_its_own_instance_id_raises_instead_of_polling_on(txchaos_stack: Endpoints) -> None:
    """A second member with the same ``group.instance.id`` fences the first (a rejoin racing a broker
    restart does it too). The fenced one's consume hands back an error of code _FATAL whose
    ``fatal()`` is False: taken for a passing error, its worker polled a dead consumer on."""
    from harness.errors import HarnessError

    bs, topic, group = txchaos_stack.kafka.address, _topic(txchaos_stack), f"g-{uuid.uuid4().hex[:8]}"
    first = GroupConsumer(bs, group, [topic], instance_id="member-a")
    second: GroupConsumer | None = None
    try:
        assert len(_poll(first, 10)) == 10
        second = GroupConsumer(bs, group, [topic], instance_id="member-a")
        second.poll_batch(1, 1.0)  # its join fences the first
        with pytest.raises(HarnessError, match="Static consumer fenced"):
            _poll(first, 1_000_000, timeout=30)  # nothing more to read: only the fencing ends it early
    finally:
        first.close()
        if second is not None:
            second.close()


def _copy_in_transaction(
    producer: OutputProducer, consumer: GroupConsumer, records: list[kafka.Record], source: str, out: str
) -> None:
    """Begin a transaction holding ``records`` copied to ``out`` and the offset past them on ``source``."""
    producer.begin()
    for r in records:
        producer.produce(out, r.value, key=r.key)
    producer.send_offsets({(source, 0): records[-1].offset + 1}, consumer)


def test_a_transaction_commits_outputs_and_offsets_together(txchaos_stack: Endpoints) -> None:
    bs, group = txchaos_stack.kafka.address, f"g-{uuid.uuid4().hex[:8]}"
    source, out = _topic(txchaos_stack), _topic(txchaos_stack, records=0)
    consumer = GroupConsumer(bs, group, [source])
    producer = OutputProducer(bs, transactional_id=f"tx-{group}")
    try:
        _copy_in_transaction(producer, consumer, _poll(consumer, 5), source, out)
        producer.commit()
        _copy_in_transaction(producer, consumer, _poll(consumer, 5), source, out)
        producer.abort()
    finally:
        producer.close()
        consumer.close()
    committed = [f"op-{i}" for i in range(5)]
    assert sorted(_read(txchaos_stack, out, read_committed=True)) == committed
    # The aborted records are in the log; only read_committed hides them.
    assert sorted(_read(txchaos_stack, out, read_committed=False)) == sorted(f"op-{i}" for i in range(10))
    assert kafka.committed_offsets(bs, group, source) == {0: 5}  # the aborted offsets never moved


ZOMBIE = """
import os, signal, sys
from harness.clients.kafka import OutputProducer
producer = OutputProducer(sys.argv[1], transactional_id=sys.argv[2])
producer.begin()
producer.produce(sys.argv[3], b"zombie", key="zombie")
producer._producer.flush(10)  # on the broker, inside the open transaction
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_restarted_transactional_worker_aborts_what_its_predecessor_left_open(txchaos_stack: Endpoints) -> None:
    bs, out = txchaos_stack.kafka.address, _topic(txchaos_stack, records=0)
    tx_id = f"tx-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(ZOMBIE), bs, tx_id, out], timeout=60, check=False)
    assert proc.returncode == -9
    started = time.monotonic()
    producer = OutputProducer(bs, transactional_id=tx_id)  # init_transactions fences the dead one
    try:
        assert time.monotonic() - started < 10
        producer.begin()
        producer.produce(out, b"fresh", key="fresh")
        producer.commit()
    finally:
        producer.close()
    assert _read(txchaos_stack, out, read_committed=True) == ["fresh"]
    assert sorted(_read(txchaos_stack, out, read_committed=False)) == ["fresh", "zombie"]


def test_topic_admin_round_trip(txchaos_stack: Endpoints) -> None:
    bs = txchaos_stack.kafka.address
    topic = _topic(txchaos_stack, records=6, partitions=2)
    dlt = kafka.dlt_name(topic)
    kafka.create_topics(bs, [dlt], partitions=2)
    kafka.create_topics(bs, [dlt, dlt], partitions=2)  # one that exists, named twice: fine
    assert kafka.partitions_of(bs, dlt) == [0, 1]
    ends = kafka.end_offsets(bs, topic)
    assert sum(ends.values()) == 6
    records = kafka.read_range(bs, topic, {p: 1 for p in ends}, ends)
    assert len(records) == 6 - sum(1 for e in ends.values() if e > 0)
    assert all(r.offset >= 1 for r in records)
    kafka.purge_topics(bs, [topic])
    assert kafka.read_range(bs, topic, {}, kafka.end_offsets(bs, topic), timeout=2) == []
    kafka.delete_topics(bs, [topic, dlt])
    kafka.delete_topics(bs, [topic])  # already gone: not an error
    assert kafka.partitions_of(bs, topic) == []
