"""The Mats3 best-effort 1PC stage: insert the order's effect, send the outgoing message.

``naive`` trusts the transaction and inserts on every delivery; ``check_then_skip`` first
looks for the effect and, if found, skips the business work but still re-emits the outgoing
message (the fix the seed describes: "jump over the business processing, and just send the
outgoing message"). The effect table is an option so the same handler runs with or without
the unique constraint.

The handlers use only ``HandlerContext``, so they run on an ActiveMQ stage and on a Kafka stage
alike; ``apply_effect``, ``forward`` and ``skip_or_apply`` are the pieces the Kafka consumer's
inbox variants (``harness.patterns.kafka_consumer``) are written with too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from sqlalchemy import Result, TextClause, text

from harness.ledger.schema import Kind
from harness.worker.base import HandlerContext

TABLES = frozenset({"onepc_effects", "onepc_effects_unique"})


@lru_cache(maxsize=64)
def _sql(statement: str) -> TextClause:
    """Return ``text(statement)``, built once per statement: ``text()`` parses its binds on every call."""
    return text(statement)


def _table(ctx: HandlerContext) -> str:
    table = str(ctx.options.get("table", "onepc_effects"))
    if table not in TABLES:  # the name is spliced into SQL: allow only the known tables
        raise ValueError(f"unknown effect table {table!r}")
    return table


def apply_effect(ctx: HandlerContext, table: str, extra: dict[str, object] | None = None) -> None:
    """Insert this operation's effect into ``table`` (a known name: it is spliced into SQL) and record it.

    ``extra`` adds columns (name -> value) beyond ``op_id``, ``worker`` and ``amount``.
    """
    columns: dict[str, object] = {"op_id": ctx.op, "worker": ctx.worker, "amount": int(ctx.body.get("amount", 1))}
    insert(ctx, table, {**columns, **(extra or {})})
    ctx.record(Kind.EFFECT, table=table)


def insert(ctx: HandlerContext, table: str, columns: dict[str, object], suffix: str = "") -> Result[Any]:
    """Insert one row of ``columns`` (name -> value) into ``table`` in the stage transaction.

    ``table`` and the names are spliced into SQL: pass only known names. ``suffix`` ends the
    statement (``ON CONFLICT DO NOTHING RETURNING 1``).
    """
    binds = {f"c{i}": value for i, value in enumerate(columns.values())}
    values = ", ".join(f":{name}" for name in binds)
    return ctx.db.execute(_sql(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values}) {suffix}"), binds)


def forward(ctx: HandlerContext) -> None:
    """Send the stage's outgoing message: on every delivery, a skipped redelivery included."""
    ctx.send({"op": ctx.op, "from": ctx.stage})


def skip_or_apply(ctx: HandlerContext, *, applied: bool, table: str, reason: str, apply: Callable[[], None]) -> None:
    """Skip the business work when it is ``applied`` already (say why), else ``apply``; always forward."""
    if applied:
        ctx.record(Kind.SKIP, table=table, reason=reason)
    else:
        apply()
    forward(ctx)


def naive(ctx: HandlerContext) -> None:
    """Apply the effect and send the next message, trusting the transactions."""
    apply_effect(ctx, _table(ctx))
    forward(ctx)


def check_then_skip(ctx: HandlerContext) -> None:
    """Apply the effect unless it is already there; always re-emit the outgoing message.

    Racy on a table without a unique key: a redelivery that reaches a second worker while the
    first is still in its transaction reads no effect and applies it again (a soak with two
    workers and a broker reset finds it; one worker never does). ``check_then_skip_locked`` and
    the unique table close the race.
    """
    table = _table(ctx)
    found = ctx.db.execute(_sql(f"SELECT 1 FROM {table} WHERE op_id = :op LIMIT 1"), {"op": ctx.op}).first()
    apply = partial(apply_effect, ctx, table)
    skip_or_apply(ctx, applied=found is not None, table=table, reason="effect already applied", apply=apply)


def check_then_skip_locked(ctx: HandlerContext) -> None:
    """``check_then_skip`` under a transaction-scoped advisory lock on the operation id.

    ``SELECT ... FOR UPDATE`` cannot lock a row that does not exist yet; the advisory lock makes a
    second delivery of the same operation wait until the first one's transaction ends, and then
    its check sees the committed effect.
    """
    ctx.db.execute(_sql("SELECT pg_advisory_xact_lock(hashtext(:op))"), {"op": ctx.op})
    check_then_skip(ctx)
