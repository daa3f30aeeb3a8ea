"""The Postgres trap parser finds COMMIT sent and confirmed, and the ops of the transaction, in wire bytes."""

from __future__ import annotations

import struct

import pytest

from tests.unit.trapfeed import GoSession, Hit, pg_session

SSL_REQUEST, GSSENC_REQUEST, PROTOCOL_3 = 80877103, 80877104, 196608
PgSession = GoSession


def msg(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack(">I", len(body) + 4) + body


def startup(code: int, rest: bytes = b"") -> bytes:
    return struct.pack(">II", 8 + len(rest), code) + rest


def q(sql: str) -> bytes:
    return msg(b"Q", sql.encode() + b"\x00")


def cc(tag: str) -> bytes:
    return msg(b"C", tag.encode() + b"\x00")


def rfq(status: bytes) -> bytes:
    return msg(b"Z", status)


def parse(name: bytes, sql: str) -> bytes:
    return msg(b"P", name + b"\x00" + sql.encode() + b"\x00" + struct.pack(">h", 0))


def bind(portal: bytes, stmt: bytes, *params: bytes) -> bytes:
    body = portal + b"\x00" + stmt + b"\x00" + struct.pack(">h", 0) + struct.pack(">h", len(params))
    for p in params:
        body += struct.pack(">i", len(p)) + p
    return msg(b"B", body + struct.pack(">h", 0))


def execute(portal: bytes) -> bytes:
    return msg(b"E", portal + b"\x00" + struct.pack(">i", 0))


SYNC = msg(b"S", b"")
STARTUP = startup(PROTOCOL_3, b"user\x00u\x00database\x00d\x00\x00")
AUTH_OK = msg(b"R", struct.pack(">i", 0))


def session(*ops: str, pattern: bytes | None = None) -> PgSession:
    return pg_session(*ops, pattern=pattern)


def is_commit(query: bytes) -> bool:
    """Tell whether the reader takes ``query`` for a COMMIT (a simple query right after the startup)."""
    return any(h.point == "pg_before_commit" for h in session().feed("up", STARTUP + msg(b"Q", query + b"\x00"))[1])


def feed(s: PgSession, direction: str, data: bytes, *, bytewise: bool = False) -> list[Hit]:
    """Feed ``data`` whole, or one byte at a time (offsets then say which chunk held the message)."""
    if not bytewise:
        out, hits = s.feed(direction, data)
        assert out == data  # Postgres bytes go on unchanged
        return hits
    found: list[Hit] = []
    for i in range(len(data)):
        _, hits = s.feed(direction, data[i : i + 1])
        found += [Hit(h.point, i, h.ops) for h in hits]
    return found


def login(s: PgSession, *, ssl: bytes | None = b"N") -> None:
    if ssl is not None:
        assert feed(s, "up", startup(SSL_REQUEST)) == []
        assert feed(s, "down", ssl) == []
    feed(s, "up", STARTUP)
    feed(s, "down", AUTH_OK + rfq(b"I"))


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("COMMIT", True),
        ("commit;", True),
        ("  END  ", True),
        ("insert into t values ('x'); COMMIT", True),
        ("/* c */ Commit work", True),
        ("COMMIT PREPARED 'gid'", False),
        ("select 'commit'", False),
        ("ROLLBACK", False),
        ("-- commit\nselect 1", False),
    ],
)
def test_commit_statements(sql: str, expected: bool) -> None:
    assert is_commit(sql.encode()) is expected


def test_simple_query_commit_carries_the_transaction_ops_before_and_after() -> None:
    s = session("op-7", "op-8")
    login(s)
    assert feed(s, "up", q("BEGIN")) == []
    feed(s, "down", cc("BEGIN") + rfq(b"T"))
    feed(s, "up", q("INSERT INTO effects(op) VALUES ('op-7')"))
    feed(s, "down", cc("INSERT 0 1") + rfq(b"T"))
    assert feed(s, "up", q("COMMIT")) == [Hit("pg_before_commit", 0, frozenset({"op-7"}))]
    reply = msg(b"N", b"notice\x00\x00") + cc("COMMIT") + rfq(b"I")
    assert feed(s, "down", reply) == [Hit("pg_after_commit", len(msg(b"N", b"notice\x00\x00")), frozenset({"op-7"}))]
    # the next transaction starts empty: op-7 is not carried over
    feed(s, "up", q("BEGIN"))
    feed(s, "down", cc("BEGIN") + rfq(b"T"))
    assert feed(s, "up", q("COMMIT")) == [Hit("pg_before_commit", 0, frozenset())]


