"""The ActiveMQ bare loop: best-effort 1PC stages with psycopg and a raw-socket STOMP client.

Each worker process does per message what the harness's stage (``harness/worker/stage.py``
running ``harness.patterns.onepc:check_then_skip``) does, in the same order: receive the message
(``client`` acks, ``activemq.prefetchSize:1``); STOMP BEGIN; a Postgres transaction
(psycopg, autocommit off) that looks for the effect (``SELECT 1 ... WHERE op_id = %s``) and
inserts it when it is not there; SEND the outgoing message (persistent) in the STOMP
transaction; Postgres COMMIT; ACK in the STOMP transaction; STOMP COMMIT and wait for its
RECEIPT. Every frame is its own write on a TCP_NODELAY socket, as the stage writes them. What it
leaves out is the harness: no ledger, no crash points, no supervisor, no SQLAlchemy, and no
heart-beats (the stage's 1 s beats are not per-message work).

The STOMP client is the smallest one that works: a raw socket read on the worker's own thread, its
frames built and split by hand. The harness's ``StompClient`` reads on the caller's thread too
(since 2026-11-29), but stomp.py parses its frames and unescapes their headers, and it sends
heart-beats from a thread of its own. Before that, it was stomp.py's ``Connection``, which hands
every frame from a receiver thread to the worker through a queue or an event: measured on the
soak pairs' stack (10,000 messages, 4 workers, 2 cores), the workers' CPU was 20.1-20.8 s on it
against 11.4-12.9 s raw, CPU the broker, Postgres and Toxiproxy would otherwise have.

``clients="libraries"`` runs the same loop on the clients the stage itself is built on: the
harness's ``StompClient`` and a SQLAlchemy ``Connection`` with the statements built once
(``text()``), as the built-in handlers run them. Between the two loops lies what those clients
cost; between the libraries' loop and a soak lies what the harness itself adds (ledger, crash
points, supervision, the driver). The soak benchmark runs both beside each soak.

Frame headers are passed through as the broker wrote them: STOMP 1.2 escapes ``:`` in header
values (``message-id:ID\\c...``), and the ``ack`` id goes back in the ACK escaped the same way, so
nothing needs unescaping.
"""

from __future__ import annotations

import json
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from harness.bench.bare_loop import BareResult, Crew, Hand, address, cleaned_up, pg_connect, pg_run, suffix
from harness.clients import db
from harness.clients.activemq import Message, StompClient, encode, split_frame, take_frame
from harness.errors import HarnessError
from harness.stack.base import Endpoints

RECEIPT_S = 10.0
Work = Callable[[Any, str, int, int], None]  # (message, op, amount, messages done before it): one message's work
FILL_CHUNK = 500  # messages per producer transaction (the cheapest way to the broker: a limit may use it)


@dataclass(frozen=True)
class Frame:
    """A STOMP frame as received; header values still escaped (STOMP 1.2) as the broker sent them."""

    command: str
    headers: dict[str, str]
    body: bytes


