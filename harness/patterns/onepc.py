"""The Mats3 best-effort 1PC stage: insert the order's effect, send the outgoing message.

``naive`` trusts the transaction and inserts on every delivery; ``check_then_skip`` first
looks for the effect and, if found, skips the business work but still re-emits the outgoing
message (the fix the seed describes: "jump over the business processing, and just send the
outgoing message"). The effect table is an option so the same handler runs with or without
the unique constraint.
"""

from __future__ import annotations

from sqlalchemy import text

from harness.ledger.schema import Kind
from harness.worker.stage import StageContext

TABLES = frozenset({"onepc_effects", "onepc_effects_unique"})


def _table(ctx: StageContext) -> str:
    table = str(ctx.options.get("table", "onepc_effects"))
    if table not in TABLES:  # the name is spliced into SQL: allow only the known tables
        raise ValueError(f"unknown effect table {table!r}")
    return table


def _apply(ctx: StageContext, table: str) -> None:
    ctx.db.execute(
        text(f"INSERT INTO {table} (op_id, worker, amount) VALUES (:op, :w, :a)"),
        {"op": ctx.op, "w": ctx.worker, "a": int(ctx.body.get("amount", 1))},
    )
    ctx.record(Kind.EFFECT, table=table)


def naive(ctx: StageContext) -> None:
    """Apply the effect and send the next message, trusting the transactions."""
    table = _table(ctx)
    _apply(ctx, table)
    ctx.send({"op": ctx.op, "from": ctx.stage})


def check_then_skip(ctx: StageContext) -> None:
    """Apply the effect unless it is already there; always re-emit the outgoing message."""
    table = _table(ctx)
    # FOR UPDATE is not needed for one delivery at a time; the unique constraint guards the rest.
    found = ctx.db.execute(text(f"SELECT 1 FROM {table} WHERE op_id = :op LIMIT 1"), {"op": ctx.op}).first()
    if found:
        ctx.record(Kind.SKIP, table=table, reason="effect already applied")
    else:
        _apply(ctx, table)
    ctx.send({"op": ctx.op, "from": ctx.stage})