def test_extended_protocol_commit_is_found_at_its_execute_and_params_name_the_op() -> None:
    s = session("op-42")
    login(s, ssl=None)
    insert = parse(b"", "INSERT INTO e(op) VALUES ($1)") + bind(b"", b"", b"op-42") + execute(b"") + SYNC
    assert feed(s, "up", parse(b"", "BEGIN") + bind(b"", b"") + execute(b"") + SYNC) == []
    feed(s, "down", cc("BEGIN") + rfq(b"T"))
    assert feed(s, "up", insert) == []
    feed(s, "down", cc("INSERT 0 1") + rfq(b"T"))
    commit = parse(b"c1", "COMMIT") + bind(b"", b"c1") + execute(b"") + SYNC
    at = len(parse(b"c1", "COMMIT") + bind(b"", b"c1"))
    assert feed(s, "up", commit) == [Hit("pg_before_commit", at, frozenset({"op-42"}))]
    assert feed(s, "down", cc("COMMIT") + rfq(b"I")) == [Hit("pg_after_commit", 0, frozenset({"op-42"}))]
    # a named COMMIT statement bound again without a Parse (JDBC reuses it) is still a commit
    feed(s, "up", q("INSERT INTO e VALUES ('x')"))
    assert [h.point for h in feed(s, "up", bind(b"", b"c1") + execute(b"") + SYNC)] == ["pg_before_commit"]


def test_a_failed_transaction_commit_is_no_after_commit() -> None:
    s = session("op-1")
    login(s)
    feed(s, "up", q("BEGIN; INSERT INTO e VALUES ('op-1')"))
    assert [h.ops for h in feed(s, "up", q("COMMIT"))] == [frozenset({"op-1"})]
    assert feed(s, "down", cc("ROLLBACK") + rfq(b"I")) == []


def test_messages_split_at_every_byte_are_found_where_they_end() -> None:
    s = session("op-3")
    login(s)
    data = q("BEGIN") + q("INSERT INTO e VALUES ('op-3')") + q("COMMIT")
    hits = feed(s, "up", data, bytewise=True)
    assert hits == [Hit("pg_before_commit", len(data) - 1, frozenset({"op-3"}))]
    reply = cc("COMMIT") + rfq(b"I")
    assert feed(s, "down", reply, bytewise=True) == [Hit("pg_after_commit", len(cc("COMMIT")) - 1, frozenset({"op-3"}))]


def test_big_unread_messages_are_skipped_not_buffered() -> None:
    s = session()
    login(s)
    feed(s, "up", q("SELECT big"))
    row = msg(b"D", b"x" * 5_000_000)
    for i in range(0, len(row), 65536):
        feed(s, "down", row[i : i + 65536])
    # that a DataRow is never kept is pg_test.go's TestBigUnreadMessagesAreSkippedNotBuffered
    feed(s, "up", q("COMMIT"))
    assert [h.point for h in feed(s, "down", cc("COMMIT"))] == ["pg_after_commit"]


@pytest.mark.parametrize("answer", [b"S", b"G"])
def test_tls_makes_the_connection_opaque(answer: bytes) -> None:
    s = session("op-1")
    code = SSL_REQUEST if answer == b"S" else GSSENC_REQUEST
    feed(s, "up", startup(code))
    feed(s, "down", answer)
    assert feed(s, "up", q("INSERT 'op-1'; COMMIT")) == []


def test_a_pattern_names_the_op_of_an_unarmed_commit() -> None:
    s = session(pattern=rb"op-[0-9]+")
    login(s)
    assert feed(s, "up", q("BEGIN; INSERT INTO e VALUES ('op-99'); COMMIT")) == [
        Hit("pg_before_commit", 0, frozenset({"op-99"}))
    ]


def test_typed_messages_in_the_startup_chunk_are_read_as_typed() -> None:
    s = session("op-1")
    data = STARTUP + q("BEGIN; INSERT INTO e VALUES ('op-1')") + q("COMMIT")
    assert feed(s, "up", data) == [Hit("pg_before_commit", len(data) - len(q("COMMIT")), frozenset({"op-1"}))]
