"""The only module importing stomp.py: ActiveMQ Classic over STOMP 1.2.

Defaults follow BROKER_FACTS.md: ``client-individual`` acks, ``activemq.prefetchSize:1``,
heart-beats (1000, 1000) so a hung consumer is dropped, ``persistent:true`` on every SEND
(a non-persistent message NACKed is silently lost), and a RECEIPT on COMMIT so "committed"
in the ledger means the broker said so.

Frames are read on the caller's thread. stomp.py's ``Connection`` reads them on a receiver thread
and hands each MESSAGE and RECEIPT to the caller through a queue or an event: two thread
wake-ups a received frame. Reading on the caller's thread took 0.55 ms less worker CPU a message
in the soak pairs' loop on the stage's clients (4 workers on 2 cores, where that CPU is the
broker's; docs/benchmarks.md). stomp.py computes the heart-beats both sides agreed on. It has no
mode that reads on the caller's thread, so that part is the ``_Wire`` below. Its frame parser runs
two regular-expression substitutions a header (26-28 us an ActiveMQ MESSAGE frame, against 6 for
``split_frame``, which a stage worker runs twice a message and the soak's sink once), so frames are
split here too. A heart-beat thread sends the agreed beats
while the caller is busy elsewhere (a handler in its transaction), as stomp.py's does, so a
frozen process is still dropped by the broker and a busy one is not.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import select
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from stomp.utils import calculate_heartbeats

from harness.errors import HarnessError

# Workers (the system under test) beat every second so a hung one is dropped (BROKER_FACTS.md).
# The harness's own connections pass heartbeats=(0, 0): on a starved 2-core machine a missed
# beat would kill the harness's eye, not the system under test.
HEARTBEATS = (1000, 1000)
RECEIPT_TIMEOUT_S = 10.0
DISCONNECT_WAIT_S = 2.0
CONNECT_TIMEOUT_S = 10.0
# The broker is taken for gone after this many of its agreed beat intervals without a byte.
# ActiveMQ checks every interval whether it wrote anything since the last check and beats only if
# not, so its bytes can come nearly two intervals apart; a host that steals CPU adds to that. At 1.5
# idle workers were dropped again and again on such a host (a crash loop of "lost" in a run with
# nothing to do), which the stomp.py connection this replaced only reported to a listener.
SILENCE_SCALE = 3.0
_READ_BYTES = 65536


def queue_dest(name: str) -> str:
    """Return the STOMP destination of queue ``name``."""
    return name if name.startswith("/") else f"/queue/{name}"


def dlq_name(name: str) -> str:
    """Return the dead-letter queue of ``name`` under the broker's individual DLQ strategy."""
    return f"DLQ.{name.removeprefix('/queue/')}"


@dataclass(frozen=True)
class Message:
    """A received message: body, headers, broker ``message-id`` and the ``ack`` id to settle it."""

    body: str
    headers: dict[str, str]
    destination: str
    subscription: str

    @property
    def message_id(self) -> str:
        return self.headers.get("message-id", "")

    @property
    def ack_id(self) -> str:
        return self.headers.get("ack", "")

    @property
    def redelivered(self) -> bool:
        return self.headers.get("redelivered", "false") == "true"


