"""The sink: drains the flow's output queue and dead-letter queue, recording what came out."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from harness.clients import db
from harness.clients.activemq import Message, StompClient, dlq_name, drain
from harness.errors import HarnessError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.transports.base import RunRecord
from harness.run.transports.sink import SinkBase
from harness.stack.base import Endpoint


def op_of(msg: Message) -> str | None:
    """Return the operation id of a message: the txchaos-op header, else the body's ``op``."""
    if "txchaos-op" in msg.headers:
        return msg.headers["txchaos-op"]
    try:
        return str(json.loads(msg.body)["op"])
    except (ValueError, KeyError, TypeError):
        return None


MAX_RECONNECTS = 20  # failed connects in a row: a broker away this long (about 30 s of waits) is not coming back
ACK_EVERY = 100  # messages a subscription may hold unacked before the sink acks them together
PREFETCH = 500  # the broker dispatches ahead of the acks; more than ACK_EVERY, so it never waits for one


@dataclass
class Acks:
    """The sink's cumulative acks: one ACK per ``ACK_EVERY`` messages (or idle moment) a subscription.

    The sink subscribes with ``client`` acks, so an ACK of a subscription's last message acks every
    message it had before. One ACK a message cost the broker, the proxy and the sink about 3.7 s of
    CPU per 20,000 messages more (measured on the local stack: broker 6.0 against 4.0 s, proxy
    2.6 against 1.5 s, the sink 2.7 against 2.2 s); on two cores every second of that is taken
    from the flow under test.

    What the sink recorded but has not acked comes back after a reconnect, marked redelivered.
    The harness reading an output twice is not the flow sending it twice, so ``seen`` keeps the
    message ids recorded since the last ACK went out, and ``fresh`` is False for those: they are
    acked again, not recorded again. A message a flow really sends twice is two messages, with
    two ids.
    """

    every: int = ACK_EVERY
    last: dict[str, Message] = field(default_factory=dict)  # subscription -> its last message unacked
    seen: set[str] = field(default_factory=set)  # ids recorded, not yet acked (kept across reconnects)
    held: int = 0

    def fresh(self, msg: Message) -> bool:
        """Take ``msg`` to ack later; True when the sink has not recorded it yet."""
        self.last[msg.subscription] = msg
        self.held += 1
        if msg.message_id in self.seen:
            return False
        self.seen.add(msg.message_id)
        return True

    def due(self) -> bool:
        return self.held >= self.every

    def flush(self, client: StompClient) -> None:
        """Ack every subscription's messages so far (a connection that fails here keeps ``seen``)."""
        for msg in self.last.values():
            client.ack(msg)
        self.last.clear()
        self.seen.clear()
        self.held = 0

    def reconnected(self) -> None:
        """Forget the old connection's messages to ack (they come back); keep what was recorded."""
        self.last.clear()
        self.held = 0


@dataclass
class Reconnects:
    """The sink's budget of failures: those since its last good connection, not those of the whole run.

    A soak kills the broker again and again (every few minutes in the default mix, every 10 s when
    named alone); each kill costs the sink its connection and a refused connect or a few while the
    broker is down. A budget for the whole run was spent after about ten kills: the sink died,
    nothing came out any more, and the soak's closed loop waited for it. A broker that refuses
    every connect for about 30 s still ends the sink, as it should.
    """

    limit: int = MAX_RECONNECTS
    in_row: int = 0

    def failed(self, *, connected: bool) -> bool:
        """Count a failure (``connected``: of a connection that had subscribed); True when spent."""
        self.in_row = 1 if connected else self.in_row + 1
        return self.in_row > self.limit

    @property
    def wait_s(self) -> float:
        """How long to wait before the next attempt."""
        return min(0.2 * self.in_row, 2.0)


class Sink(SinkBase):
    """Consume ``output`` (if any) and the DLQ of every input queue in a thread until ``stop``."""

    def __init__(
        self, stomp: Endpoint, ledger: LedgerWriter, *, input_queues: list[str], output_queue: str | None
    ) -> None:
        queues = {dlq_name(q): Kind.DEAD_LETTER for q in input_queues}
        if output_queue:
            queues[output_queue] = Kind.DOWNSTREAM
        super().__init__(ledger, queues, name="sink")
        self.stomp = stomp
        self.queues = queues
        self._connected = False  # whether the current attempt's connection subscribed
        self._acks = Acks()

    def _run(self) -> None:
        # The sink is the harness's eye, not the system under test: a lost connection (a Toxiproxy
        # cut, a broker restart) is reconnected, and unacked messages come back to the new one.
        budget = Reconnects()
        while not self._stop.is_set():
            self._connected = False
            self._acks.reconnected()
            try:
                self._consume()
                return
            except HarnessError as exc:
                spent = budget.failed(connected=self._connected)
                self.ledger.emit(Kind.ERROR, stage="sink", error=str(exc)[:300], reconnect=budget.in_row)
                if spent:
                    self._error = exc
                    return
                self._stop.wait(budget.wait_s)
            except BaseException as exc:  # surfaced by check(): a dead sink must fail the run, not hang it
                self._error = exc
                return

    def _consume(self) -> None:
        with StompClient(self.stomp.host, self.stomp.port, client_id="txchaos-sink", heartbeats=(0, 0)) as client:
            subs = {client.subscribe(q, ack="client", prefetch=PREFETCH): q for q in self.queues}
            self._connected = True
            acks = self._acks
            while not self._stop.is_set():
                msg = client.receive(0.05)
                if msg is None:
                    acks.flush(client)  # idle: what came is recorded, so ack it
                    continue
                if acks.fresh(msg):
                    queue = subs.get(msg.subscription, "")
                    op = self.op_in(msg.headers, msg.body, op_of(msg))
                    kind = self.queues.get(queue, Kind.DOWNSTREAM)
                    self.ledger.emit(kind, op=op, msg=msg.message_id, dest=queue, redelivered=msg.redelivered)
                    self._saw(op)
                if acks.due():
                    acks.flush(client)
            # Stopping on a dropped connection: what was recorded goes back to the queue, unread.
            with contextlib.suppress(HarnessError):
                acks.flush(client)


@dataclass(frozen=True)
class QueueResidue:
    """Every message still in the stage queues is a ``residue_queue`` (drained: the workers are gone)."""

    stomp: Endpoint
    queues: tuple[str, ...]
    ledger: LedgerWriter
    record: RunRecord
    idle_s: float

    def close(self, engine: db.Engine) -> None:
        ep = self.stomp
        with StompClient(ep.host, ep.port, client_id="txchaos-residue", heartbeats=(0, 0)) as client:
            # The workers are gone: queues the broker says hold nothing (not even a message a dead
            # worker had) are empty, and nothing is waited for. Else a queue that stays empty this
            # long after the last message drained is empty.
            if client.held(list(self.queues)) == 0:
                self.record.step(f"no residue in {', '.join(self.queues)}")
                return
            for msg in drain(client, list(self.queues), idle_s=self.idle_s):
                dest = msg.headers.get("destination", "").removeprefix("/queue/") or self.queues[0]
                self.ledger.emit(Kind.RESIDUE_QUEUE, op=op_of(msg), msg=msg.message_id, dest=dest)
        self.record.step(f"drain residue of {', '.join(self.queues)}")
