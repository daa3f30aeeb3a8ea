"""CQRS entity events with tombstones, and two replicas of them (seed: Kafka saga/CQRS error handling).

The primary publishes one record per change of an entity, keyed by the aggregate id: a create or
an update carries the entity (same key, same value shape), a delete is a tombstone (the key and a
null value). Each event has an id (header ``txchaos-op``) and a version that rises per key
(header ``txchaos-version``). A replica consumes them at least once: a crash after its DB commit
and before the offset commit gives it the batch again, an entity's earlier update after its
delete.

- ``naive_replica`` applies whatever comes: an upsert on an update, a delete on a tombstone. The
  redelivered update after the tombstone re-creates the deleted entity (``resurrected``) and an
  older version overwrites a newer one (``out-of-order``), until the redelivered tombstone
  deletes it again: a reader in between sees an entity that no longer exists.
- ``versioned_replica`` upserts only a newer version and keeps the tombstone as a marker row with
  its version: a redelivered older update finds a version at least as new and changes nothing.

Both write every apply they commit to ``cqrs_journal`` in the same transaction: the per-key view
the checker reads (``ledger/schema.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text

from harness.ledger.schema import Kind
from harness.worker.kafka_context import KafkaContext

REPLICA = "cqrs_replica"
JOURNAL = "cqrs_journal"
EVENTS_PER_ENTITY = 3  # create, update, delete
VERSION_HEADER = "txchaos-version"


@dataclass(frozen=True)
class EntityEvent:
    """Event number ``n`` of a run: which entity, which version, a delete or not."""

    key: str
    version: int
    tombstone: bool


def entity_event(n: int) -> EntityEvent:
    """Return the run's event ``n``: entity ``n // 3`` created (v1), updated (v2), deleted (v3).

    >>> entity_event(5)
    EntityEvent(key='e00001', version=3, tombstone=True)
    """
    version = n % EVENTS_PER_ENTITY + 1
    return EntityEvent(f"e{n // EVENTS_PER_ENTITY:05d}", version, version == EVENTS_PER_ENTITY)


def _event(ctx: KafkaContext) -> EntityEvent:
    key = ctx.message.key or ""
    return EntityEvent(key, int(ctx.message.headers[VERSION_HEADER]), not ctx.message.value)


def _journal(ctx: KafkaContext, ev: EntityEvent) -> None:
    ctx.db.execute(
        text(f"INSERT INTO {JOURNAL} (event_id, key, version, tombstone) VALUES (:e, :k, :v, :t)"),
        {"e": ctx.op, "k": ev.key, "v": ev.version, "t": ev.tombstone},
    )
    ctx.record(Kind.EFFECT, table=REPLICA, key=ev.key, version=ev.version, tombstone=ev.tombstone)


def naive_replica(ctx: KafkaContext) -> None:
    """Upsert on an update, delete on a tombstone, whatever the version."""
    ev = _event(ctx)
    if ev.tombstone:
        ctx.db.execute(text(f"DELETE FROM {REPLICA} WHERE key = :k"), {"k": ev.key})
    else:
        ctx.db.execute(
            text(
                f"INSERT INTO {REPLICA} (key, version, event_id, name) VALUES (:k, :v, :e, :n) "
                "ON CONFLICT (key) DO UPDATE SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, "
                "name = EXCLUDED.name, deleted = false"
            ),
            {"k": ev.key, "v": ev.version, "e": ctx.op, "n": str(ctx.body.get("name", ""))},
        )
    _journal(ctx, ev)


def versioned_replica(ctx: KafkaContext) -> None:
    """Upsert only a newer version; a tombstone becomes a marker row holding its version."""
    ev = _event(ctx)
    applied = ctx.db.execute(
        text(
            f"INSERT INTO {REPLICA} (key, version, deleted, event_id, name) VALUES (:k, :v, :d, :e, :n) "
            "ON CONFLICT (key) DO UPDATE SET version = EXCLUDED.version, deleted = EXCLUDED.deleted, "
            f"event_id = EXCLUDED.event_id, name = EXCLUDED.name WHERE {REPLICA}.version < EXCLUDED.version "
            "RETURNING 1"
        ),
        {
            "k": ev.key,
            "v": ev.version,
            "d": ev.tombstone,
            "e": ctx.op,
            "n": None if ev.tombstone else str(ctx.body.get("name", "")),
        },
    ).first()
    if applied is None:
        ctx.record(Kind.SKIP, table=REPLICA, reason=f"{ev.key} already at version >= {ev.version}")
        return
    _journal(ctx, ev)
