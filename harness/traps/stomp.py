"""STOMP 1.0-1.2, read frame by frame to see an ACK or COMMIT sent and a COMMIT's RECEIPT.

A frame is a command line, header lines, a blank line, a body and a NUL (the body's length is
``content-length`` when given, so a body may hold NULs). Heart-beats are bare end-of-lines between
frames. Headers are kept whole (they are small); a body only up to ``BODY_CAP`` and only for
SEND and MESSAGE frames, the two whose op ids matter.

Ops: a MESSAGE's op is its ``txchaos-op`` header, else the op ids found in its headers and body;
an ACK carries the ops of the message it acknowledges (by ``id`` = the MESSAGE's ``ack`` in 1.2,
by ``message-id`` before); a COMMIT carries the ops of the SENDs and ACKs of its transaction. The
RECEIPT of a COMMIT is seen only when the client asked for one (``receipt`` header on COMMIT):
without it the broker's answer is not on the wire, and ``stomp_after_commit`` cannot fire.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from harness.traps.base import Direction, Hit, OpFinder

BODY_CAP = 64 * 1024
MESSAGES_CAP = 100_000  # unacknowledged MESSAGE ops remembered per connection (oldest dropped first)
_WITH_BODY = (b"SEND", b"MESSAGE")


class _Framer:
    """Split one direction into (offset, command, headers, body prefix) without holding whole bodies."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._in_head = False
        self._in_body = False
        self._remaining = -1  # content-length left, or -1: read to the NUL
        self._body = bytearray()
        self._command = b""
        self._headers: dict[bytes, bytes] = {}
        self._keep = False
        self._start = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes, dict[bytes, bytes], bytes]]:
        out: list[tuple[int, bytes, dict[bytes, bytes], bytes]] = []
        i, n = 0, len(data)
        self._start = 0
        while i < n:
            if self._in_body:
                if self._remaining > 0:
                    take = min(self._remaining, n - i)
                    self._keep_body(data[i : i + take])
                    i += take
                    self._remaining -= take
                    continue
                end = data.find(b"\x00", i)
                if end < 0:
                    if self._remaining < 0:
                        self._keep_body(data[i:])
                    break
                if self._remaining < 0:
                    self._keep_body(data[i:end])
                i = end + 1
                out.append((self._start, self._command, self._headers, bytes(self._body)))
                self._in_body, self._body = False, bytearray()
                continue
            if not self._in_head:
                while i < n and data[i] in b"\r\n":
                    i += 1  # heart-beats between frames
                if i == n:
                    break
                self._start, self._in_head = i, True
            seen = len(self._head)
            self._head += data[i:]  # headers are small: kept whole until the blank line
            cut, sep = _blank_line(self._head, max(0, seen - 2))
            if cut < 0:
                break
            i += cut + sep - seen
            self._begin_body(bytes(self._head[:cut]))
            self._head.clear()
            self._in_head = False
        return out

    def _begin_body(self, head: bytes) -> None:
        lines = head.rstrip(b"\r").replace(b"\r\n", b"\n").split(b"\n")
        self._command = lines[0].strip()
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            headers.setdefault(key, value)  # the first of a repeated header wins (STOMP 1.2)
        self._headers = headers
        self._keep = self._command in _WITH_BODY
        length = headers.get(b"content-length", b"")
        self._remaining = int(length) if length.strip().isdigit() else -1
        self._in_body = True
        self._body = bytearray()

    def _keep_body(self, chunk: bytes) -> None:
        if self._keep and len(self._body) < BODY_CAP:
            self._body += chunk[: BODY_CAP - len(self._body)]


def _blank_line(buf: bytearray, start: int) -> tuple[int, int]:
    """Return where the header block ends in ``buf`` and the length of the blank line after it."""
    found = [(k, len(sep)) for sep in (b"\n\n", b"\n\r\n") if (k := buf.find(sep, start)) >= 0]
    return min(found) if found else (-1, 0)


class StompSession:
    """The protocol state of one STOMP connection: delivered messages, open transactions, receipts."""

    def __init__(self, finder: OpFinder) -> None:
        self._finder = finder
        self._lock = threading.Lock()
        self._up = _Framer()
        self._down = _Framer()
        self._messages: OrderedDict[bytes, frozenset[str]] = OrderedDict()
        self._txns: dict[bytes, set[str]] = {}
        self._receipts: dict[bytes, frozenset[str]] = {}

    def feed(self, direction: Direction, data: bytes) -> tuple[bytes, list[Hit]]:
        with self._lock:
            return data, self._read_up(data) if direction == "up" else self._read_down(data)

    def _ops(self, headers: dict[bytes, bytes], body: bytes) -> frozenset[str]:
        tagged = headers.get(b"txchaos-op")
        if tagged:
            return frozenset({tagged.decode("utf-8", "replace")})
        return self._finder(b"\n".join(headers.values()) + b"\n" + body)

    def _read_up(self, data: bytes) -> list[Hit]:
        hits: list[Hit] = []
        for offset, command, headers, body in self._up.feed(data):
            tx = headers.get(b"transaction")
            if command == b"SEND" and tx is not None:
                self._txns.setdefault(tx, set()).update(self._ops(headers, body))
            elif command == b"ACK":
                key = headers.get(b"id") or headers.get(b"message-id") or b""
                ops = self._messages.pop(key, frozenset())
                if tx is not None:
                    self._txns.setdefault(tx, set()).update(ops)
                hits.append(Hit("stomp_before_ack", offset, ops))
            elif command == b"COMMIT" and tx is not None:
                ops = frozenset(self._txns.pop(tx, set()))
                receipt = headers.get(b"receipt")
                if receipt is not None:
                    self._receipts[receipt] = ops
                hits.append(Hit("stomp_before_commit", offset, ops))
            elif command == b"ABORT" and tx is not None:
                self._txns.pop(tx, None)
        return hits

    def _read_down(self, data: bytes) -> list[Hit]:
        hits: list[Hit] = []
        for offset, command, headers, body in self._down.feed(data):
            if command == b"MESSAGE":
                ops = self._ops(headers, body)
                for key in {headers.get(b"ack"), headers.get(b"message-id")} - {None}:
                    assert key is not None
                    self._messages[key] = ops
                while len(self._messages) > MESSAGES_CAP:
                    self._messages.popitem(last=False)
            elif command == b"RECEIPT":
                receipt = headers.get(b"receipt-id", b"")
                if receipt in self._receipts:
                    hits.append(Hit("stomp_after_commit", offset, self._receipts.pop(receipt)))
        return hits
