"""Ledger schema v1: one row per event, written by the driver, workers, sink and residue snapshot.

Columns (Arrow types):

============  =========  ==============================================================
column        type       meaning
============  =========  ==============================================================
ts_ns         int64      wall clock of the writer, ns since the epoch
src           string     writer: ``driver``, ``worker-N``, ``sink``, ``residue``, ``faults``
pid           int32      OS process id of the writer
seq           int64      per-writer sequence number, 0, 1, 2, ... (gaps never happen)
kind          string     one of ``Kind`` below
op            string     operation id made by the requester (null when not known)
msg           string     broker message id (STOMP ``message-id``; Kafka ``topic/partition@offset``)
stage         string     pattern stage name
dest          string     queue or topic the event concerns
attempt       int32      delivery attempt, when the writer knows it
point         string     crash point or fault name
partition     int32      Kafka partition
offset        int64      Kafka offset
detail        string     JSON object with anything else
============  =========  ==============================================================

Segments are JSON lines (one file per writer process, see ``writer.py``), a row each event or a
*packed row* for ``n`` events of one kind written at once (a worker's batch, the books' snapshot):
``ts_ns``, ``src``, ``pid`` and ``kind`` are theirs alike, ``seq`` is the first one's (the others
follow it), and each column of ``PACKED_COLUMNS`` is given once, under its own name, when every
event has the same value, or as a list of ``n`` values under its plural (``"ops": [...]``). Readers
unpack them (``reader.unpacked``, and in Arrow ``reader.segment_chunks``). ``compact`` turns them
into ``events.parquet/``: hash buckets of ``op`` sorted by (op, ts_ns), with the extra columns
``op_bucket``, ``op_id`` and ``kind_code`` (see ``layout.py``), so engines group by operation
without a shuffle and by integers.

Version 2 (this one) adds the kinds ``prepare`` and ``abort_prepared`` (2-phase messages) and the
bucketed compacted layout; version-1 segments read unchanged. Later additions that need no
reader change: the kinds ``forced_redelivery``, ``alert``, ``residue_outbox`` and ``rebalance``,
and the per-key view of entity events (CQRS replicas), all of it in ``detail``:

- ``submit`` of an entity event: ``key`` (aggregate id), ``version`` (int, rising per key),
  ``tombstone`` (bool: a delete, a record with a null value).
- ``residue_apply``: one row of the replica's apply journal, every apply it committed, in commit
  order: ``op`` the event applied, ``key``, ``version``, ``tombstone``, ``n`` (journal position).
- ``residue_entity``: one replica row at quiescence: ``op`` the event that last wrote it, ``key``,
  ``version``, ``deleted`` (bool: a tombstone marker row, not a live entity).

Declared effects and invariants (``verify/declared.py``), also residue, added without a reader
change:

- ``residue_declared``: one row of the contract's effect query: ``op``, ``applied`` (int: how many
  times the operation's effect is in the user's tables).
- ``residue_invariant``: one evaluated invariant: ``invariant`` (its name), ``label``, ``actual``,
  ``expected`` (ints), ``holds`` (bool), ``suspects`` (op ids applied more or less than once).
  ``op`` is set only when it does not hold: the operation's id for a per-operation invariant,
  ``invariant:<name>`` for a global one, so the verdict's summary counts breaks per operation.
  A holding global invariant and the tally of a per-operation one (``checked``, ``broken``) are
  written with no ``op``: recorded, not judged.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 2


class Kind(StrEnum):
    """Event kinds. Residue kinds describe the end state and come last in a run."""

    RUN_START = "run_start"
    RUN_END = "run_end"
    SUBMIT = "submit"  # driver sent an operation (op, msg=None until the broker names it)
    PREPARE = "prepare"  # driver prepared a 2-phase message; a submit or abort_prepared must follow
    ABORT_PREPARED = "abort_prepared"  # the check-back decided a prepared message is never submitted
    WORKER_START = "worker_start"
    WORKER_EXIT = "worker_exit"  # detail: returncode, signal
    DELIVER = "deliver"  # a worker received a message; detail.redelivered from the broker
    EFFECT = "effect"  # a worker wrote the business effect inside its DB transaction
    SKIP = "skip"  # a worker found the effect already applied and skipped it
    SEND = "send"  # a worker sent an outgoing message inside its broker transaction
    EXTERNAL_CALL = "external_call"  # a non-transactional call left the worker
    DB_COMMIT = "db_commit"
    DB_ROLLBACK = "db_rollback"
    BROKER_COMMIT = "broker_commit"
    BROKER_ABORT = "broker_abort"
    NACK = "nack"
    ERROR = "error"  # the stage raised; detail.error
    CRASH = "crash"  # a crash point fired: the worker SIGKILLs itself right after this event
    FORCED_REDELIVERY = "forced_redelivery"  # an armed point made the worker give the message back
    ALERT = "alert"  # the stage refused or diverted the message and flagged it for a human
    REBALANCE = "rebalance"  # a Kafka consumer's partitions were assigned, revoked or lost
    FAULT_START = "fault_start"
    FAULT_END = "fault_end"
    DOWNSTREAM = "downstream"  # the sink received the flow's outgoing message
    DEAD_LETTER = "dead_letter"  # the sink drained the message from the dead-letter queue
    RESIDUE_EFFECT = "residue_effect"  # one row of the final effect table
    RESIDUE_QUEUE = "residue_queue"  # a message still in the input queue at quiescence
    RESIDUE_OUTBOX = "residue_outbox"  # an outbox row never relayed, at quiescence
    RESIDUE_APPLY = "residue_apply"  # one row of a replica's apply journal (per-key view)
    RESIDUE_ENTITY = "residue_entity"  # one replica row at quiescence (per-key view)
    RESIDUE_DECLARED = "residue_declared"  # a declared effect's row: detail.applied, times the op was applied
    RESIDUE_INVARIANT = "residue_invariant"  # a declared invariant's value: detail.actual, detail.expected
    # Last, whatever its meaning: a compacted ledger stores a kind as its index here (layout.KIND_CODES).
    ARM = "arm"  # the driver armed a crash or trap (detail: arm, target_op, nth, action, worker, via)


RESIDUE_KINDS = frozenset(
    {
        Kind.DOWNSTREAM,
        Kind.DEAD_LETTER,
        Kind.RESIDUE_EFFECT,
        Kind.RESIDUE_QUEUE,
        Kind.RESIDUE_OUTBOX,
        Kind.RESIDUE_APPLY,
        Kind.RESIDUE_ENTITY,
        Kind.RESIDUE_DECLARED,
        Kind.RESIDUE_INVARIANT,
    }
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("src", pa.string(), nullable=False),
        pa.field("pid", pa.int32(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("op", pa.string()),
        pa.field("msg", pa.string()),
        pa.field("stage", pa.string()),
        pa.field("dest", pa.string()),
        pa.field("attempt", pa.int32()),
        pa.field("point", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("detail", pa.string()),
    ],
    metadata={"txchaos.ledger.version": str(SCHEMA_VERSION)},
)

COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)
# The columns a packed row gives once or as a list of values, one per event, under the plural.
PACKED_COLUMNS: dict[str, str] = {
    "op": "ops",
    "msg": "msgs",
    "stage": "stages",
    "dest": "dests",
    "attempt": "attempts",
    "point": "points",
    "partition": "partitions",
    "offset": "offsets",
    "detail": "details",
}
PACKED_MAX = 1 << 16  # the most events a packed row holds: a larger ``n`` is damage, not a row
OPTIONAL_COLUMNS: tuple[str, ...] = ("op", "msg", "stage", "dest", "attempt", "point", "partition", "offset")


def empty_row() -> dict[str, Any]:
    """Return a row with every optional column null and an empty detail."""
    row: dict[str, Any] = dict.fromkeys(OPTIONAL_COLUMNS)
    row["detail"] = "{}"
    return row
