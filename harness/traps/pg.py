"""The Postgres wire protocol v3, read just far enough to see a COMMIT sent and a COMMIT confirmed.

Client to server: the untyped startup packets (an SSLRequest or GSSENCRequest is answered by one
byte, ``N`` to go on in clear; ``S``/``G`` means TLS, which this relay cannot read: the connection
is then passed through untouched), then typed messages. Of those only ``Q`` (simple query),
``P``/``B``/``E`` (Parse, Bind, Execute) are read; every other message is skipped by its length,
so a session is never buffered whole. Server to client: ``C`` (CommandComplete, tag ``COMMIT``)
and ``Z`` (ReadyForQuery, status ``I``: out of any transaction).

A transaction's bytes (its statements and bound parameters since the last ``Z I`` or COMMIT) are
kept, up to ``TXN_CAP``, to recognise the op ids of the transaction a COMMIT commits.
"""

from __future__ import annotations

import re
import struct
import threading
from collections import deque

from harness.traps.base import Direction, Hit, OpFinder

TXN_CAP = 256 * 1024  # a transaction's text beyond this is not searched for op ids
SSL_REQUEST, GSSENC_REQUEST, PROTOCOL_3 = 80877103, 80877104, 196608
_STARTUP = -1  # the message type of an untyped startup packet
_REPLY = -2  # the one-byte answer to an SSLRequest / GSSENCRequest
_STAY_UNTYPED = (struct.pack(">I", SSL_REQUEST), struct.pack(">I", GSSENC_REQUEST))  # a StartupMessage follows

_COMMENT = re.compile(rb"--[^\n]*|/\*.*?\*/", re.S)


def is_commit(query: bytes) -> bool:
    """Tell whether a query string holds a COMMIT (or END) statement; COMMIT PREPARED is not one.

    Example: ``is_commit(b"insert ...; commit")`` is True.
    """
    for stmt in _COMMENT.sub(b" ", query).split(b";"):
        words = stmt.split(None, 2)
        if words and words[0].lower() in (b"commit", b"end"):
            if len(words) > 1 and words[1].lower() == b"prepared":
                continue
            return True
    return False


class _Framer:
    """Split one direction into messages without buffering the bodies nobody reads."""

    def __init__(self, keep: frozenset[int], startup: bool) -> None:
        self.keep = keep
        self.startup = startup
        self.replies = 0  # one-byte answers expected before the next typed message
        self._head = bytearray()
        self._body = bytearray()
        self._need = 0
        self._type = 0
        self._keeping = False
        self._start = 0

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """Return (offset where it started in ``data``, type, body if kept else b"") per message ended here."""
        out: list[tuple[int, int, bytes]] = []
        i, n = 0, len(data)
        self._start = 0  # a message begun in an earlier chunk is held from this chunk's start
        while i < n:
            if self._need:
                take = min(self._need, n - i)
                if self._keeping:
                    self._body += data[i : i + take]
                i += take
                self._need -= take
                if not self._need:
                    out.append(self._done())
                continue
            if self.replies and not self._head:
                out.append((i, _REPLY, data[i : i + 1]))
                self.replies -= 1
                i += 1
                continue
            if not self._head:
                self._start = i
            size = 4 if self.startup else 5
            take = min(size - len(self._head), n - i)
            self._head += data[i : i + take]
            i += take
            if len(self._head) < size:
                break
            if self.startup:
                self._type, length = _STARTUP, struct.unpack_from(">I", self._head)[0]
            else:
                self._type, length = self._head[0], struct.unpack_from(">I", self._head, 1)[0]
            self._head.clear()
            self._need = max(0, length - 4)
            self._keeping = self._type in self.keep or self._type == _STARTUP
            if not self._need:
                out.append(self._done())
        return out

    def _done(self) -> tuple[int, int, bytes]:
        body = bytes(self._body)
        self._body.clear()
        if self._type == _STARTUP and body[:4] not in _STAY_UNTYPED:
            self.startup = False  # at once: the typed messages may follow in this very chunk
        return self._start, self._type, body


def _cstr(body: bytes, at: int = 0) -> tuple[bytes, int]:
    end = body.find(b"\x00", at)
    end = len(body) if end < 0 else end
    return body[at:end], end + 1


class PgSession:
    """The protocol state of one Postgres connection: its open transaction and the COMMITs in flight."""

    def __init__(self, finder: OpFinder) -> None:
        self._finder = finder
        self._lock = threading.Lock()
        self._up = _Framer(frozenset(b"QPBE"), startup=True)
        self._down = _Framer(frozenset(b"CZ"), startup=False)
        self._txn = bytearray()
        self._commit_stmts: set[bytes] = set()
        self._commit_portals: set[bytes] = set()
        self._pending: deque[frozenset[str]] = deque()  # ops of each COMMIT sent, awaiting its tag
        self.opaque = False  # TLS was negotiated: nothing more can be read

    def feed(self, direction: Direction, data: bytes) -> tuple[bytes, list[Hit]]:
        if self.opaque:
            return data, []
        with self._lock:
            return data, self._read_up(data) if direction == "up" else self._read_down(data)

    def _read_up(self, data: bytes) -> list[Hit]:
        hits: list[Hit] = []
        for offset, kind, body in self._up.feed(data):
            if kind == _STARTUP:
                code = struct.unpack_from(">I", body)[0] if len(body) >= 4 else 0
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    self._down.replies += 1
            elif kind == ord("Q"):
                query, _ = _cstr(body)
                self._remember(query)
                if is_commit(query):
                    hits.append(self._commit(offset))
            elif kind == ord("P"):
                name, at = _cstr(body)
                query, _ = _cstr(body, at)
                (self._commit_stmts.add if is_commit(query) else self._commit_stmts.discard)(name)
                self._remember(query)
            elif kind == ord("B"):
                portal, at = _cstr(body)
                stmt, _ = _cstr(body, at)
                (self._commit_portals.add if stmt in self._commit_stmts else self._commit_portals.discard)(portal)
                self._remember(body)  # the bound parameters, raw: text or binary, op ids are found as bytes
            elif kind == ord("E"):
                portal, _ = _cstr(body)
                if portal in self._commit_portals:
                    hits.append(self._commit(offset))
        return hits

    def _read_down(self, data: bytes) -> list[Hit]:
        hits: list[Hit] = []
        for offset, kind, body in self._down.feed(data):
            if kind == _REPLY:
                self.opaque = body != b"N"
            elif kind == ord("C"):
                tag, _ = _cstr(body)
                if self._pending and tag.startswith(b"COMMIT"):
                    hits.append(Hit("pg_after_commit", offset, self._pending.popleft()))
                elif self._pending and tag.startswith(b"ROLLBACK"):
                    self._pending.popleft()  # a COMMIT of a failed transaction rolls back: nothing committed
            elif kind == ord("Z"):
                self._pending.clear()  # a COMMIT that failed answered with an error before this
                if body[:1] == b"I":
                    self._txn.clear()
        return hits

    def _remember(self, text: bytes) -> None:
        room = TXN_CAP - len(self._txn)
        if room > 0:
            self._txn += text[:room]

    def _commit(self, offset: int) -> Hit:
        ops = self._finder(self._txn)
        self._txn.clear()
        self._pending.append(ops)
        return Hit("pg_before_commit", offset, ops)
