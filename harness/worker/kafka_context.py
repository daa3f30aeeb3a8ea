"""What a Kafka stage handler sees: its record's context, the batch marker and failure, the record's op.

The runtime around it (``kafka_stage.KafkaStageWorker``) is not part of a handler's world: a team
writes against this module (through ``harness``'s public names) and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.clients.kafka import Record
from harness.ledger.schema import Kind
from harness.worker.base import ContextBase


@dataclass
class KafkaContext(ContextBase):
    """What a Kafka stage handler gets for one record.

    ``db`` is inside the stage's DB transaction. ``send`` queues an output record (key: the
    operation id) that is produced after the DB commit, or inside the Kafka transaction in
    ``commit="transaction"`` mode. ``side`` is a separate autocommit connection.
    ``dead_letter`` diverts the record to the dead-letter topic with an alert.
    """

    message: Record
    sent: list[tuple[dict[str, Any], str | None, str | None]] = field(default_factory=list)
    diverted: str | None = None

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def partition(self) -> int:
        return self.message.partition

    @property
    def offset(self) -> int:
        return self.message.offset

    def send(self, body: dict[str, Any], dest: str | None = None, *, key: str | None = None) -> None:
        """Queue ``body`` for topic ``dest`` (default: the stage's output topic), keyed by ``key``
        (default: this record's operation id; a saga's orchestrator names each request's own)."""
        self.sent.append((body, dest, key))

    def dead_letter(self, reason: str) -> None:
        """Divert this record to the dead-letter topic (after the DB commit) and raise an alert."""
        self.diverted = reason
        self._record(Kind.ALERT, reason=reason)


class BatchFailed(Exception):
    """Raised by a batch handler to say which record failed: ``index`` into its batch.

    With ``batch_errors="index"`` the worker redoes the records before it as a batch, the failed
    record alone (retried, then dead-lettered with an alert) and the records after it as a batch
    (Spring Kafka's ``BatchListenerFailedException``).
    """

    def __init__(self, index: int, cause: str) -> None:
        super().__init__(f"record {index} of the batch failed: {cause}")
        self.index = index


KafkaHandler = Callable[[KafkaContext], None]
BatchHandler = Callable[[list[KafkaContext]], None]


def batch_handler(func: BatchHandler) -> BatchHandler:
    """Mark ``func`` as a batch handler: called once with the contexts of every record in its
    DB transaction (the whole batch with ``db_tx="batch"``, one record otherwise), so it can
    write the batch's effects in one statement.

    >>> @batch_handler
    ... def apply_all(ctxs: list[KafkaContext]) -> None: ...
    """
    func.__dict__["txchaos_batch"] = True
    return func


def per_record(handler: KafkaHandler) -> BatchHandler:
    def each(ctxs: list[KafkaContext]) -> None:
        for ctx in ctxs:
            handler(ctx)

    return each


def op_of(record: Record) -> str:
    """Return the operation id of a record: its ``txchaos-op`` header, its key, else the body's ``op``.

    The header comes first: an entity event is keyed by its aggregate id, not by its event id.
    """
    if record.headers.get("txchaos-op"):
        return record.headers["txchaos-op"]
    if record.key:
        return record.key
    try:
        return str(json.loads(record.value)["op"])
    except (ValueError, KeyError, TypeError):
        return record.coord
