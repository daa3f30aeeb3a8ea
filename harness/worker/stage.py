"""The stage runtime: a best-effort 1PC transaction around a user's handler (Mats3 style).

For each message: begin a STOMP transaction, open a DB transaction, run the handler (its
outgoing messages go into the STOMP transaction), commit the DB, then ack and commit the
broker. Crash points sit between the steps; the gap between ``db_commit`` and
``broker_commit`` is the window the seeds warn about. On a handler error both transactions
roll back and the message is NACKed (the broker redelivers or dead-letters it).
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.clients import db
from harness.clients.activemq import Message, StompClient, dlq_name
from harness.clients.db import Connection
from harness.errors import HarnessError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.stack.base import Endpoints
from harness.worker.crash import CrashPoints, ForcedRedelivery
from harness.worker.spec import WorkerSpec


@dataclass
class StageContext:
    """What a stage handler gets: the message, the stage's DB connection and a way to send.

    ``db`` is inside the stage transaction; ``send`` joins the broker transaction, so both
    commit or roll back with the stage. ``side`` is a separate autocommit connection: what is
    written there stays written whatever happens to the stage (attempt counters, the state of
    an external call). ``dead_letter`` diverts the message to the dead-letter queue with an alert.
    """

    op: str
    body: dict[str, Any]
    message: Message
    db: db.Connection
    options: dict[str, Any]
    worker: str
    stage: str
    _send: Callable[[dict[str, Any], str | None], None]
    _record: Callable[..., None]
    _crash: Callable[[str], None]
    _side: Callable[[], Connection]
    _dlq: str
    sent: list[dict[str, Any]] = field(default_factory=list)

    @property
    def side(self) -> Connection:
        """The worker's autocommit connection, outside the stage transaction."""
        return self._side()

    def dead_letter(self, reason: str) -> None:
        """Divert this message to the dead-letter queue (in the stage transaction) and alert."""
        self._send({**self.body, "txchaos_reason": reason}, self._dlq)
        self._record(Kind.ALERT, reason=reason)

    def send(self, body: dict[str, Any], dest: str | None = None) -> None:
        """Send ``body`` to ``dest`` (default: the stage's output queue) in the stage transaction."""
        self._send(body, dest)
        self.sent.append(body)

    def record(self, kind: Kind, **detail: Any) -> None:
        """Write a ledger event about this operation (EFFECT, SKIP, EXTERNAL_CALL ...)."""
        self._record(kind, **detail)

    def crash_point(self, name: str) -> None:
        """Mark a pattern-specific crash point; the harness may kill the worker here."""
        self._crash(name)


Handler = Callable[[StageContext], None]


def load_handler(path: str) -> Handler:
    """Import ``module:function``."""
    module, _, func = path.partition(":")
    handler: Handler = getattr(importlib.import_module(module), func)
    return handler


class StageWorker:
    """Consume ``spec.input_queue`` and run the stage until SIGTERM."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.run_dir = Path(spec.run_dir)
        self.endpoints = Endpoints.load(Path(spec.endpoints_path))
        self.ledger = LedgerWriter(self.run_dir / "ledger", spec.name)
        self.crash = CrashPoints(self.run_dir, spec.name, self.ledger)
        self.handler = load_handler(spec.handler)
        self.engine = db.engine(self.endpoints.postgres_url, pool_size=1)
        self._side_engine: db.Engine | None = None
        self._side_conn: db.Connection | None = None
        self.stop = threading.Event()
        self.attempts: Counter[str] = Counter()
        self._sub = ""

    def side(self) -> db.Connection:
        if self._side_conn is None or self._side_conn.closed:
            if self._side_engine is None:
                self._side_engine = db.engine(self.endpoints.postgres_url, pool_size=1, autocommit=True)
            self._side_conn = self._side_engine.connect()
        return self._side_conn

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        ep = self.endpoints.stomp
        started = False
        for n in itertools.count():  # one pass per connection: a forced disconnect opens a new one
            if self.stop.is_set():
                break
            # A fresh client id per connection: the broker drops the old connection asynchronously
            # after DISCONNECT, and reusing its id answers "already connected" and kills the worker,
            # a different fault than the disconnect that was armed (issue 12 finding 9).
            client_id = f"{self.spec.name}.{os.getpid()}.{n}"
            with StompClient(ep.host, ep.port, client_id=client_id) as client:
                self._sub = client.subscribe(self.spec.input_queue)
                if not started:
                    self.ledger.emit(Kind.WORKER_START, stage=self.spec.stage, dest=self.spec.input_queue)
                    (self.run_dir / "workers" / f"{self.spec.name}.ready").touch()
                    started = True
                while not self.stop.is_set():
                    msg = client.receive(0.2)
                    if msg is not None and not self.process(client, msg):
                        break  # the connection was dropped on purpose

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
            self._sub = client.subscribe(self.spec.input_queue)
        return True

    def process(self, client: StompClient, msg: Message) -> bool:
        """Run the stage on ``msg``; returns False when the worker must reconnect."""
        body = json.loads(msg.body)
        op = str(body["op"])
        stage, mid = self.spec.stage, msg.message_id
        emit = self.ledger.emit

        def reach(point: str) -> None:
            self.crash.reach(point, op=op, msg=mid, stage=stage)

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

        def send(out: dict[str, Any], dest: str | None) -> None:
            target = dest or self.spec.output_queue
            if target is None:
                raise ValueError(f"stage {stage} has no output queue; pass dest=")
            client.send(target, json.dumps(out), transaction=tx, headers={"txchaos-op": op})
            emit(Kind.SEND, op=op, msg=mid, stage=stage, dest=target)

        try:
            with self.engine.connect() as conn:
                trans = conn.begin()
                try:
                    ctx = StageContext(
                        op,
                        body,
                        msg,
                        conn,
                        self.spec.options,
                        self.spec.name,
                        stage,
                        send,
                        lambda kind, **d: emit(kind, op=op, msg=mid, stage=stage, **d),
                        reach,
                        self.side,
                        dlq_name(self.spec.input_queue),
                    )
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
