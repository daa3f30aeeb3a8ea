"""The Kafka protocol, read at the request header, plus the two responses that name brokers.

Every request is ``size:int32, api_key:int16, api_version:int16, correlation_id:int32,
client_id:nullable string`` (then tagged fields in a flexible version); every response is
``size:int32, correlation_id:int32`` (then tagged fields, except ApiVersions). The relay keeps the
api key of each correlation id in flight, so a response is known by its request.

Points: OffsetCommit (8) and TxnOffsetCommit (28) → ``kafka_before_offset_commit``; EndTxn (26) →
``kafka_before_end_txn``; a Produce (0) response → ``kafka_after_produce``. Op ids: a Produce
request's bytes (records uncompressed, as librdkafka sends them unless ``compression.type`` is
set) are searched for op ids, and the ops are added to its transactional id's open transaction, so
an EndTxn is targeted by op too. An offset commit names offsets, not records: arm it by nth hit.

Kafka's brokers advertise the Toxiproxy address; a client that bootstrapped through the trap
would then reach the broker around it. So the Metadata (3) and FindCoordinator (10) responses are
held until whole and each broker address found in ``rewrite`` is replaced by the trap's own, in
every version (flexible ones included), which sends every later connection through the trap too.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable

from harness.traps.base import Direction, Hit, OpFinder

PRODUCE, METADATA, OFFSET_COMMIT, FIND_COORDINATOR, END_TXN, TXN_OFFSET_COMMIT = 0, 3, 8, 10, 26, 28
BODY_CAP = 1024 * 1024  # a Produce request larger than this is not searched for op ids
# The first flexible version (compact strings, tagged fields) of each api read here.
FLEXIBLE = {PRODUCE: 9, METADATA: 9, OFFSET_COMMIT: 8, FIND_COORDINATOR: 3, END_TXN: 3, TXN_OFFSET_COMMIT: 3}
_KEEP_UP = (PRODUCE, END_TXN, TXN_OFFSET_COMMIT)
_REWRITE = (METADATA, FIND_COORDINATOR)
Address = tuple[str, int]


class _Reader:
    """A cursor over a message body for the few Kafka types read here."""

    def __init__(self, buf: bytes, at: int = 0) -> None:
        self.buf, self.at = buf, at

    def num(self, fmt: str) -> int:
        (value,) = struct.unpack_from(">" + fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.buf[self.at]
            self.at += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def string(self, compact: bool) -> bytes | None:
        n = self.uvarint() - 1 if compact else self.num("h")
        if n < 0:
            return None
        value = self.buf[self.at : self.at + n]
        self.at += n
        return value

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.at += self.uvarint()

    def array(self, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.num("i")


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _string(value: bytes, compact: bool) -> bytes:
    return _uvarint(len(value) + 1) + value if compact else struct.pack(">h", len(value)) + value


def request_header(body: bytes) -> tuple[int, int, int, int]:
    """Return (api_key, api_version, correlation_id, offset of the request body) of a request."""
    r = _Reader(body)
    key, version, corr = r.num("h"), r.num("h"), r.num("i")
    r.string(compact=False)  # client_id is never compact
    if version >= FLEXIBLE.get(key, 1 << 15):
        r.tags()
    return key, version, corr, r.at


def transactional_id(key: int, version: int, body: bytes, at: int) -> bytes | None:
    """Return the transactional id a Produce, EndTxn or TxnOffsetCommit request carries (if any)."""
    if key == PRODUCE and version < 3:
        return None
    return _Reader(body, at).string(compact=version >= FLEXIBLE[key])


def rewrite_brokers(key: int, version: int, body: bytes, to: dict[Address, Address]) -> bytes:
    """Return a Metadata / FindCoordinator response body (after the correlation id) with brokers moved."""
    compact = version >= FLEXIBLE[key]
    r = _Reader(body)
    out = bytearray()
    copied = 0

    def move() -> None:
        nonlocal copied
        out.extend(body[copied : r.at])
        host, port = r.string(compact) or b"", r.num("i")
        new = to.get((host.decode(), port))
        if new is not None:
            host, port = new[0].encode(), new[1]
        out.extend(_string(host, compact) + struct.pack(">i", port))
        copied = r.at

    if compact:
        r.tags()  # the response header's tagged fields
    if key == METADATA:
        if version >= 3:
            r.num("i")  # throttle_time_ms
        for _ in range(r.array(compact)):
            r.num("i")  # node_id
            move()
            if version >= 1:
                r.string(compact)  # rack
            if compact:
                r.tags()
    elif version < 4:
        if version >= 1:
            r.num("i")  # throttle_time_ms
            r.num("h")  # error_code
            r.string(compact)  # error_message
        r.num("i")  # node_id
        move()
    else:
        r.num("i")
        for _ in range(r.array(compact)):
            r.string(compact)  # key
            r.num("i")  # node_id
            move()
            r.num("h")
            r.string(compact)
            r.tags()
    return bytes(out + body[copied:])


class KafkaCluster:
    """What the connections of one Kafka trap share: open transactions by transactional id."""

    def __init__(self, finder: OpFinder, rewrite: dict[Address, Address]) -> None:
        self.finder = finder
        self.rewrite = rewrite
        self._lock = threading.Lock()
        self._txns: dict[bytes, set[str]] = {}

    def session(self) -> KafkaSession:
        return KafkaSession(self)

    def add(self, txn: bytes, ops: frozenset[str]) -> None:
        with self._lock:
            self._txns.setdefault(txn, set()).update(ops)

    def end(self, txn: bytes) -> frozenset[str]:
        with self._lock:
            return frozenset(self._txns.pop(txn, set()))

    def peek(self, txn: bytes) -> frozenset[str]:
        with self._lock:
            return frozenset(self._txns.get(txn, set()))


Info = tuple[int, int, frozenset[str]]  # a message's api key, api version and ops
Decision = tuple[int, bool, Info]  # (body bytes to keep, hold until whole?, the message's info)
_NONE: Info = (-1, 0, frozenset())


class _Framer:
    """Split one direction into size-prefixed messages; hold back the whole messages ``decide`` says to.

    ``decide(size, first_bytes)`` sees up to the first 8 body bytes; ``transform(body, info)``
    returns the body that replaces a held one.
    """

    def __init__(self, decide: Callable[[int, bytes], Decision], transform: Callable[[bytes, Info], bytes]) -> None:
        self._decide = decide
        self._transform = transform
        self._staged = bytearray()  # this message's bytes not forwarded yet: size and first bytes, or all if held
        self._body = bytearray()
        self._size = -1  # -1: reading the size prefix
        self._need = 0
        self._keep = -1  # -1: not decided yet
        self._hold = False
        self._info: Info = _NONE
        self._start = 0

    def feed(self, data: bytes) -> tuple[bytes, list[tuple[int, bytes, Info]]]:
        """Return the bytes to forward now and (offset in them, kept body, info) per message ended here."""
        out = bytearray()
        msgs: list[tuple[int, bytes, Info]] = []
        i, n = 0, len(data)
        self._start = 0  # a message begun in an earlier chunk starts this chunk's output
        while i < n:
            if self._size < 0:
                take = min(4 - len(self._staged), n - i)
                self._staged += data[i : i + take]
                i += take
                if len(self._staged) < 4:
                    break
                self._size = self._need = max(0, struct.unpack_from(">i", self._staged)[0])
            elif self._keep < 0:
                take = min(self._need, n - i, 8 - len(self._body))
                self._body += data[i : i + take]
                self._staged += data[i : i + take]
                i += take
                self._need -= take
            else:
                take = min(self._need, n - i)
                room = self._keep - len(self._body)
                if room > 0:
                    self._body += data[i : i + min(room, take)]
                (self._staged if self._hold else out).extend(data[i : i + take])
                i += take
                self._need -= take
            if self._keep < 0 and (len(self._body) >= 8 or not self._need):
                self._keep, self._hold, self._info = self._decide(self._size, bytes(self._body))
                del self._body[self._keep :]
                if not self._hold:
                    self._start = len(out)
                    out += self._staged
                    self._staged.clear()
            if self._keep >= 0 and not self._need:
                if self._hold:
                    body = self._transform(bytes(self._staged[4:]), self._info)
                    self._start = len(out)
                    out += struct.pack(">i", len(body)) + body
                msgs.append((self._start, bytes(self._body), self._info))
                self._staged.clear()
                self._body.clear()
                self._size, self._keep, self._hold, self._info = -1, -1, False, _NONE
        return bytes(out), msgs


class KafkaSession:
    """The protocol state of one Kafka connection: the api key of each correlation id in flight."""

    def __init__(self, cluster: KafkaCluster) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._inflight: dict[int, tuple[int, int, frozenset[str]]] = {}
        self._up = _Framer(self._decide_up, lambda body, _info: body)
        self._down = _Framer(self._decide_down, self._rewrite)

    def feed(self, direction: Direction, data: bytes) -> tuple[bytes, list[Hit]]:
        with self._lock:
            return self._read_up(data) if direction == "up" else self._read_down(data)

    @staticmethod
    def _decide_up(size: int, first: bytes) -> Decision:
        key = struct.unpack_from(">h", first)[0] if len(first) >= 2 else -1
        if key == PRODUCE:
            return min(size, BODY_CAP), False, _NONE
        if key in _KEEP_UP:
            return min(size, 64 * 1024), False, _NONE
        return 8, False, _NONE

    def _decide_down(self, size: int, first: bytes) -> Decision:
        corr = struct.unpack_from(">i", first)[0] if len(first) >= 4 else -1
        info = self._inflight.pop(corr, _NONE)
        key = info[0]
        if key in _REWRITE and self._cluster.rewrite:
            return size, True, info
        return 4, False, info

    def _rewrite(self, body: bytes, info: Info) -> bytes:
        key, version, _ = info
        try:
            return body[:4] + rewrite_brokers(key, version, body[4:], self._cluster.rewrite)
        except (struct.error, IndexError):
            return body  # a version this reader does not know: forwarded as it came

    def _read_up(self, data: bytes) -> tuple[bytes, list[Hit]]:
        out, msgs = self._up.feed(data)
        hits: list[Hit] = []
        for offset, body, _ in msgs:
            if len(body) < 8:
                continue
            key, version, corr = struct.unpack_from(">hhi", body)
            ops: frozenset[str] = frozenset()
            if key in _KEEP_UP:
                try:
                    _, _, _, at = request_header(body)
                    txn = transactional_id(key, version, body, at)
                except (struct.error, IndexError):
                    txn = None
                if key == PRODUCE:
                    ops = self._cluster.finder(body)
                    if txn is not None:
                        self._cluster.add(txn, ops)
                elif key == END_TXN:
                    ops = self._cluster.end(txn) if txn is not None else frozenset()
                    hits.append(Hit("kafka_before_end_txn", offset, ops))
                else:
                    ops = self._cluster.peek(txn) if txn is not None else frozenset()
            if key in (OFFSET_COMMIT, TXN_OFFSET_COMMIT):
                hits.append(Hit("kafka_before_offset_commit", offset, ops))
            self._inflight[corr] = (key, version, ops)
        return out, hits

    def _read_down(self, data: bytes) -> tuple[bytes, list[Hit]]:
        out, msgs = self._down.feed(data)
        hits = [Hit("kafka_after_produce", offset, info[2]) for offset, _, info in msgs if info[0] == PRODUCE]
        return out, hits
