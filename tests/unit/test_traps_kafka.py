"""The Kafka trap parser: request headers, the ops of produced records and transactions, broker rewrites."""

from __future__ import annotations

import struct

import pytest

from tests.unit.trapfeed import GoSession, Hit, KafkaCluster

PRODUCE, METADATA, OFFSET_COMMIT, FIND_COORDINATOR, END_TXN = 0, 3, 8, 10, 26
KafkaSession = GoSession

TOXI, TRAP = ("127.0.0.1", 19092), ("127.0.0.1", 41234)
OTHER = ("127.0.0.1", 19093)


def uvarint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def s(value: str | None, compact: bool = False) -> bytes:
    if value is None:
        return uvarint(0) if compact else struct.pack(">h", -1)
    raw = value.encode()
    return (uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def request(key: int, version: int, corr: int, body: bytes, *, flexible: bool = False) -> bytes:
    head = struct.pack(">hhi", key, version, corr) + s("rdkafka") + (b"\x00" if flexible else b"")
    return sized(head + body)


def response(corr: int, body: bytes, *, flexible: bool = False) -> bytes:
    return sized(struct.pack(">i", corr) + (b"\x00" if flexible else b"") + body)


def metadata_brokers(version: int, brokers: list[tuple[int, tuple[str, int]]]) -> bytes:
    """Encode a Metadata response body up to and including its brokers, then a marker tail."""
    flex = version >= 9
    out = struct.pack(">i", 0) if version >= 3 else b""
    out += uvarint(len(brokers) + 1) if flex else struct.pack(">i", len(brokers))
    for node, (host, port) in brokers:
        out += struct.pack(">i", node) + s(host, flex) + struct.pack(">i", port)
        if version >= 1:
            out += s("rack-a", flex)
        if flex:
            out += b"\x00"
    return out + b"TAIL-UNCHANGED"


def find_coordinator(version: int, addr: tuple[str, int]) -> bytes:
    flex = version >= 3
    if version >= 4:
        one = s("group-1", True) + struct.pack(">i", 1) + s(addr[0], True) + struct.pack(">ih", addr[1], 0)
        return struct.pack(">i", 0) + uvarint(2) + one + s(None, True) + b"\x00" + b"\x00"
    out = b""
    if version >= 1:
        out += struct.pack(">ih", 0, 0) + s(None, flex)
    return out + struct.pack(">i", 1) + s(addr[0], flex) + struct.pack(">i", addr[1]) + (b"\x00" if flex else b"")


def session(*ops: str) -> KafkaSession:
    return KafkaCluster(frozenset(ops), {TOXI: TRAP}).session()


def roundtrip(
    sess: KafkaSession, req: bytes, resp: bytes, *, bytewise: bool = False
) -> tuple[list[Hit], bytes, list[Hit]]:
    _, up_hits = sess.feed("up", req)
    if not bytewise:
        out, down_hits = sess.feed("down", resp)
        return up_hits, out, down_hits
    out, down_hits = b"", []
    for i in range(len(resp)):
        chunk, hits = sess.feed("down", resp[i : i + 1])
        down_hits += [Hit(h.point, len(out) + h.offset, h.ops) for h in hits]
        out += chunk
    return up_hits, out, down_hits


@pytest.mark.parametrize("version", [0, 1, 2, 5, 8, 9, 12])
@pytest.mark.parametrize("bytewise", [False, True])
def test_metadata_brokers_at_the_toxiproxy_address_move_to_the_trap(version: int, bytewise: bool) -> None:
    flex = version >= 9
    sess = session()
    before = metadata_brokers(version, [(1, TOXI), (2, OTHER)])
    _, out, _ = roundtrip(
        sess, request(METADATA, version, 7, b"", flexible=flex), response(7, before, flexible=flex), bytewise=bytewise
    )
    assert out == response(7, metadata_brokers(version, [(1, TRAP), (2, OTHER)]), flexible=flex)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_find_coordinator_moves_to_the_trap(version: int) -> None:
    flex = version >= 3
    sess = session()
    _, out, _ = roundtrip(
        sess,
        request(FIND_COORDINATOR, version, 3, s("group-1", flex), flexible=flex),
        response(3, find_coordinator(version, TOXI), flexible=flex),
    )
    assert out == response(3, find_coordinator(version, TRAP), flexible=flex)


def test_other_responses_pass_unchanged_and_are_not_held() -> None:
    sess = session()
    fetch = response(9, b"F" * 100_000)
    sess.feed("up", request(1, 11, 9, b"fetch"))
    out, hits = sess.feed("down", fetch[:5000])
    assert out == fetch[:5000]
    assert hits == []
    assert sess.feed("down", fetch[5000:]) == (fetch[5000:], [])


def produce_v3(txn: str | None, values: list[str]) -> bytes:
    records = b"".join(struct.pack(">i", len(v)) + v.encode() for v in values)  # not a real batch: bytes to search
    return s(txn) + struct.pack(">hi", -1, 30000) + records


def test_produce_ack_fires_after_with_the_ops_of_its_records() -> None:
    sess = session("op-1", "op-2")
    req = request(PRODUCE, 3, 11, produce_v3(None, ['{"op":"op-2"}']))
    resp = response(11, b"produce-response-body")
    up_hits, out, down_hits = roundtrip(sess, req, resp, bytewise=True)
    assert up_hits == []
    assert out == resp
    assert down_hits == [Hit("kafka_after_produce", len(resp) - 1, frozenset({"op-2"}))]  # held from its last byte


def test_end_txn_carries_the_ops_produced_in_its_transaction_across_connections() -> None:
    cluster = KafkaCluster(frozenset({"op-4"}), {})
    leader, coordinator = cluster.session(), cluster.session()
    leader.feed("up", request(PRODUCE, 3, 1, produce_v3("tx-a", ["op-4"])))
    leader.feed("up", request(PRODUCE, 3, 2, produce_v3("tx-b", ["op-5"])))
    end = s("tx-a", True) + struct.pack(">qh?", 1, 0, True)
    _, hits = coordinator.feed("up", request(END_TXN, 3, 5, end, flexible=True))
    assert hits == [Hit("kafka_before_end_txn", 0, frozenset({"op-4"}))]
    _, hits = coordinator.feed("up", request(END_TXN, 1, 6, s("tx-a") + struct.pack(">qh?", 1, 0, True)))
    assert hits == [Hit("kafka_before_end_txn", 0, frozenset())]  # the transaction ended: its ops are gone


def test_offset_commits_are_hit_at_their_request() -> None:
    sess = session()
    first = request(1, 11, 1, b"fetch")
    commit = request(OFFSET_COMMIT, 8, 2, s("group-1", True) + b"rest", flexible=True)
    _, hits = sess.feed("up", first + commit)
    assert hits == [Hit("kafka_before_offset_commit", len(first), frozenset())]