def _escape(value: str) -> str:
    """Escape a header value as STOMP 1.2 asks (every frame but CONNECT)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c").replace("\r", "\\r")


def encode(command: str, headers: dict[str, str], body: bytes = b"", *, escape: bool = True) -> bytes:
    """Return the bytes of one frame; a body gets its ``content-length``.

    ``escape=False`` writes header values as given: values that need no escaping, or that are still
    escaped as the broker sent them (an ``ack`` id passed straight back).
    """
    if body:
        headers = {**headers, "content-length": str(len(body))}
    plain = not escape or command in ("CONNECT", "STOMP")  # CONNECT's headers are not escaped (STOMP 1.2)
    head = "".join(f"{k}:{v if plain else _escape(v)}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\0"


def take_frame(buf: bytearray) -> tuple[bytes, int] | None:
    """Take the next whole frame off ``buf``: its bytes (the NUL dropped) and where its headers end;
    None while it is not all there. The heart-beats and EOLs STOMP allows between frames go first.

    A frame with a ``content-length`` ends after that many bytes of body (which may hold NULs);
    one without ends at the first NUL.
    """
    if buf and buf[0] in (10, 13):  # CR or LF, looked at first: stripping copies the whole buffer, a frame at a time
        del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]
    end = buf.find(b"\n\n")
    if end < 0:
        return None
    length = None
    at = buf.find(b"\ncontent-length:", 0, end)
    if at >= 0:
        stop_line = buf.find(b"\n", at + 16, end + 1)
        length = int(buf[at + 16 : stop_line].strip())
    stop = buf.find(b"\0", end + 2) if length is None else end + 2 + length
    if stop < 0 or len(buf) <= stop:
        return None
    frame = bytes(buf[:stop])
    del buf[: stop + 1]
    return frame, end


_UNESCAPES = {"\\\\": "\\", "\\n": "\n", "\\c": ":", "\\r": "\r"}
_ESCAPED = re.compile(r"\\.?", re.DOTALL)


def _unescape(value: str) -> str:
    """Undo STOMP 1.2's header escapes; an unknown escape is a protocol error (the spec says fatal)."""
    colons = value.replace("\\c", ":")  # the common case: a broker's ids (``ID\\chost-1\\c2``)
    if "\\" not in colons:  # every backslash began a ``\\c``: none was the second of a ``\\\\``
        return colons

    def one(found: re.Match[str]) -> str:
        got = _UNESCAPES.get(found.group(0))
        if got is None:
            raise HarnessError(f"STOMP header value {value!r} holds the unknown escape {found.group(0)!r}")
        return got

    return _ESCAPED.sub(one, value)


def split_frame(frame: bytes, end: int, *, unescape: bool = True) -> tuple[str, dict[str, str], bytes]:
    """Return the command, headers and body of a frame ``take_frame`` took (headers end at ``end``).

    The first of a repeated header counts (STOMP 1.2). Values are unescaped unless ``unescape`` is
    False (a client that passes an ``ack`` id back as the broker wrote it), and never in CONNECTED,
    which the spec leaves unescaped; only a value holding a backslash is looked at twice.
    """
    lines = frame[:end].decode().split("\n")
    command = lines[0].rstrip("\r")
    escaped = unescape and command != "CONNECTED"
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.rstrip("\r").partition(":")
        if escaped and "\\" in line:
            key, value = _unescape(key), _unescape(value)
        headers.setdefault(key, value)
    return command, headers, frame[end + 2 :]


class _Wire:
    """One STOMP socket: frames written under a lock (the heart-beat thread writes too), read on the
    caller's thread. Raises ``HarnessError`` when the connection ends or falls silent."""

    def __init__(self, host: str, port: int) -> None:
        self.where = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        # Nagle off: a small frame would wait for the peer's delayed ACK (~40 ms a message through
        # Toxiproxy). The broker side already sets transport.tcpNoDelay.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking writes, as stomp.py's: a socket timeout would apply to sendall too, so reads
        # wait in poll() instead, and a frame is never cut off by a read's timeout.
        self.sock.settimeout(None)
        self._readable = select.poll()
        self._readable.register(self.sock, select.POLLIN)
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.last_sent = self.last_read = time.monotonic()
        self.silence_s = 0.0  # the broker is gone after this long without a byte (0: never)
        self.closed = False

    def write(self, frame: bytes) -> None:
        with self._lock:
            if self.closed:
                raise HarnessError(f"STOMP connection to {self.where} is closed")
            try:
                self.sock.sendall(frame)
            except OSError as exc:
                raise HarnessError(f"STOMP write to {self.where} failed: {exc!r}") from exc
            self.last_sent = time.monotonic()

    def read(self, timeout: float) -> tuple[str, dict[str, str], bytes] | None:
        """Return the next frame (command, headers unescaped, body), or None after ``timeout`` seconds.

        Silence is judged only after a read found nothing: a caller that was busy elsewhere first
        reads what the broker sent meanwhile.
        """
        deadline = time.monotonic() + timeout
        while (taken := take_frame(self._buf)) is None:
            wait = max(0.001, deadline - time.monotonic())
            if not self._readable.poll(1000 * (min(wait, self.silence_s) if self.silence_s else wait)):
                now = time.monotonic()
                if self.silence_s and now - self.last_read > self.silence_s:
                    raise HarnessError(
                        f"STOMP connection to {self.where} lost: nothing from the broker for {self.silence_s:.1f}s"
                    )
                if now >= deadline:
                    return None
                continue
            try:
                chunk = self.sock.recv(_READ_BYTES)
            except OSError as exc:
                raise HarnessError(f"STOMP connection to {self.where} lost: {exc!r}") from exc
            if not chunk:
                raise HarnessError(f"STOMP connection to {self.where} lost: closed by the broker")
            self.last_read = time.monotonic()
            self._buf += chunk
        return split_frame(*taken)

    def close(self) -> None:
        with self._lock:
            self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


