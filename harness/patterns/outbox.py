"""The inbox/outbox pattern (Mats3 seed, "Outbox pattern"): a relay, a sweeper, a consumer inbox.

The producer stage writes the order and its outgoing message (an outbox row) in one database
transaction and sends nothing to the broker; a ``NOTIFY`` in the same transaction, delivered at
commit, tells the relay. The relay helper sends each row to the consumer stage's queue and then
marks it sent. Its two windows (DESIGN.md, "outbox relay"):

- killed after it took a row, before the send: with ``sweeper=False`` the relay only relays rows
  it is told about in the moment, so the row is never sent -> ``orphan-outbox``. The sweeper
  re-sends rows left unsent longer than ``sweep_age_s`` (including the ones committed while the
  relay was down, whose notifications nobody heard).
- killed after the send, before marking: the sweeper sends the row again, so the consumer gets
  it twice. ``consumer_naive`` applies it twice -> ``duplicate-effect``; ``consumer_inbox``
  records each message's producer-made ``msg_id`` in an inbox in its own transaction and skips
  one it has seen, still emitting its outgoing message.

Tables: ``fixtures/sql/outbox.sql``. The runner gives the relay every stage's queue in
``options["queues"]``; ``options["target"]`` names the stage it feeds (default ``consumer``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, text

from harness.clients import db
from harness.clients.activemq import StompClient
from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.worker.process import ProcessContext
from harness.worker.stage import StageContext

CHANNEL = "txchaos_outbox"
POINTS = ("relay_before_send", "relay_after_send")


# -- producer stage ------------------------------------------------------------------------------
def place_order(ctx: StageContext) -> None:
    """Insert the order and its outbox row in the stage transaction, then notify the relay.

    A redelivered order (the stage killed after its DB commit) finds the order and adds no second
    outbox row: the message was committed with the order the first time.
    """
    amount = int(ctx.body.get("amount", 1))
    if not db.insert_once(ctx.db, "outbox_orders", {"op_id": ctx.op, "worker": ctx.worker, "amount": amount}):
        ctx.record(Kind.SKIP, table="outbox_orders", reason="order already placed")
        return
    outbox_id = ctx.db.execute(
        text("INSERT INTO outbox (op_id, payload) VALUES (:op, CAST(:p AS jsonb)) RETURNING id"),
        {"op": ctx.op, "p": json.dumps({"op": ctx.op, "amount": amount})},
    ).scalar_one()
    # Postgres holds a NOTIFY until the transaction commits and drops it on rollback.
    ctx.db.execute(text("SELECT pg_notify(:ch, :id)"), {"ch": CHANNEL, "id": str(outbox_id)})
    ctx.record(Kind.EFFECT, table="outbox_orders", outbox_id=outbox_id)


# -- consumer stage ------------------------------------------------------------------------------
def _apply(ctx: StageContext, msg_id: str) -> None:
    ctx.db.execute(
        text("INSERT INTO outbox_effects (op_id, msg_id, worker, amount) VALUES (:op, :m, :w, :a)"),
        {"op": ctx.op, "m": msg_id, "w": ctx.worker, "a": int(ctx.body.get("amount", 1))},
    )
    ctx.record(Kind.EFFECT, table="outbox_effects", msg_id=msg_id)


def _msg_id(ctx: StageContext) -> str:
    msg_id = ctx.body.get("msg_id")
    if not isinstance(msg_id, str) or not msg_id:
        raise ValueError(f"message of {ctx.op} carries no msg_id: it did not come through the outbox relay")
    return msg_id


def consumer_naive(ctx: StageContext) -> None:
    """Apply every delivery and emit the outgoing message, trusting the relay to send once."""
    _apply(ctx, _msg_id(ctx))
    ctx.send({"op": ctx.op, "from": ctx.stage})


def consumer_inbox(ctx: StageContext) -> None:
    """Apply a message only if its ``msg_id`` is new to the inbox; always emit the outgoing message.

    The inbox row commits with the effect, so a crash before the commit leaves neither and the
    redelivery applies it; a crash after leaves both and the redelivery skips. Re-emitting on a
    skip keeps the flow going when the earlier delivery committed the DB but not the broker.
    """
    msg_id = _msg_id(ctx)
    new = ctx.db.execute(
        text("INSERT INTO outbox_inbox (msg_id, op_id) VALUES (:m, :op) ON CONFLICT (msg_id) DO NOTHING RETURNING 1"),
        {"m": msg_id, "op": ctx.op},
    ).first()
    if new is None:
        ctx.record(Kind.SKIP, table="outbox_inbox", reason="message already in the inbox", msg_id=msg_id)
    else:
        _apply(ctx, msg_id)
    ctx.send({"op": ctx.op, "from": ctx.stage})


# -- relay helper --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RelayConfig:
    """The relay's settings, read from its helper options.

    >>> RelayConfig.from_options({"queues": {"consumer": "q.c"}, "sweeper": False}).queue
    'q.c'
    """

    queue: str
    sweeper: bool = True
    sweep_age_s: float = 0.3
    sweep_every_s: float = 0.1

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RelayConfig:
        """Validate ``options``; a mistake raises ConfigError naming the value and the fix."""
        target = options.get("target", "consumer")
        queues = options.get("queues") or {}
        if target not in queues:
            raise ConfigError(
                f"the relay's target stage {target!r} has no queue (stages: {sorted(queues) or 'none'})",
                hint="add a chain Stage of that name, or set the relay Helper's options['target'] to one",
            )
        sweeper = options.get("sweeper", True)
        if not isinstance(sweeper, bool):
            raise ConfigError(f"relay sweeper={sweeper!r} is not a bool", hint="write sweeper=True or sweeper=False")
        timings = {k: options.get(k, getattr(cls, k)) for k in ("sweep_age_s", "sweep_every_s")}
        for key, value in timings.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 60:
                raise ConfigError(f"relay {key}={value!r} is out of range", hint=f"give {key} in seconds, 0 < s <= 60")
        return cls(str(queues[target]), sweeper, float(timings["sweep_age_s"]), float(timings["sweep_every_s"]))


def relay_body(payload: Mapping[str, Any], msg_id: str) -> str:
    """Return the message the relay sends for an outbox row: its payload plus the row's ``msg_id``."""
    return json.dumps({**payload, "msg_id": msg_id})