class RawStomp:
    """One STOMP 1.2 connection on a blocking socket, read and written on the caller's thread."""

    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.where = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._held: deque[Frame] = deque()  # MESSAGE frames that came while waiting for a RECEIPT
        self.write("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0", "client-id": client_id})
        frame = self._read(10.0)
        if frame is None or frame.command != "CONNECTED":
            raise HarnessError(f"STOMP connect to {self.where} answered {frame!r}")

    def write(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.sock.sendall(encode(command, headers, body, escape=False))  # values passed through as received

    def _parse(self) -> Frame | None:
        taken = take_frame(self._buf)
        if taken is None:
            return None
        return Frame(*split_frame(*taken, unescape=False))

    def _read(self, timeout: float) -> Frame | None:
        """Return the next frame off the wire, or None after ``timeout`` seconds; raise on ERROR."""
        deadline = time.monotonic() + timeout
        while (frame := self._parse()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise HarnessError(f"STOMP connection to {self.where} closed by the broker")
            self._buf += chunk
        if frame.command == "ERROR":
            raise HarnessError(f"broker ERROR frame: {frame.headers.get('message', '')} {frame.body!r}")
        return frame

    def receive(self, timeout: float) -> Frame | None:
        """Return the next MESSAGE frame, or None after ``timeout`` seconds."""
        if self._held:
            return self._held.popleft()
        frame = self._read(timeout)
        if frame is not None and frame.command != "MESSAGE":
            raise HarnessError(f"unexpected {frame.command} frame from {self.where}")
        return frame

    def await_receipt(self, receipt: str) -> None:
        """Read until the RECEIPT for ``receipt``; a MESSAGE meanwhile is kept for ``receive``."""
        deadline = time.monotonic() + RECEIPT_S
        while True:
            frame = self._read(deadline - time.monotonic())
            if frame is None:
                raise HarnessError(f"no RECEIPT {receipt} from {self.where} in {RECEIPT_S} s")
            if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt:
                return
            if frame.command == "MESSAGE":
                self._held.append(frame)

    def subscribe(self, queue: str, *, ack: str, prefetch: int) -> None:
        headers = {"id": "0", "destination": f"/queue/{queue}", "ack": ack, "activemq.prefetchSize": str(prefetch)}
        self.write("SUBSCRIBE", {**headers, "receipt": "subscribed"})
        self.await_receipt("subscribed")

    def close(self) -> None:
        """DISCONNECT (waiting briefly for its RECEIPT) and close the socket."""
        try:
            self.write("DISCONNECT", {"receipt": "bye"})
            self.await_receipt("bye")
        except (OSError, HarnessError):
            pass  # the connection goes either way
        finally:
            self.sock.close()


@dataclass(frozen=True)
class _Job:
    """What every process of one ActiveMQ bare loop needs to know."""

    endpoints: Endpoints
    via_proxy: bool
    table: str
    queue_in: str
    queue_out: str
    messages: int
    clients: str = "raw"

    def stomp(self, client_id: str) -> RawStomp:
        return RawStomp(*address(self.endpoints.stomp, self.via_proxy), client_id)


def _serve(hand: Hand, subscribe: Callable[[], object], receive: Callable[[float], Any], work: Work) -> None:
    """The stage's loop, whatever its clients: subscribe, then ``work`` on each message until told
    to stop; reports ("done", (count, first message's time))."""
    done, first = 0, 0.0
    if not hand.ready_then_go():
        return
    subscribe()  # ``client`` acks, prefetch 1: the stage's (``StageWorker._subscribe``)
    while not hand.stop.is_set():
        msg = receive(0.2)
        if msg is None:
            continue
        first = first or time.monotonic()
        body = json.loads(msg.body)
        work(msg, str(body["op"]), int(body.get("amount", 1)), done)
        done += 1
    hand.report("done", (done, first))


def _stage(hand: Hand, job: _Job) -> None:
    """One worker on the raw clients: a socket STOMP connection and psycopg."""
    pg = pg_connect(job.endpoints, job.via_proxy)
    stomp = job.stomp(f"bare-{hand.name}")
    select = f"SELECT 1 FROM {job.table} WHERE op_id = %s LIMIT 1"
    insert = f"INSERT INTO {job.table} (op_id, worker, amount) VALUES (%s, %s, %s)"
    out = f"/queue/{job.queue_out}"

    def work(msg: Frame, op: str, amount: int, n: int) -> None:
        tx = f"{hand.name}-{n}"
        stomp.write("BEGIN", {"transaction": tx})
        if pg.execute(select, (op,)).fetchone() is None:
            pg.execute(insert, (op, hand.name, amount))
        forward = json.dumps({"op": op, "from": "bare"}).encode()
        stomp.write("SEND", {"destination": out, "persistent": "true", "transaction": tx, "txchaos-op": op}, forward)
        pg.commit()
        stomp.write("ACK", {"id": msg.headers["ack"], "transaction": tx})
        stomp.write("COMMIT", {"transaction": tx, "receipt": tx})
        stomp.await_receipt(tx)

    try:
        _serve(hand, lambda: stomp.subscribe(job.queue_in, ack="client", prefetch=1), stomp.receive, work)
    finally:
        stomp.close()
        pg.close()


def _stage_on_libraries(hand: Hand, job: _Job) -> None:
    """One worker on the stage's own clients: the harness's ``StompClient`` and a SQLAlchemy connection."""
    engine = db.engine("postgresql+psycopg://", pool_size=1, creator=lambda: pg_connect(job.endpoints, job.via_proxy))
    conn = engine.connect()
    stomp = StompClient(*address(job.endpoints.stomp, job.via_proxy), client_id=f"bare-{hand.name}")
    select = text(f"SELECT 1 FROM {job.table} WHERE op_id = :op LIMIT 1")
    insert = text(f"INSERT INTO {job.table} (op_id, worker, amount) VALUES (:op, :worker, :amount)")

    def work(msg: Message, op: str, amount: int, n: int) -> None:
        tx = stomp.begin()
        trans = conn.begin()
        if conn.execute(select, {"op": op}).first() is None:
            conn.execute(insert, {"op": op, "worker": hand.name, "amount": amount})
        stomp.send(job.queue_out, json.dumps({"op": op, "from": "bare"}), transaction=tx, headers={"txchaos-op": op})
        trans.commit()
        stomp.ack(msg, transaction=tx)
        stomp.commit(tx)  # waits for its RECEIPT

    try:
        _serve(hand, lambda: stomp.subscribe(job.queue_in, ack="client", prefetch=1), stomp.receive, work)
    finally:
        stomp.close()
        conn.close()
        engine.dispose()


def _sink(hand: Hand, job: _Job) -> None:
    """Drain the output queue until every operation came out; reports ("drained", (ops, frames, last))."""
    stomp = job.stomp(f"bare-{hand.name}")
    seen: set[str] = set()
    frames, last = 0, 0.0
    try:
        stomp.subscribe(job.queue_out, ack="auto", prefetch=1000)
        if not hand.ready_then_go():
            return
        while len(seen) < job.messages and not hand.stop.is_set():
            msg = stomp.receive(0.2)
            if msg is not None:
                last = time.monotonic()
                frames += 1
                seen.add(msg.headers.get("txchaos-op", ""))
        hand.report("drained", (len(seen), frames, last))
    finally:
        stomp.close()


def _producer(hand: Hand, job: _Job, prefix: str) -> None:
    """Put ``job.messages`` persistent messages on the input queue, a STOMP transaction a chunk,
    from the start on, as the workers consume; reports ("filled", first send's time)."""
    stomp = job.stomp(f"bare-{hand.name}")
    dest = f"/queue/{job.queue_in}"
    try:
        if not hand.ready_then_go():
            return
        first = time.monotonic()
        for start in range(0, job.messages, FILL_CHUNK):
            if hand.stop.is_set():
                return
            tx = f"fill-{start}"
            frames = [encode("BEGIN", {"transaction": tx})]
            for i in range(start, min(start + FILL_CHUNK, job.messages)):
                body = json.dumps({"op": f"{prefix}-{i}", "amount": 1}).encode()
                frames.append(encode("SEND", {"destination": dest, "persistent": "true", "transaction": tx}, body))
            frames.append(encode("COMMIT", {"transaction": tx, "receipt": tx}))
            stomp.sock.sendall(b"".join(frames))
            stomp.await_receipt(tx)
        hand.report("filled", first)
        hand.stop.wait()  # a process that ends early reads as a crash to the crew
    finally:
        stomp.close()


def _cleanup(job: _Job) -> None:
    """Consume whatever is left on the loop's queues, then drop its table. (ActiveMQ over STOMP
    cannot delete a queue, and this broker runs without JMX: the queues stay, empty.)"""
    try:
        for name in (job.queue_in, job.queue_out):
            stomp = job.stomp(f"bare-empty-{name}")
            try:
                stomp.subscribe(name, ack="auto", prefetch=1000)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and stomp.receive(0.3) is not None:
                    pass
            finally:
                stomp.close()
    finally:
        pg_run(job.endpoints, job.via_proxy, f"DROP TABLE IF EXISTS {job.table}")


# The stage's work per message, on the raw clients (the machine's limit) or on the stage's own.
CLIENTS = {"raw": _stage, "libraries": _stage_on_libraries}


def bare_activemq(
    endpoints: Endpoints, *, messages: int = 20000, workers: int = 4, via_proxy: bool = True, clients: str = "raw"
) -> BareResult:
    """Run ``workers`` bare 1PC stage processes over ``messages`` messages; return the figure.

    A producer puts the messages on the input queue from the start, as the workers consume them
    (a soak submits while its flow runs, so the broker takes both at once). The clock runs from
    the producer's first send to the last output the sink drained, as a soak's runs from its first
    submission; ``consume_seconds`` from the first message a worker consumed.
    Raises ``HarnessError`` unless every message left exactly one effect row and one output.
    """
    if messages < 1 or workers < 1:
        raise ValueError(f"messages={messages}, workers={workers}: both must be >= 1")
    if clients not in CLIENTS:
        raise ValueError(f"clients={clients!r}: use one of {', '.join(CLIENTS)}")
    tag = suffix()
    job = _Job(
        endpoints,
        via_proxy,
        f"bare_effects_{tag}",
        f"txchaos.bare.{tag}.in",
        f"txchaos.bare.{tag}.out",
        messages,
        clients,
    )
    stage = CLIENTS[clients]
    names = [f"w{i}" for i in range(workers)]
    with cleaned_up(lambda: _cleanup(job)):
        pg_run(
            endpoints,
            via_proxy,
            f"CREATE TABLE {job.table} (id bigserial PRIMARY KEY, op_id text NOT NULL, worker text NOT NULL, "
            "amount integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
            f"CREATE INDEX ON {job.table} (op_id)",
        )
        deadline = time.monotonic() + 120 + messages / 20
        with Crew() as crew:
            crew.spawn("sink", _sink, job)
            crew.spawn("producer", _producer, job, f"bare-{tag}")
            for name in names:
                crew.spawn(name, stage, job)
            crew.start_all(deadline)
            reports = crew.collect_each({"sink": "drained", "producer": "filled"}, deadline)
            ops, frames, last = reports["sink"]
            crew.stop.set()
            done = crew.collect("done", names, deadline)
            roles = crew.roles(names)
        firsts = [first for _, first in done.values() if first]
        count, distinct = pg_run(endpoints, via_proxy, f"SELECT count(*), count(DISTINCT op_id) FROM {job.table}")[0]
        processed = sum(n for n, _ in done.values())
        if not (count == distinct == ops == frames == processed == messages) or not firsts:
            raise HarnessError(
                f"ActiveMQ bare loop lost or doubled messages: {messages} sent, {processed} processed, "
                f"{count} effect rows ({distinct} ops), {frames} outputs ({ops} ops)"
            )
    seconds, consuming = last - reports["producer"], last - min(firsts)
    return BareResult("activemq", messages, seconds, workers, via_proxy, count, consuming, clients, roles)
