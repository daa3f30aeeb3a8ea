"""A Kafka batch listener and one poison record in its batch (seed: Kafka saga/CQRS error handling).

A batch listener gets every record of a poll at once. When one record of it cannot be processed
(a poison record: bad data that fails on every delivery), what happens to the other records
depends on whether the listener says *which* record failed:

- ``naive_listener`` (with ``batch_errors="retry_batch"``): applies each record's effect as it
  goes, on a connection outside any transaction (a REST call per record, a JDBC template
  without a transaction), and fails the batch on the poison record. The container cannot tell
  which record failed: it retries the whole batch, re-applying the good records before the
  poison one on every attempt (``duplicate-effect``), then sends the whole batch to the
  dead-letter topic: the good records before it parked although applied
  (``dead-lettered-with-effect``), the ones after it parked unapplied (``dead-lettered``).
- ``indexed_listener`` (with ``batch_errors="index"``): writes the batch's effects in the batch
  transaction and raises ``BatchFailed(index)`` on the poison record. The records before it are
  redone as a batch, the poison record alone is retried, then dead-lettered with an alert, and
  the records after it go on as a batch: every good record applied once, nothing else parked.
"""

from __future__ import annotations

from sqlalchemy import text

from harness.ledger.schema import Kind
from harness.worker.kafka_context import BatchFailed, KafkaContext, batch_handler

EFFECTS = "kafka_effects"
_INSERT = text(f'INSERT INTO {EFFECTS} (op_id, worker, amount, topic, part, "offset") VALUES (:op, :w, :a, :t, :p, :o)')


def _params(ctx: KafkaContext) -> dict[str, object]:
    return {
        "op": ctx.op,
        "w": ctx.worker,
        "a": int(ctx.body.get("amount", 1)),
        "t": ctx.topic,
        "p": ctx.partition,
        "o": ctx.offset,
    }


def _poison(ctx: KafkaContext) -> bool:
    return bool(ctx.body.get("poison"))


@batch_handler
def naive_listener(ctxs: list[KafkaContext]) -> None:
    """Apply each record outside the transaction as it comes; a poison record fails the batch."""
    for ctx in ctxs:
        if _poison(ctx):
            raise ValueError(f"cannot process {ctx.op}: poison record at {ctx.message.coord}")
        ctx.side.execute(_INSERT, _params(ctx))
        ctx.record(Kind.EFFECT, table=EFFECTS, transactional=False)
        ctx.send({"op": ctx.op, "from": ctx.stage})


@batch_handler
def indexed_listener(ctxs: list[KafkaContext]) -> None:
    """Apply the batch in its transaction; name the poison record's index when it fails."""
    for i, ctx in enumerate(ctxs):
        if _poison(ctx):
            raise BatchFailed(i, f"poison record {ctx.op} at {ctx.message.coord}")
        ctx.db.execute(_INSERT, _params(ctx))
        ctx.record(Kind.EFFECT, table=EFFECTS)
        ctx.send({"op": ctx.op, "from": ctx.stage})
