"""The stage runtime: a best-effort 1PC transaction around a user's handler (Mats3 style).

For each message: begin a STOMP transaction, open a DB transaction, run the handler (its
outgoing messages go into the STOMP transaction), commit the DB, then ack and commit the
broker. Crash points sit between the steps; the gap between ``db_commit`` and
``broker_commit`` is the window the seeds warn about. On a handler error both transactions
roll back and the message is NACKed (the broker redelivers or dead-letters it).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from harness.clients import db
from harness.clients.activemq import Message, StompClient, dlq_name
from harness.errors import HarnessError
from harness.jsontext import dumps, loads
from harness.ledger.schema import Kind
from harness.worker.base import ContextBase, WorkerRuntime, load_handler
from harness.worker.crash import ForcedRedelivery
from harness.worker.spec import WorkerSpec

__all__ = ["Handler", "StageContext", "StageWorker", "load_handler"]


@dataclass
class StageContext(ContextBase):
    """What a stage handler gets: the message, the stage's DB connection and a way to send.

    ``db`` is inside the stage transaction; ``send`` joins the broker transaction, so both
    commit or roll back with the stage. ``side`` is a separate autocommit connection: what is
    written there stays written whatever happens to the stage (attempt counters, the state of
    an external call). ``dead_letter`` diverts the message to the dead-letter queue with an alert.
    """

    message: Message
    _send: Callable[[dict[str, Any], str | None, str | None], None]
    _dlq: str
    sent: list[dict[str, Any]] = field(default_factory=list)

    def dead_letter(self, reason: str) -> None:
        """Divert this message to the dead-letter queue (in the stage transaction) and alert."""
        self._send({**self.body, "txchaos_reason": reason}, self._dlq, None)
        self._record(Kind.ALERT, reason=reason)

    def send(self, body: dict[str, Any], dest: str | None = None, *, key: str | None = None) -> None:
        """Send ``body`` to ``dest`` (default: the stage's output queue) in the stage transaction,
        tagged with operation ``key`` (default: this message's)."""
        self._send(body, dest, key)
        self.sent.append(body)


Handler = Callable[[StageContext], None]


class StageWorker(WorkerRuntime):
    """Consume ``spec.input_queue`` and run the stage until SIGTERM."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.handler: Handler = load_handler(spec.handler)
        self._sub = ""

    def serve(self) -> None:
        ep = self.endpoints.stomp
        for n in itertools.count():  # one pass per connection: a forced disconnect opens a new one
            if self.stop.is_set():
                break
            # A fresh client id per connection: the broker drops the old connection asynchronously
            # after DISCONNECT, and reusing its id answers "already connected" and kills the worker,
            # a different fault than the disconnect that was armed (issue 12 finding 9).
            client_id = f"{self.spec.name}.{os.getpid()}.{n}"
            with StompClient(ep.host, ep.port, client_id=client_id) as client:
                self._sub = self._subscribe(client)
                self.ready()
                while not self.stop.is_set():
                    msg = client.receive(0.2)
                    if msg is not None and not self.process(client, msg):
                        break  # the connection was dropped on purpose

    def _subscribe(self, client: StompClient) -> str:
        """Subscribe to the input queue with ``client`` acks, one message in flight.

        With a prefetch of 1 a ``client`` ACK (cumulative) acks exactly the one message a
        ``client-individual`` ACK would. ``client-individual`` ACKs made in transactions are never
        dropped by ActiveMQ's STOMP subscription (6.1.8 clears its list of transacted acks on
        COMMIT in ``client`` mode only), and every COMMIT scans that list: a subscription's commits
        slow as it ages (``txchaos bench acks``; a 100,000-op soak fell from 462 to 267 ops/s with
        90 % of the broker's CPU in that scan, and holds about 500 with ``client`` acks).
        """
        return client.subscribe(self.spec.input_queue, ack="client", prefetch=1)

    def _give_back(self, client: StompClient, msg: Message, tx: str, action: str) -> bool:
        """Perform a forced redelivery; returns False when the connection must be dropped."""
        if action == "disconnect":
            return False  # closing the connection rolls the transaction back and releases the message
        client.abort(tx)
        if action == "nack":
            client.nack(msg)
        elif action == "abort_unsubscribe":
            # ABORT alone keeps the message in flight (BROKER_FACTS.md); unsubscribing releases it.
            client.unsubscribe(self._sub)
            self._sub = self._subscribe(client)
        return True

    def process(self, client: StompClient, msg: Message) -> bool:
        """Run the stage on ``msg``; returns False when the worker must reconnect."""
        body = loads(msg.body)
        op = str(body["op"])
        stage, mid = self.spec.stage, msg.message_id
        emit = self.ledger.emit

        # The arms are read once a message: a point no arm names is only counted (no stat of arms.json).
        reach = partial(self.crash.reach_armed, self.crash.armed_points(), op=op, msg=mid, stage=stage)

        # STOMP has no delivery count (BROKER_FACTS.md): count per message id in this process,
        # and trust the broker's redelivered flag across a restart of the worker.
        self.attempts[mid] += 1
        attempt = max(self.attempts[mid], 2 if msg.redelivered else 1)
        emit(
            Kind.DELIVER,
            op=op,
            msg=mid,
            stage=stage,
            dest=self.spec.input_queue,
            attempt=attempt,
            redelivered=msg.redelivered,
        )
        tx = client.begin()

        def send(out: dict[str, Any], dest: str | None, key: str | None) -> None:
            target = dest or self.spec.output_queue
            if target is None:
                raise ValueError(f"stage {stage} has no output queue; pass dest=")
            client.send(target, dumps(out), transaction=tx, headers={"txchaos-op": key or op})
            emit(Kind.SEND, op=op, msg=mid, stage=stage, dest=target)

        try:
            conn = self.stage_db()
            trans = conn.begin()
            try:
                ctx = StageContext(
                    op=op,
                    body=body,
                    db=conn,
                    options=self.spec.options,
                    worker=self.spec.name,
                    stage=stage,
                    _record=lambda kind, **d: emit(kind, op=op, msg=mid, stage=stage, **d),
                    _crash=reach,
                    _side=self.side,
                    message=msg,
                    _send=send,
                    _dlq=dlq_name(self.spec.input_queue),
                )
                # The handler's events (its effect, its sends) in one write: nothing of them must be on
                # disk before the commit, and a crash point it reaches flushes before it kills.
                with self.ledger.batch():
                    self.handler(ctx)
                reach("before_db_commit")
                trans.commit()
            except BaseException:
                trans.rollback()
                emit(Kind.DB_ROLLBACK, op=op, msg=mid, stage=stage)
                raise
            emit(Kind.DB_COMMIT, op=op, msg=mid, stage=stage)
            reach("after_db_commit")
            client.ack(msg, transaction=tx)
            client.commit(tx)
            emit(Kind.BROKER_COMMIT, op=op, msg=mid, stage=stage)
            self.attempts.pop(mid, None)  # committed: never delivered again, so no count to keep
            reach("after_broker_commit")
        except ForcedRedelivery as forced:
            if forced.point == "after_broker_commit":
                return True  # already committed: nothing left to give back
            return self._give_back(client, msg, tx, forced.action)
        except Exception as exc:
            fatal = isinstance(exc, HarnessError) or db.is_connection_error(exc)
            emit(Kind.ERROR, op=op, msg=mid, stage=stage, error=repr(exc)[:500], fatal=fatal)
            if fatal:
                raise  # infrastructure trouble: die; the supervisor restarts us and the broker redelivers
            client.abort(tx)
            emit(Kind.BROKER_ABORT, op=op, msg=mid, stage=stage)
            # ABORT alone leaves the message in flight until unsubscribe (BROKER_FACTS.md): NACK it.
            client.nack(msg)
            emit(Kind.NACK, op=op, msg=mid, stage=stage)
        return True
