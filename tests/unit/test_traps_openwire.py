"""The OpenWire trap reader finds a JMS transaction's ack, commit and confirmed commit, with their ops.

The bytes are written here as activemq-client writes them (``Enc``: tight or loose encoding, with
or without the marshalling cache), independently of the Go tests' encoder, and read by the relay's
own reader through ``trapd feed``.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from tests.unit.trapfeed import GoSession, Hit

WIRE_FORMAT, TRANSACTION_INFO, DISPATCH, ACK, TEXT_MESSAGE, RESPONSE, EXCEPTION_RESPONSE = 1, 7, 21, 22, 28, 30, 31
CONSUMER_INFO, STANDARD_ACK, COMMIT_ONE_PHASE, ROLLBACK = 5, 2, 2, 4
CONN = "ID:host-1"


class Enc:
    """One side's marshaller: a command's booleans (tight: a leading bit stream) and its bytes."""

    def __init__(self, *, tight: bool, cache: bool) -> None:
        self.tight, self.cache = tight, cache
        self.index: dict[str, int] = {}
        self.bits: list[bool] = []
        self.data = bytearray()

    def boolean(self, value: bool) -> None:
        if self.tight:
            self.bits.append(value)
        else:
            self.data.append(int(value))

    def long(self, value: int) -> None:
        if not self.tight:
            self.data += struct.pack(">q", value)
            return
        size = 0 if value == 0 else 2 if value < 1 << 16 else 4 if value < 1 << 32 else 8
        self.boolean(size >= 4)
        self.boolean(size in (2, 8))
        self.data += value.to_bytes(size, "big")

    def text(self, value: str) -> None:
        self.boolean(True)
        if self.tight:
            self.boolean(True)  # ASCII
        self.data += struct.pack(">H", len(value)) + value.encode()

    def cached(self, key: str, body: Callable[[], None] | None) -> None:
        """Write a structure through the cache: whole the first time, by its index after."""
        if self.cache:
            seen = key in self.index
            self.boolean(not seen)
            index = self.index.setdefault(key, len(self.index))
            self.data += struct.pack(">h", index)
            if seen:
                return
        self.boolean(body is not None)
        if body is not None:
            body()

    def typed(self, kind: int, *fields: Callable[[], None]) -> Callable[[], None]:
        def write() -> None:
            self.data.append(kind)
            for field in fields:
                field()

        return write

    def connection(self) -> None:
        self.cached("c", self.typed(120, lambda: self.text(CONN)))

    def consumer(self) -> None:
        self.cached("k", self.typed(122, lambda: self.text(CONN), lambda: self.long(1), lambda: self.long(1)))

    def producer(self, conn: str) -> None:
        self.cached(f"p:{conn}", self.typed(123, lambda: self.text(conn), lambda: self.long(1), lambda: self.long(1)))

    def queue(self, name: str) -> None:
        self.cached(f"d:{name}", self.typed(100, lambda: self.text(name)))

    def tx(self, value: int) -> None:
        self.cached(f"tx:{value}", self.typed(111, lambda: self.long(value), self.connection))

    def message_id(self, conn: str, seq: int) -> None:
        self.boolean(True)
        self.data.append(110)
        self.boolean(False)  # no text view
        self.producer(conn)
        self.long(seq)
        self.long(1000 + seq)

    def command(self, kind: int, command_id: int, *fields: Callable[[], None]) -> bytes:
        """Return one framed command: its size, type, (tight) bit stream, id and fields."""
        self.bits, self.data = [True] if self.tight else [], bytearray(struct.pack(">i", command_id))
        if not self.tight:
            self.data.append(1)  # responseRequired
        for field in fields:
            field()
        body = bytes([kind])
        if self.tight:
            stream = bytearray((len(self.bits) + 7) // 8)
            for i, bit in enumerate(self.bits):
                stream[i // 8] |= bit << (i % 8)
            body += bytes([len(stream)]) + stream
        body += self.data
        return struct.pack(">I", len(body)) + body

    # -- the commands of a transacted receive-and-send -----------------------------------------
    def dispatch(self, seq: int, body: str) -> bytes:
        def message() -> None:
            self.boolean(True)
            self.data.append(TEXT_MESSAGE)
            if self.tight:
                self.boolean(False)  # no cached marshalled form
            self.data += struct.pack(">i", 0)
            self.boolean(False)  # responseRequired
            self.producer("ID:other")
            self.queue("in")
            self.cached("null", None)  # transaction
            self.cached("null", None)  # original destination
            self.message_id("ID:other", seq)
            self.data += body.encode()

        return self.command(DISPATCH, 0, self.consumer, lambda: self.queue("in"), message)

    def ack(self, command_id: int, ack_type: int, tx: int | None, seq: int) -> bytes:
        def fields() -> None:
            self.queue("in")
            self.cached("null", None) if tx is None else self.tx(tx)
            self.consumer()
            self.data.append(ack_type)
            self.message_id("ID:other", seq)
            self.message_id("ID:other", seq)
            self.data += struct.pack(">i", 1)
            self.boolean(False)  # no poison cause

        return self.command(ACK, command_id, fields)

    def send(self, command_id: int, tx: int, body: str) -> bytes:
        def fields() -> None:
            self.producer(CONN)
            self.queue("out")
            self.tx(tx)
            self.data += body.encode()

        return self.command(TEXT_MESSAGE, command_id, fields)

    def end(self, command_id: int, tx: int, what: int) -> bytes:
        return self.command(
            TRANSACTION_INFO, command_id, self.connection, lambda: self.tx(tx), lambda: self.data.append(what)
        )

    def response(self, kind: int, correlation: int) -> bytes:
        return self.command(kind, 0, lambda: self.data.extend(struct.pack(">i", correlation)))


def wire_format(*, tight: bool, cache: bool) -> bytes:
    body = bytes([WIRE_FORMAT]) + b"ActiveMQ\x00\x00\x00\x0c"
    for name, value in (("TightEncodingEnabled", tight), ("CacheEnabled", cache)):
        body += bytes([0, len(name)]) + name.encode() + bytes([1, int(value)])
    return struct.pack(">I", len(body)) + body


Step = tuple[str, bytes]


def conversation(*, tight: bool, cache: bool, outcome: int = RESPONSE) -> list[Step]:
    """Return a transacted receive-and-send as activemq-client runs it, the broker's side included."""
    client, broker = Enc(tight=tight, cache=cache), Enc(tight=tight, cache=cache)
    return [
        ("up", wire_format(tight=True, cache=True)),  # each side offers; the lesser is used
        ("down", wire_format(tight=tight, cache=cache)),
        ("up", client.command(CONSUMER_INFO, 1, client.consumer, lambda: client.data.extend(b"...the rest..."))),
        ("down", broker.dispatch(1, '{"op": "op-7", "amount": 3}')),
        ("up", client.ack(5, 0, None, 1)),  # the delivered-ack at receive: it consumes nothing
        ("down", broker.dispatch(2, '{"op": "op-8"}')),  # dispatched early, not yet consumed
        ("up", client.send(6, 9, '{"op": "op-7"}')),
        ("up", client.ack(7, STANDARD_ACK, 9, 1)),
        ("up", client.end(42, 9, COMMIT_ONE_PHASE)),
        ("down", broker.response(outcome, 42)),
    ]


