"""The books a run closes into its ledger once the flow is quiet: each a part with one ``close``.

A flow's session lists its books (``RunSession.books``); ``close`` closes them in order after the
processes have stopped, then the folder is marked complete. Generic books are here (the effect
table, the unsent outbox); a transport's residue books sit with its sink (``QueueResidue``,
``GroupBacklog``), a flow's own with the flow (a CQRS apply journal, saga states, DTM decisions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from harness.clients import db
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.transports.base import RunRecord


class Book(Protocol):
    """One account of where the operations ended up, written to the ledger as ``residue_*`` events."""

    def close(self, engine: db.Engine) -> None: ...


@dataclass(frozen=True)
class EffectTable:
    """Every row of the effect table is a ``residue_effect`` of its operation (two rows: applied twice)."""

    ledger: LedgerWriter
    record: RunRecord
    table: str
    column: str = "op_id"

    def close(self, engine: db.Engine) -> None:
        rows = db.column_values(engine, self.table, self.column)
        self.ledger.emit_ops(Kind.RESIDUE_EFFECT, rows, dest=self.table)  # a soak's table: a million rows
        self.record.step(f"snapshot effect table {self.table}")


@dataclass(frozen=True)
class UnsentOutbox:
    """Every outbox row never marked sent is a ``residue_outbox`` (an effect whose message never left)."""

    ledger: LedgerWriter
    record: RunRecord
    table: str

    def close(self, engine: db.Engine) -> None:
        rows = db.column_values(engine, self.table, "op_id", where_null="sent_at")
        self.ledger.emit_ops(Kind.RESIDUE_OUTBOX, rows, dest=self.table)
        self.record.step(f"snapshot unrelayed rows of {self.table}")
