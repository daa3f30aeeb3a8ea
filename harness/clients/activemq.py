"""The only module importing stomp.py: ActiveMQ Classic over STOMP 1.2.

Defaults follow BROKER_FACTS.md: ``client-individual`` acks, ``activemq.prefetchSize:1``,
heart-beats (1000, 1000) so a hung consumer is dropped, ``persistent:true`` on every SEND
(a non-persistent message NACKed is silently lost), and a RECEIPT on COMMIT so "committed"
in the ledger means the broker said so.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import stomp
from stomp.exception import StompException

from harness.errors import HarnessError

# stomp.py logs each refused connect attempt as a warning; with no logging configured, Python prints
# those on stderr, in the middle of a soak's progress while the nemesis has the broker down. This
# client retries and raises a HarnessError that says what failed, so the library's own lines go to a
# null handler (a program that configures logging still gets them through propagation).
logging.getLogger("stomp.py").addHandler(logging.NullHandler())

# Workers (the system under test) beat every second so a hung one is dropped (BROKER_FACTS.md).
# The harness's own connections pass heartbeats=(0, 0): on a starved 2-core machine a missed
# beat would kill the harness's eye, not the system under test.
HEARTBEATS = (1000, 1000)
RECEIPT_TIMEOUT_S = 10.0
DISCONNECT_WAIT_S = 2.0


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


@dataclass
class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    inbox: queue.Queue[Message] = field(default_factory=queue.Queue)
    receipts: dict[str, threading.Event] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)

    def on_message(self, frame: Any) -> None:
        headers = dict(frame.headers)
        self.inbox.put(Message(frame.body, headers, headers.get("destination", ""), headers.get("subscription", "")))

    def on_receipt(self, frame: Any) -> None:
        event = self.receipts.get(frame.headers.get("receipt-id", ""))
        if event is not None:
            event.set()

    def on_error(self, frame: Any) -> None:
        self.errors.append(f"{frame.headers.get('message', '')} {frame.body or ''}".strip())
        for event in self.receipts.values():
            event.set()  # an ERROR ends the connection: nobody should wait out the receipt timeout

    def on_disconnected(self) -> None:
        self.disconnected.set()


class StompClient:
    """One STOMP connection: subscribe, receive, transactions, ack/nack, send.

    >>> with StompClient("127.0.0.1", 61613) as c:
    ...     c.send("orders", '{"op": "op-1"}')
    """

    def __init__(
        self, host: str, port: int, *, client_id: str | None = None, heartbeats: tuple[int, int] = HEARTBEATS
    ) -> None:
        self.host, self.port = host, port
        self._listener = _Listener()
        self._ids = itertools.count(1)
        self._conn = stomp.Connection12(
            [(host, port)], heartbeats=heartbeats, reconnect_attempts_max=1, auto_content_length=True
        )
        self._conn.set_listener("txchaos", self._listener)
        try:
            self._conn.connect(wait=True, headers={"client-id": client_id or f"txchaos-{uuid.uuid4().hex[:8]}"})
        except (StompException, OSError) as exc:
            said = "; ".join(self._listener.errors)  # the broker's ERROR frame, e.g. "already connected"
            raise HarnessError(
                f"STOMP connect to {host}:{port} failed: {exc!r}{f' ({said})' if said else ''}",
                hint="is the broker up (`txchaos status`) and the activemq_stomp proxy enabled?",
            ) from exc
        # stomp.py leaves Nagle on: a small frame then waits for the peer's delayed ACK (~40 ms
        # a message through Toxiproxy). The broker side already sets transport.tcpNoDelay.
        sock = getattr(self._conn.transport, "socket", None)
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._subs: dict[str, str] = {}

    # -- consuming -------------------------------------------------------------------------
    def subscribe(self, name: str, *, ack: str = "client-individual", prefetch: int = 1) -> str:
        """Subscribe to queue ``name``; returns the subscription id."""
        sub_id = f"sub-{next(self._ids)}"
        with self._frame(f"SUBSCRIBE {name}"):
            self._conn.subscribe(queue_dest(name), id=sub_id, ack=ack, headers={"activemq.prefetchSize": str(prefetch)})
        self._subs[sub_id] = name
        return sub_id

    def unsubscribe(self, sub_id: str) -> None:
        with self._frame(f"UNSUBSCRIBE {sub_id}"):
            self._conn.unsubscribe(id=sub_id)
        self._subs.pop(sub_id, None)

    def held(self, names: list[str], *, timeout: float = 5.0) -> int:
        """Return how many messages the queues ``names`` hold now, delivered to a consumer or not.

        A queue browser (``browser: true``): the broker sends each message it holds, then one marked
        ``browser: end``; nothing is consumed. Measured on the local stack: about 1 ms for an empty
        queue, where waiting to see that nothing arrives takes as long as the wait. Raises
        ``HarnessError`` when a browse does not end within ``timeout`` seconds.
        """
        if self._subs:  # their messages share the inbox the browse reads
            subscribed = sorted(self._subs.values())
            raise HarnessError(f"browse on a client subscribed to {subscribed}: use a client of its own")
        ended: set[str] = set()
        count = 0
        deadline = time.monotonic() + timeout
        subs = []
        for name in names:
            sub_id = f"browse-{next(self._ids)}"
            with self._frame(f"SUBSCRIBE {name} (browser)"):
                self._conn.subscribe(queue_dest(name), id=sub_id, ack="auto", headers={"browser": "true"})
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
        self._raise_if_broken()
        try:
            return self._listener.inbox.get(timeout=timeout)
        except queue.Empty:
            self._raise_if_broken()
            return None

    def ack(self, msg: Message, *, transaction: str | None = None) -> None:
        # stomp.py 9 / STOMP 1.2: the second positional argument is the transaction.
        with self._frame("ACK"):
            self._conn.ack(msg.ack_id, transaction=transaction)

    def nack(self, msg: Message, *, transaction: str | None = None) -> None:
        """NACK ``msg``; outside any transaction, as the broker answers a transacted NACK with ERROR.

        ``transaction`` exists only so tests can prove that rejection (tests/integration/test_activemq_facts.py).
        """
        with self._frame("NACK"):
            self._conn.nack(msg.ack_id, transaction=transaction)

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
        all_headers = {"persistent": "true" if persistent else "false", **(headers or {})}
        if transaction:
            all_headers["transaction"] = transaction
        with self._frame(f"SEND {name}"):
            self._conn.send(queue_dest(name), body, headers=all_headers)

    def begin(self) -> str:
        tx = f"tx-{uuid.uuid4().hex[:12]}"
        with self._frame("BEGIN"):
            self._conn.begin(transaction=tx)
        return tx

    def commit(self, tx: str) -> None:
        """COMMIT and wait for the broker's RECEIPT."""
        self._with_receipt(lambda r: self._conn.commit(transaction=tx, headers={"receipt": r}), f"COMMIT {tx}")

    def abort(self, tx: str) -> None:
        self._with_receipt(lambda r: self._conn.abort(transaction=tx, headers={"receipt": r}), f"ABORT {tx}")

    def _with_receipt(self, send: Any, what: str) -> None:
        receipt = f"r-{uuid.uuid4().hex[:12]}"
        event = self._listener.receipts[receipt] = threading.Event()
        try:
            with self._frame(what):
                send(receipt)
            if not event.wait(RECEIPT_TIMEOUT_S):
                raise HarnessError(f"no RECEIPT for {what} from {self.host}:{self.port} in {RECEIPT_TIMEOUT_S}s")
        finally:
            self._listener.receipts.pop(receipt, None)
        self._raise_if_broken()

    @contextlib.contextmanager
    def _frame(self, what: str) -> Iterator[None]:
        """Turn stomp.py's and the socket's errors while sending a frame into a HarnessError."""
        try:
            yield
        except (StompException, OSError) as exc:
            raise HarnessError(f"STOMP {what} to {self.host}:{self.port} failed: {exc!r}") from exc

    def _raise_if_broken(self) -> None:
        if self._listener.errors:
            raise HarnessError(f"broker ERROR frame: {self._listener.errors[-1]}")
        if self._listener.disconnected.is_set():
            raise HarnessError(f"STOMP connection to {self.host}:{self.port} lost")

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """DISCONNECT and wait (bounded) for the broker's RECEIPT, so it has let the connection go."""
        receipt = f"bye-{uuid.uuid4().hex[:12]}"
        event = self._listener.receipts[receipt] = threading.Event()
        try:
            if self._conn.is_connected():
                self._conn.disconnect(receipt=receipt)
                # stomp.py asks for the RECEIPT but does not wait for it; a new connection under
                # the same client id before it is refused with "already connected".
                event.wait(DISCONNECT_WAIT_S)
        except (StompException, OSError):
            pass  # the connection is going away either way
        finally:
            self._listener.receipts.pop(receipt, None)

    def __enter__(self) -> StompClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
