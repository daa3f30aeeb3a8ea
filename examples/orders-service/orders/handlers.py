"""Stage handlers of the orders service: each runs once per message inside the stage's transactions.

txchaos calls a handler with a ``StageContext``: ``ctx.db`` is the stage's database transaction,
``ctx.send`` joins the broker transaction. The database commits first, then the broker. A crash
between the two commits (the worker is SIGKILLed ``after_db_commit``) brings the message back.
"""

from __future__ import annotations

from sqlalchemy import text

from harness import Kind, StageContext

# Each statement built once: text() parses its statement on every call (a cost on every message).
PLACE = text("INSERT INTO orders (op_id, amount) VALUES (:op, :amount)")
CLAIM = text("INSERT INTO orders_inbox (op_id) VALUES (:op) ON CONFLICT (op_id) DO NOTHING RETURNING op_id")


def _place(ctx: StageContext) -> None:
    amount = int(ctx.body.get("amount", 1))
    ctx.db.execute(PLACE, {"op": ctx.op, "amount": amount})
    ctx.record(Kind.EFFECT, table="orders")


def place_order_naive(ctx: StageContext) -> None:
    """Place the order and notify shipping, trusting that a message is delivered once."""
    _place(ctx)
    ctx.send({"op": ctx.op, "event": "order-placed"})


def place_order(ctx: StageContext) -> None:
    """Place the order once per message id (an inbox row in the same transaction), always notify.

    A redelivered message finds its inbox row: the order is not placed again, but the
    notification is sent again, because the crash may have lost the first one.
    """
    first = ctx.db.execute(CLAIM, {"op": ctx.op}).first()
    if first is not None:
        _place(ctx)
    else:
        ctx.record(Kind.SKIP, table="orders", reason="already placed")
    ctx.send({"op": ctx.op, "event": "order-placed"})
