"""Run one CQRS scenario: entity events keyed by aggregate id into a Kafka replica, a per-key verdict.

The ``kafka`` flow's topology and quiescence with ``EntityEvents`` for a workload: operation ``n`` is
``entity_event(n)`` (create, update, delete per entity), keyed by its aggregate id, its event id
in the ``txchaos-op`` header and its version in ``txchaos-version``; a delete is a tombstone (a
null value). The SUBMIT of each carries ``key``, ``version`` and ``tombstone``.

How the books close into the ledger (contract: no downstream, ``per_key``):

- every row of the replica's apply journal is a ``residue_apply`` (in journal order), and each
  event applied at least once one ``residue_effect``: re-applying the same version is idempotent,
  an event never applied is ``lost``;
- every replica row is a ``residue_entity``, live or a tombstone marker.

Quiescence and residue of the input topic are the ``kafka`` flow's; the lifecycle is
``RunSession``'s. The registry checks the contract (per key, no downstream) when the spec is made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import text

from harness.clients import db
from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.patterns.kafka_cqrs import JOURNAL, REPLICA, VERSION_HEADER, entity_event
from harness.run.core.books import Book
from harness.run.core.roles import SessionView
from harness.run.core.sink_parts import Messages, SinkStopped
from harness.run.flows.kafka import TOPIC_PARTS, Topics, group_residue, kafka_flow
from harness.run.spec.flow import register
from harness.run.spec.scenario import ScenarioSpec
from harness.run.transports.base import RunRecord


@dataclass
class EntityEvents(Messages):
    """Operations that are entity events: keyed by aggregate id, a delete a tombstone (what comes
    out is counted as for plain messages)."""

    session: SessionView
    place: Topics

    def submit(self, count: int, *, poison: bool = False, **extra: Any) -> list[str]:
        """Produce the next ``count`` entity events (keyed by aggregate id); return their event ids."""
        if poison:
            raise ConfigError(
                "poison records in a CQRS run", hint="entity events have no poison flag: submit plain ones"
            )
        s, place = self.session, self.place
        topic = place.input_topic
        new = []
        for op in s.mint(count):
            n = len(s.ops)
            ev = entity_event(n)
            s.ledger.emit(Kind.SUBMIT, op=op, dest=topic, key=ev.key, version=ev.version, tombstone=ev.tombstone)
            value = None if ev.tombstone else json.dumps({"op": op, "name": f"{ev.key} v{ev.version}"})
            headers = {"txchaos-op": op, VERSION_HEADER: str(ev.version)}
            place.transport.send(topic, value, key=ev.key, headers=headers)
            s.ops.append(op)
            new.append(op)
        place.transport.flush()
        s.folder.step(f"submit {count} entity event(s) to {topic}")
        s.progress(f"submitted {len(s.ops)} entity events")
        return new


def journal_books(session: SessionView, place: Topics) -> tuple[Book, ...]:
    """The group's backlog, the sink's last reads, then the replica's apply journal."""
    return (group_residue(session, place), SinkStopped(place), ApplyJournal(session.ledger, session.folder))


@dataclass(frozen=True)
class ApplyJournal:
    """The replica's books, per key: each journal row a ``residue_apply``, each event applied at least
    once a ``residue_effect``, each replica row a ``residue_entity`` (live or a tombstone marker)."""

    ledger: LedgerWriter
    record: RunRecord

    def close(self, engine: db.Engine) -> None:
        with engine.connect() as conn:
            journal = conn.execute(text(f"SELECT n, event_id, key, version, tombstone FROM {JOURNAL} ORDER BY n")).all()
            rows = conn.execute(text(f"SELECT key, version, deleted, event_id FROM {REPLICA} ORDER BY key")).all()
        for n, op, key, version, tombstone in journal:
            self.ledger.emit(
                Kind.RESIDUE_APPLY, op=op, dest=JOURNAL, key=key, version=int(version), tombstone=bool(tombstone), n=n
            )
        for op in dict.fromkeys(str(r[1]) for r in journal):
            self.ledger.emit(Kind.RESIDUE_EFFECT, op=op, dest=JOURNAL)
        for key, version, deleted, op in rows:
            self.ledger.emit(Kind.RESIDUE_ENTITY, op=op, dest=REPLICA, key=key, version=int(version), deleted=deleted)
        self.record.step(f"snapshot apply journal {JOURNAL} ({len(journal)} rows) and replica {REPLICA}")


def _check(spec: ScenarioSpec) -> None:
    if not spec.contract.per_key or spec.contract.expects_downstream:
        raise ConfigError(
            f"{spec.label}: a CQRS replica's contract must judge per key and expect no downstream",
            hint="set contract=FlowContract(expects_downstream=False, per_key=True)",
        )


FLOW = register(
    kafka_flow(
        "kafka_cqrs",
        "entity events keyed by aggregate id into one Kafka replica stage",
        parts=replace(TOPIC_PARTS, workload=EntityEvents, books=journal_books),
        check_spec=_check,
    )
)