def run(steps: list[Step], session: GoSession, chunk: Callable[[int], int] = lambda n: n) -> list[Hit]:
    """Feed every step in chunks of at most ``chunk(left)`` bytes; the bytes must pass unchanged."""
    hits: list[Hit] = []
    for direction, data in steps:
        at = 0
        while at < len(data):
            piece = data[at : at + chunk(len(data) - at)]
            out, found = session.feed(direction, piece)
            assert out == piece
            hits += found
            at += len(piece)
    return hits


def points(hits: list[Hit]) -> list[tuple[str, frozenset[str]]]:
    return [(h.point, h.ops) for h in hits]


WANT = [
    ("openwire_before_ack", frozenset({"op-7"})),
    ("openwire_before_commit", frozenset({"op-7"})),
    ("openwire_after_commit", frozenset({"op-7"})),
]


@pytest.mark.parametrize(("tight", "cache"), [(True, True), (True, False), (False, True), (False, False)])
def test_ack_commit_and_its_response_carry_the_op_received_in_the_transaction(tight: bool, cache: bool) -> None:
    hits = run(conversation(tight=tight, cache=cache), GoSession("openwire", ("op-7",)))
    assert points(hits) == WANT  # op-8, dispatched but not consumed, is in none of them


def test_commands_split_anywhere_are_read_whole() -> None:
    rng = random.Random(1)
    for _ in range(30):
        steps = conversation(tight=True, cache=True)
        assert points(run(steps, GoSession("openwire", ("op-7",)), lambda left: rng.randint(1, 9))) == WANT


def test_a_commit_answered_by_an_exception_is_not_confirmed() -> None:
    hits = run(conversation(tight=True, cache=True, outcome=EXCEPTION_RESPONSE), GoSession("openwire", ("op-7",)))
    assert points(hits) == WANT[:2]


def test_a_rolled_back_transaction_forgets_what_it_sent() -> None:
    client = Enc(tight=True, cache=True)
    steps = [
        ("up", wire_format(tight=True, cache=True)),
        ("down", wire_format(tight=True, cache=True)),
        ("up", client.send(6, 9, '{"op": "op-3"}')),
        ("up", client.end(7, 9, ROLLBACK)),
        ("up", client.send(8, 10, '{"op": "op-4"}')),
        ("up", client.end(9, 10, COMMIT_ONE_PHASE)),
    ]
    hits = run(steps, GoSession("openwire", ("op-3", "op-4")))  # a body names the ops armed on it
    assert points(hits) == [("openwire_before_commit", frozenset({"op-4"}))]
    assert hits[0].offset == 0