def _notifications(listener: db.Connection, timeout: float) -> Iterator[str]:
    """Yield the payloads of NOTIFYs on ``listener``, returning as soon as some came or after ``timeout``.

    SQLAlchemy has no LISTEN API: this reads psycopg's through the pooled connection, so the
    driver stays unimported outside the adapter.
    """
    driver: Any = listener.connection.driver_connection
    for note in driver.notifies(timeout=timeout, stop_after=1):
        yield str(note.payload)


_SELECT = "SELECT id, op_id, msg_id, payload FROM outbox WHERE sent_at IS NULL"


def _send_row(
    ctx: ProcessContext, conn: db.Connection, broker: StompClient, queue: str, row: Row[Any], swept: bool
) -> None:
    """Send one outbox row, then mark it sent: the two steps a crash can come between."""
    outbox_id, op, msg_id = int(row.id), str(row.op_id), str(row.msg_id)
    ctx.crash_point("relay_before_send", op=op, msg=msg_id)
    # A broker transaction whose COMMIT waits for the RECEIPT: once it returns the broker holds the
    # message, so "after send" means sent, not "in a socket buffer a SIGKILL may discard".
    tx = broker.begin()
    broker.send(
        queue, relay_body(row.payload, msg_id), transaction=tx, headers={"txchaos-op": op, "txchaos-msg": msg_id}
    )
    broker.commit(tx)
    ctx.record(Kind.SEND, op=op, msg=msg_id, dest=queue, outbox_id=outbox_id, swept=swept)
    ctx.crash_point("relay_after_send", op=op, msg=msg_id)
    conn.execute(text("UPDATE outbox SET sent_at = clock_timestamp() WHERE id = :id"), {"id": outbox_id})


def relay(ctx: ProcessContext) -> None:
    """Relay outbox rows to the target stage's queue until ``ctx.stopping``; sweep if configured.

    Rows are relayed as their NOTIFYs arrive. A NOTIFY is heard only by a listening session, so
    without the sweeper a row whose notification came while this process was down, or that it
    took and died on, stays unsent for good.
    """
    cfg = RelayConfig.from_options(ctx.options)
    engine = db.engine(ctx.endpoints.postgres_url, pool_size=2, autocommit=True)
    ep = ctx.endpoints.stomp
    try:
        with (
            engine.connect() as listener,
            engine.connect() as conn,
            StompClient(ep.host, ep.port, client_id=f"txchaos-{ctx.name}") as broker,
        ):
            listener.execute(text(f"LISTEN {CHANNEL}"))
            ctx.ready()
            next_sweep, age = 0.0, 0.0  # at once and every row: none of them will be notified to us
            while not ctx.stopping.is_set():
                for outbox_id in _notifications(listener, cfg.sweep_every_s):
                    # The sweeper may have sent it meanwhile: only a row still unsent is relayed.
                    row = conn.execute(text(f"{_SELECT} AND id = :id"), {"id": int(outbox_id)}).first()
                    if row is not None:
                        _send_row(ctx, conn, broker, cfg.queue, row, swept=False)
                if cfg.sweeper and time.monotonic() >= next_sweep:
                    # Later sweeps take only rows older than the age, as a sweeper running beside
                    # live relays must (Mats: "a job on the outside"): a younger row is theirs.
                    old = conn.execute(
                        text(f"{_SELECT} AND created_at < clock_timestamp() - make_interval(secs => :age) ORDER BY id"),
                        {"age": age},
                    ).all()
                    for row in old:
                        _send_row(ctx, conn, broker, cfg.queue, row, swept=True)
                    next_sweep, age = time.monotonic() + cfg.sweep_every_s, cfg.sweep_age_s
    finally:
        engine.dispose()
