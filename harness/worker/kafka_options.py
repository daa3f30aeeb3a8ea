"""How a Kafka stage consumes, stores and commits: its crash points and options, validated early.

Kept free of client imports so a scenario spec can be checked before any service starts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from harness.errors import ConfigError

# The points every Kafka stage passes through, in order, for each record it is handed:
# after_poll (handed over, nothing done) -> before_db_commit -> after_db_commit -> [outputs]
# -> before_offset_commit -> after_offset_commit. The offset points are reached once per record
# the commit is for (each record of the batch, or the one record in per-record commit mode).
KAFKA_POINTS = ("after_poll", "before_db_commit", "after_db_commit", "before_offset_commit", "after_offset_commit")
# kill: SIGKILL. disconnect: close the consumer before the offset commit (it leaves the group)
# and join again: everything after the last committed offset is delivered again.
KAFKA_ACTIONS = ("kill", "disconnect")

OFFSET_STORES = ("manual", "auto")
COMMITS = ("batch", "record", "timer", "transaction")
DB_TXS = ("record", "batch")
# What a failed batch transaction (db_tx="batch") does next. isolate: redo the batch record by
# record. retry_batch: the batch listener without a failure index: retry the whole batch, then
# dead-letter every record of it. index: the handler raises BatchFailed(index): the records
# before it are redone as a batch, the failed one alone (retried, then dead-lettered), the rest
# as a batch again.
BATCH_ERRORS = ("isolate", "retry_batch", "index")


@dataclass(frozen=True)
class KafkaStageOptions:
    """The consumer's offset and transaction discipline (``ScenarioSpec.options`` keys of the same name).

    ``offset_store``: ``manual`` stores a record's offset after its DB commit
    (``enable.auto.offset.store=false``); ``auto`` is librdkafka's default, which stores it when
    the record is handed over, before any work on it.
    ``commit``: ``batch`` commits the stored offsets after each batch, ``record`` after each
    record (``commit()`` with no offsets: whatever is stored), ``timer`` leaves it to
    librdkafka's auto-commit thread (``enable.auto.commit``, every ``auto_commit_ms``),
    ``transaction`` commits the batch's offsets with its output records in one Kafka transaction
    (``send_offsets_to_transaction``; the DB transaction stays outside it).
    ``db_tx``: one DB transaction per ``record`` or per ``batch``.
    ``batch_errors``: what a failed batch transaction does next (``BATCH_ERRORS``).
    ``static_membership``: a restarted worker rejoins under its old ``group.instance.id`` and
    gets its partitions back at once; otherwise they move after ``session_timeout_ms``.
    A handler error is retried ``max_attempts`` times with exponential backoff from
    ``backoff_ms``, then the record goes to the dead-letter topic.
    """

    batch_size: int = 50
    offset_store: str = "manual"
    commit: str = "batch"
    db_tx: str = "record"
    batch_errors: str = "isolate"
    session_timeout_ms: int = 6000
    heartbeat_ms: int = 1000
    static_membership: bool = False
    auto_commit_ms: int = 5000
    max_attempts: int = 3
    backoff_ms: int = 50
    poll_timeout_ms: int = 200
    partitions: int = 3

    def __post_init__(self) -> None:
        allowed_values = (
            ("offset_store", OFFSET_STORES),
            ("commit", COMMITS),
            ("db_tx", DB_TXS),
            ("batch_errors", BATCH_ERRORS),
        )
        for name, allowed in allowed_values:
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"Kafka option {name}={value!r}", hint=f"use one of {', '.join(allowed)}")
        bounds = {
            "batch_size": (1, 10_000),
            "session_timeout_ms": (1000, 300_000),
            "heartbeat_ms": (100, 100_000),
            "auto_commit_ms": (10, 600_000),
            "max_attempts": (1, 100),
            "backoff_ms": (0, 60_000),
            "poll_timeout_ms": (1, 10_000),
            "partitions": (1, 64),
        }
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"Kafka option {name}={value!r}", hint=f"use a whole number from {low} to {high}")
        if self.heartbeat_ms * 3 > self.session_timeout_ms:
            raise ConfigError(
                f"heartbeat_ms={self.heartbeat_ms} with session_timeout_ms={self.session_timeout_ms}",
                hint="keep the heartbeat at most a third of the session timeout",
            )
        if self.commit == "transaction" and self.offset_store == "auto":
            raise ConfigError(
                "commit='transaction' with offset_store='auto'",
                hint="a transactional consumer sends its own offsets: leave offset_store at 'manual'",
            )

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> KafkaStageOptions:
        """Pick this class's keys out of a stage's options (the rest belong to the handler)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names})