class _Beats(threading.Thread):
    """Send a heart-beat whenever ``every_s`` passed without a frame, until stopped."""

    def __init__(self, wire: _Wire, every_s: float) -> None:
        super().__init__(name=f"stomp-beats {wire.where}", daemon=True)
        self.wire, self.every_s = wire, every_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(max(0.05, self.wire.last_sent + self.every_s - time.monotonic())):
            if time.monotonic() - self.wire.last_sent >= self.every_s:
                try:
                    self.wire.write(b"\n")
                except HarnessError:
                    return  # the connection is gone: the caller finds out on its next frame


class StompClient:
    """One STOMP connection: subscribe, receive, transactions, ack/nack, send.

    Used from one thread (its heart-beat thread only writes beats).

    >>> with StompClient("127.0.0.1", 61613) as c:
    ...     c.send("orders", '{"op": "op-1"}')
    """

    def __init__(
        self, host: str, port: int, *, client_id: str | None = None, heartbeats: tuple[int, int] = HEARTBEATS
    ) -> None:
        self.host, self.port = host, port
        # Subscription, transaction and receipt ids: unique on the connection, as STOMP asks (a
        # counter, not uuid4: that reads the kernel's random source, two calls a stage's message).
        self._ids = itertools.count(1)
        self._held: deque[Message] = deque()  # MESSAGE frames read while waiting for a RECEIPT
        self._subs: dict[str, str] = {}
        self._beats: _Beats | None = None
        self._broken = ""  # why the connection is unusable: raised by every later call
        try:
            self._wire = _Wire(host, port)
        except OSError as exc:
            raise self._refused(repr(exc)) from exc
        try:
            self._connect(client_id or f"txchaos-{uuid.uuid4().hex[:8]}", heartbeats)
        except BaseException:
            self._wire.close()
            raise

    def _refused(self, why: str) -> HarnessError:
        return HarnessError(
            f"STOMP connect to {self.host}:{self.port} failed: {why}",
            hint="is the broker up (`txchaos status`) and the activemq_stomp proxy enabled?",
        )

    def _connect(self, client_id: str, heartbeats: tuple[int, int]) -> None:
        headers = {
            "accept-version": "1.2",
            "host": self.host,
            "heart-beat": f"{heartbeats[0]},{heartbeats[1]}",
            "client-id": client_id,
        }
        try:
            self._wire.write(encode("CONNECT", headers))
            frame = self._wire.read(CONNECT_TIMEOUT_S)
        except HarnessError as exc:
            raise self._refused(exc.message) from exc
        if frame is None:
            raise self._refused(f"no CONNECTED frame in {CONNECT_TIMEOUT_S:g}s")
        command, got, body = frame
        if command != "CONNECTED":  # the broker's ERROR frame, e.g. "already connected"
            raise self._refused(f"{command} {got.get('message', '')} {body.decode(errors='replace')}".strip())
        server = tuple(got.get("heart-beat", "0,0").split(",", 1))
        send_ms, read_ms = calculate_heartbeats(server if len(server) == 2 else ("0", "0"), heartbeats)
        self._wire.silence_s = read_ms / 1000 * SILENCE_SCALE
        if send_ms:
            self._beats = _Beats(self._wire, send_ms / 1000)
            self._beats.start()

    # -- frames ------------------------------------------------------------------------------
    def _write(self, what: str, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self._send_bytes(what, encode(command, headers, body))

    def _send_bytes(self, what: str, frames: bytes) -> None:
        self._raise_if_broken()
        try:
            self._wire.write(frames)
        except HarnessError as exc:
            self._broken = exc.message
            raise HarnessError(f"STOMP {what} to {self.host}:{self.port} failed: {exc.message}") from exc

    def _read(self, timeout: float) -> tuple[str, dict[str, str], bytes] | None:
        """Return the next frame; an ERROR frame or a lost connection raises (and every later call)."""
        self._raise_if_broken()
        try:
            frame = self._wire.read(timeout)
        except HarnessError as exc:
            self._broken = exc.message
            raise
        if frame is not None and frame[0] == "ERROR":
            said = f"{frame[1].get('message', '')} {frame[2].decode(errors='replace')}".strip()
            self._broken = f"broker ERROR frame: {said}"
            raise HarnessError(self._broken)
        return frame

    def _raise_if_broken(self) -> None:
        if self._broken:
            raise HarnessError(self._broken)

    # -- consuming -------------------------------------------------------------------------
    def subscribe(self, name: str, *, ack: str = "client-individual", prefetch: int = 1) -> str:
        """Subscribe to queue ``name``; returns the subscription id."""
        sub_id = f"sub-{next(self._ids)}"
        headers = {"destination": queue_dest(name), "id": sub_id, "ack": ack, "activemq.prefetchSize": str(prefetch)}
        self._write(f"SUBSCRIBE {name}", "SUBSCRIBE", headers)
        self._subs[sub_id] = name
        return sub_id

    def unsubscribe(self, sub_id: str) -> None:
        self._write(f"UNSUBSCRIBE {sub_id}", "UNSUBSCRIBE", {"id": sub_id})
        self._subs.pop(sub_id, None)

    def held(self, names: list[str], *, timeout: float = 5.0) -> int:
        """Return how many messages the queues ``names`` hold now, delivered to a consumer or not.

        A queue browser (``browser: true``): the broker sends each message it holds, then one marked
        ``browser: end``; nothing is consumed. Measured on the local stack: about 1 ms for an empty
        queue, where waiting to see that nothing arrives takes as long as the wait. Raises
        ``HarnessError`` when a browse does not end within ``timeout`` seconds.
        """
        if self._subs:  # their messages would come in between the browse's
            subscribed = sorted(self._subs.values())
            raise HarnessError(f"browse on a client subscribed to {subscribed}: use a client of its own")
        ended: set[str] = set()
        count = 0
        deadline = time.monotonic() + timeout
        subs = []
        for name in names:
            sub_id = f"browse-{next(self._ids)}"
            headers = {"destination": queue_dest(name), "id": sub_id, "ack": "auto", "browser": "true"}
            self._write(f"SUBSCRIBE {name} (browser)", "SUBSCRIBE", headers)
            subs.append(sub_id)
        try:
            while len(ended) < len(subs):
                msg = self.receive(max(0.0, deadline - time.monotonic()))
                if msg is None:
                    raise HarnessError(f"browsing {', '.join(names)} did not end within {timeout}s")
                if msg.headers.get("browser") == "end":
                    ended.add(msg.subscription)
                else:
                    count += 1
        finally:
            for sub_id in subs:
                with contextlib.suppress(HarnessError):  # a browse that ended may be gone already
                    self.unsubscribe(sub_id)
        return count

    def receive(self, timeout: float) -> Message | None:
        """Return the next message, or None after ``timeout`` seconds."""
        if self._held:
            return self._held.popleft()
        deadline = time.monotonic() + timeout
        while True:
            frame = self._read(max(0.0, deadline - time.monotonic()))
            if frame is None:
                return None
            if frame[0] == "MESSAGE":
                return _message(frame[1], frame[2])
            # a RECEIPT nobody waits for any more (its wait timed out): skip it

    def ack(self, msg: Message, *, transaction: str | None = None) -> None:
        self._settle("ACK", msg, transaction)

    def nack(self, msg: Message, *, transaction: str | None = None) -> None:
        """NACK ``msg``; outside any transaction, as the broker answers a transacted NACK with ERROR.

        ``transaction`` exists only so tests can prove that rejection (tests/integration/test_activemq_facts.py).
        """
        self._settle("NACK", msg, transaction)

    def _settle(self, command: str, msg: Message, transaction: str | None) -> None:
        self._write(command, command, {"id": msg.ack_id, **({"transaction": transaction} if transaction else {})})

    # -- producing and transactions ----------------------------------------------------------
    def send(
        self,
        name: str,
        body: str,
        *,
        transaction: str | None = None,
        headers: dict[str, str] | None = None,
        persistent: bool = True,
    ) -> None:
        self._write(f"SEND {name}", "SEND", _send_headers(name, transaction, headers, persistent), body.encode())

    def send_committed(self, messages: Sequence[tuple[str, str, Mapping[str, str]]]) -> None:
        """Send ``messages`` (queue, body, headers), persistent, in one transaction whose frames are
        one write, and wait for its COMMIT's RECEIPT: once this returns the broker holds every one,
        and a transaction cut short stored none of them.

        One write and one commit a batch, not a frame and a store a message: the driver's
        submissions cost the broker and the proxy what a producer's batches cost them.
        """
        tx = f"tx-{next(self._ids)}"
        frames = [encode("BEGIN", {"transaction": tx})]
        for name, body, headers in messages:
            frames.append(encode("SEND", _send_headers(name, tx, headers, True), body.encode()))
        self._with_receipt("COMMIT", {"transaction": tx}, f"COMMIT {tx}", before=b"".join(frames))

    def begin(self) -> str:
        tx = f"tx-{next(self._ids)}"
        self._write("BEGIN", "BEGIN", {"transaction": tx})
        return tx

    def commit(self, tx: str) -> None:
        """COMMIT and wait for the broker's RECEIPT."""
        self._with_receipt("COMMIT", {"transaction": tx}, f"COMMIT {tx}")

    def abort(self, tx: str) -> None:
        self._with_receipt("ABORT", {"transaction": tx}, f"ABORT {tx}")

    def _with_receipt(
        self, command: str, headers: dict[str, str], what: str, timeout: float = RECEIPT_TIMEOUT_S, before: bytes = b""
    ) -> None:
        """Write ``command`` asking for a RECEIPT (after the frames ``before``, in the same write) and
        read until it comes; a MESSAGE meanwhile is kept."""
        receipt = f"r-{next(self._ids)}"
        self._send_bytes(what, before + encode(command, {**headers, "receipt": receipt}))
        deadline = time.monotonic() + timeout
        while True:
            frame = self._read(max(0.0, deadline - time.monotonic()))
            if frame is None:
                raise HarnessError(f"no RECEIPT for {what} from {self.host}:{self.port} in {timeout}s")
            if frame[0] == "RECEIPT" and frame[1].get("receipt-id") == receipt:
                return
            if frame[0] == "MESSAGE":
                self._held.append(_message(frame[1], frame[2]))

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """DISCONNECT and wait (bounded) for the broker's RECEIPT, so it has let the connection go:
        a new connection under the same client id before then is refused with "already connected"."""
        try:
            if not self._broken:
                self._with_receipt("DISCONNECT", {}, "DISCONNECT", DISCONNECT_WAIT_S)
        except HarnessError:
            pass  # the connection is going away either way
        finally:
            self._broken = self._broken or "closed"
            if self._beats is not None:
                self._beats.stopped.set()
            self._wire.close()

    def __enter__(self) -> StompClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send_headers(
    name: str, transaction: str | None, headers: Mapping[str, str] | None, persistent: bool
) -> dict[str, str]:
    """Return a SEND frame's headers: ``headers``, persistence, the transaction and the destination."""
    sent = {"persistent": "true" if persistent else "false", **(headers or {})}
    if transaction:
        sent["transaction"] = transaction
    sent["destination"] = queue_dest(name)
    return sent


def _message(headers: dict[str, str], body: bytes) -> Message:
    return Message(body.decode(), headers, headers.get("destination", ""), headers.get("subscription", ""))


def drain(client: StompClient, names: list[str], *, idle_s: float = 0.2, max_s: float = 30.0) -> Iterator[Message]:
    """Consume and ack everything in ``names`` until no message arrives for ``idle_s`` seconds."""
    subs = [client.subscribe(n, ack="client-individual", prefetch=500) for n in names]
    deadline = time.monotonic() + max_s
    try:
        while time.monotonic() < deadline:
            msg = client.receive(idle_s)
            if msg is None:
                return
            client.ack(msg)
            yield msg
    finally:
        for sub in subs:
            client.unsubscribe(sub)
