"""The Kafka at-least-once consumer: apply an order's effect, emit an event, commit offsets after.

The handlers are the same whatever the offset discipline; the scenario's options choose it
(``harness.worker.kafka_options``):

- ``naive`` with manual offset store and a commit per batch: a crash after the DB commits and
  before the offset commit reprocesses the whole batch -> every effect in it applied twice.
- ``naive`` with librdkafka's default auto offset store (and a commit after each record): the
  offset of every record handed over is committed before it is processed -> a crash after the
  poll loses the rest of the batch.
- ``inbox_offset`` / ``inbox_event``: the record is applied at most once, keyed by its
  coordinates (topic, partition, offset) or by the event id the producer put in it, in the same
  DB transaction as the effect. A redelivered record is skipped but its event re-emitted.
  The coordinates catch every redelivery of the same record; only the event id also catches a
  producer that wrote the same event twice (a retry after a lost ack).

``naive_batch`` / ``inbox_offset_batch`` are the same consumers written for throughput: one
statement per batch (``unnest`` of arrays) instead of one per record.
"""

from __future__ import annotations

from functools import partial

from sqlalchemy import text

from harness.clients.pg_array import array_literal
from harness.ledger.schema import Kind
from harness.patterns.onepc import apply_effect, forward, insert, skip_or_apply
from harness.worker.kafka_context import KafkaContext, batch_handler

EFFECTS = "kafka_effects"


def _coordinates(ctx: KafkaContext) -> dict[str, object]:
    return {"topic": ctx.topic, "part": ctx.partition, '"offset"': ctx.offset}


def _apply(ctx: KafkaContext) -> None:
    apply_effect(ctx, EFFECTS, _coordinates(ctx))


def naive(ctx: KafkaContext) -> None:
    """Apply the effect and emit the event, trusting each record to arrive once."""
    _apply(ctx)
    forward(ctx)


def _inbox(ctx: KafkaContext, table: str, claim: dict[str, object], reason: str) -> None:
    """Claim the record in inbox ``table`` (same DB transaction as the effect): apply the effect if
    the claim is new, else skip it; emit the event either way."""
    fresh = insert(ctx, table, claim, "ON CONFLICT DO NOTHING RETURNING 1").first()
    skip_or_apply(ctx, applied=fresh is None, table=table, reason=reason, apply=partial(_apply, ctx))


def inbox_offset(ctx: KafkaContext) -> None:
    """Apply the effect unless the inbox holds this record's (topic, partition, offset); always emit."""
    _inbox(ctx, "kafka_inbox", {**_coordinates(ctx), "op_id": ctx.op}, "record already applied")


def inbox_event(ctx: KafkaContext) -> None:
    """Apply the effect unless the inbox holds this record's event id; always emit."""
    _inbox(ctx, "kafka_inbox_events", {"event_id": ctx.op, **_coordinates(ctx)}, "event already applied")


def _apply_all(ctxs: list[KafkaContext]) -> None:
    if not ctxs:
        return
    ctxs[0].db.execute(
        text(
            f'INSERT INTO {EFFECTS} (op_id, worker, amount, topic, part, "offset") '
            "SELECT * FROM unnest(CAST(:op AS text[]), CAST(:w AS text[]), CAST(:a AS int[]), "
            "CAST(:t AS text[]), CAST(:p AS int[]), CAST(:o AS bigint[]))"
        ),
        {
            "op": array_literal(c.op for c in ctxs),
            "w": array_literal(c.worker for c in ctxs),
            "a": array_literal(int(c.body.get("amount", 1)) for c in ctxs),
            "t": array_literal(c.topic for c in ctxs),
            "p": array_literal(c.partition for c in ctxs),
            "o": array_literal(c.offset for c in ctxs),
        },
    )
    for c in ctxs:
        c.record(Kind.EFFECT, table=EFFECTS)


@batch_handler
def naive_batch(ctxs: list[KafkaContext]) -> None:
    """``naive`` for a whole batch: every effect in one INSERT."""
    _apply_all(ctxs)
    for c in ctxs:
        forward(c)


@batch_handler
def inbox_offset_batch(ctxs: list[KafkaContext]) -> None:
    """``inbox_offset`` for a whole batch: one inbox INSERT tells which records are new."""
    if not ctxs:
        return
    rows = (
        ctxs[0]
        .db.execute(
            text(
                'INSERT INTO kafka_inbox (topic, part, "offset", op_id) '
                "SELECT * FROM unnest(CAST(:t AS text[]), CAST(:p AS int[]), CAST(:o AS bigint[]), "
                "CAST(:op AS text[])) "
                'ON CONFLICT DO NOTHING RETURNING topic, part, "offset"'
            ),
            {
                "t": array_literal(c.topic for c in ctxs),
                "p": array_literal(c.partition for c in ctxs),
                "o": array_literal(c.offset for c in ctxs),
                "op": array_literal(c.op for c in ctxs),
            },
        )
        .all()
    )
    fresh = {(str(t), int(p), int(o)) for t, p, o in rows}
    new = [c for c in ctxs if (c.topic, c.partition, c.offset) in fresh]
    for c in ctxs:
        if (c.topic, c.partition, c.offset) not in fresh:
            c.record(Kind.SKIP, table="kafka_inbox", reason="record already applied")
    _apply_all(new)
    for c in ctxs:
        forward(c)
