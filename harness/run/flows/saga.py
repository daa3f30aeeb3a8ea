"""Run one Kafka saga scenario: an orchestrator and two participants as worker processes, a verdict.

The ``kafka_saga`` flow's parts put three Kafka stages in place of one queue: the topology
(``SagaTopics``) is the run's topics ``<ns>.saga`` (the orchestrator's inbox: starts and
replies), ``<ns>.payment`` and ``<ns>.seat`` (requests) and their ``-dlt`` topics, and the
``orchestrator``, ``payment`` and ``seat`` processes; an operation is a saga the driver starts
(``SagaStarts``). Quiescence (``sagas_final``) is every saga in a final state (``completed`` or
``compensated``), or no saga moving while the participants have committed all their requests.

How the books close into the ledger (contract: no downstream, no poison rule), so the checker
names saga anomalies with saga and step ids:

- a saga (``<op>``) in a final state is one ``residue_effect`` (its outcome); one in any other
  state is ``residue_queue`` (``stuck``); one the orchestrator never started has neither
  (``lost``);
- every request the orchestrator sent is a ``submit`` of its step operation (``<op>.pay``,
  ``<op>.seat``, ``<op>.refund``), and every row of the participants' effect tables a
  ``residue_effect`` of it: a step applied twice is ``duplicate-effect``; a request still past
  its participant's committed offset is ``residue_queue``; a request in a ``-dlt`` topic is a
  ``dead_letter`` (with its effect applied: ``dead-lettered-with-effect``).

The lifecycle (arms, faults, the driver loop, the verdict and healing) is ``RunSession``'s; a
saga a crash names starts alone (``SagaStarts.alone``), the sagas before it final.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sqlalchemy import text

from harness.clients import db, kafka
from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.patterns.kafka_saga import EFFECT_TABLES, is_final
from harness.patterns.saga_options import (
    FINAL_STATES,
    ORCHESTRATOR,
    PAYMENT,
    PROCESSES,
    SEAT,
    SagaOptions,
    first_step_of,
    step_op,
)
from harness.poll import deadline_in, poll_until
from harness.run.core.books import Book
from harness.run.core.parts import worker_spec
from harness.run.core.roles import Plain, Quiescence, SessionView, UntilDone
from harness.run.flows.kafka import kafka_flow
from harness.run.spec.flow import Parts, register
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.transports.kafka import KafkaTransport
from harness.stack.base import Endpoints
from harness.worker.kafka_options import KafkaStageOptions
from harness.worker.spec import WorkerSpec

PARTICIPANT_HANDLERS = {
    "naive": "harness.patterns.kafka_saga:participant_naive",
    "unique": "harness.patterns.kafka_saga:participant_unique",
    "inbox": "harness.patterns.kafka_saga:participant_inbox",
}
STALL_S = 1.5  # no saga moved this long, participants caught up: the rest are stuck
POLL_S = 0.05
IDLE_READ_S = 1.0  # how long a probe waits for a record the orchestrator has still to handle


class SagaTopics:
    """The topology of a saga run: the orchestrator's inbox, the participants' request topics, their groups."""

    late_workers: ClassVar[bool] = False
    submits_via: ClassVar[frozenset[str]] = frozenset({"kafka"})

    def __init__(self, session: SessionView) -> None:
        self.session = session
        settings = session.spec.settings_as(SagaSettings)
        self.saga, self.kopts = settings.saga, settings.kafka
        # The harness's own clients (submissions, the sink, backlog probes); a soak's skip the proxy
        # like the ActiveMQ flow's, or its nemesis would fault the driver instead of the flow.
        self.bootstrap = session.endpoints.kafka_bootstrap(direct=session.bypass_faults)
        ns = session.ns
        self.group = f"{ns}.group"
        self.inbox, self.payment_topic, self.seat_topic = f"{ns}.saga", f"{ns}.payment", f"{ns}.seat"
        self.groups = {p: f"{ns}.{p}" for p in (ORCHESTRATOR, PAYMENT, SEAT)}
        self.requests = {PAYMENT: self.payment_topic, SEAT: self.seat_topic}
        self.transport = KafkaTransport(self.bootstrap, session.folder, partitions=self.kopts.partitions)

    @classmethod
    def check(cls, spec: ScenarioSpec, endpoints: Endpoints) -> None:
        return None

    def provision(self) -> None:
        base = [self.inbox, self.payment_topic, self.seat_topic]
        self.transport.create([*base, *(kafka.dlt_name(t) for t in base)])

    def announce(self) -> None:
        s = self.saga
        self.session.folder.step(
            f"start orchestrator (dead-letter replies: {s.dlt_replies}, re-send: {s.resend}), payment and seat "
            f"(participant {s.participant}, reply {s.reply})"
        )

    def release(self) -> None:
        self.transport.release()

    def effect_tables(self) -> tuple[tuple[str, str], ...]:
        return tuple((table, "op_id") for table in sorted(set(EFFECT_TABLES.values())))

    def states(self) -> dict[str, str]:
        """Return saga id -> state, now."""
        with self.session.engine("states").connect() as conn:
            return {str(s): str(st) for s, st in conn.execute(text("SELECT saga_id, state FROM sagas"))}

    def worker_specs(self) -> list[WorkerSpec]:
        spec, s = self.session.spec, self.saga
        common = {k: v for k, v in spec.options.items() if k != "commit"}

        def stage(name: str, handler: str, topic: str, output: str | None, **options: object) -> WorkerSpec:
            opts = {**common, "group": self.groups[name], **options}
            return worker_spec(
                self.session.folder.path,
                name,
                handler,
                input_queue=topic,
                output_queue=output,
                options=opts,
                kind="kafka",
            )

        dlts = [kafka.dlt_name(self.payment_topic), kafka.dlt_name(self.seat_topic)] if s.dlt_replies else []
        participant = PARTICIPANT_HANDLERS[s.participant]
        return [
            # The orchestrator commits after its outputs (never in a Kafka transaction): the
            # request topics then hold no transaction markers and their committed offsets reach
            # the end offsets.
            stage(
                ORCHESTRATOR,
                spec.handler,
                self.inbox,
                None,
                commit="batch",
                payment_topic=self.payment_topic,
                seat_topic=self.seat_topic,
                also_consume=dlts,
                resend=s.resend,
            ),
            stage(PAYMENT, participant, self.payment_topic, self.inbox, commit=s.commit),
            stage(SEAT, participant, self.seat_topic, self.inbox, commit=s.commit),
        ]

    def caught_up(self) -> bool:
        """Return True when both participants have committed every request sent to them."""
        probe = self.transport.probe
        return not any(probe.backlog(self.groups[p], topic) for p, topic in self.requests.items())

    def orchestrator_idle(self) -> bool:
        """Return True when no record the orchestrator must still handle is visible to it.

        Its inbox gets the participants' transactional replies, whose commit markers take
        offsets: a committed offset below the end offset may mean a marker, not a record. So
        past the committed offsets it reads what a read_committed consumer would get next.
        """
        topics = [self.inbox]
        if self.saga.dlt_replies:
            topics += [kafka.dlt_name(self.payment_topic), kafka.dlt_name(self.seat_topic)]
        group = self.groups[ORCHESTRATOR]
        start: dict[kafka.TP, int] = {}
        for topic in topics:
            start |= {(topic, p): first for p, (first, _end) in self.transport.probe.backlog(group, topic).items()}
        if not start:
            return True
        reader = kafka.TopicReader(self.bootstrap, sorted({t for t, _ in start}), start=start, client_id="txchaos-idle")
        try:
            deadline = time.monotonic() + IDLE_READ_S
            while time.monotonic() < deadline:
                if any(r.tp in start and r.offset >= start[r.tp] for r in reader.poll(50, 0.1)):
                    return False
        finally:
            reader.close()
        return True

    def wait_final(self, timeout_s: float | None = None) -> dict[str, str]:
        """Wait until every saga so far is final, or none moved for ``STALL_S`` with every
        process caught up, or ``timeout_s``; return the sagas not final and their state."""
        s = self.session
        last: dict[str, str] | None = None
        moved = time.monotonic()
        pending: dict[str, str] = {}

        def final_or_stalled() -> bool:
            nonlocal last, moved, pending
            states = self.states()
            pending = {op: states.get(op, "not started") for op in s.ops if not is_final(states.get(op))}
            if not pending:
                return True
            if states != last:
                last, moved = states, time.monotonic()
                return False
            return (
                time.monotonic() - moved >= STALL_S
                and (s.pool is None or s.pool.serving())
                and self.caught_up()
                and self.orchestrator_idle()
            )

        poll_until(
            final_or_stalled,
            deadline=deadline_in(s.spec.timeout_s if timeout_s is None else timeout_s),
            every_s=POLL_S,
            report=lambda waited: s.progress(f"{len(pending)} saga(s) not final after {waited:.0f}s"),
        )
        return pending


def saga_books(session: SessionView, place: SagaTopics) -> tuple[Book, ...]:
    """The saga run's one book (``SagaBooks``)."""
    return (SagaBooks(session, place),)


@dataclass
class SagaStarts(Plain):
    """Operations that are sagas: each a start in the orchestrator's inbox; a crash arms a saga's step."""

    session: SessionView
    place: SagaTopics
    refused: set[str] = field(default_factory=set)
    flaky: set[str] = field(default_factory=set)
    _final: int = field(default=0, init=False)  # the sagas final at the last count

    def out_count(self) -> int | None:
        """Return how many sagas are final now (a soak's closed loop keeps started minus final under
        its window); while the database cannot answer (a kill of it), the count it last gave."""
        try:
            with self.session.engine("out_count").connect() as conn:
                final = conn.execute(
                    text("SELECT count(*) FROM sagas WHERE state = ANY(:final)"), {"final": sorted(FINAL_STATES)}
                ).scalar_one()
        except Exception as exc:
            if not db.is_connection_error(exc):
                raise
            return self._final
        self._final = int(final)
        return self._final

    def alone(self) -> set[int]:
        # A saga a crash names starts alone, the flow quiet before and after it: the scenario's
        # expectation is about that saga.
        return {c.op_index for c in self.session.spec.crashes if c.op_index is not None}

    def wait_idle(self) -> None:
        self.place.wait_final()

    def submit(
        self, count: int, *, poison: bool = False, refuse: bool = False, fail_times: int = 0, **extra: Any
    ) -> list[str]:
        """Start ``count`` sagas; return their ids.

        ``refuse``: the seat participant refuses their seat (a semantic error: compensated).
        ``fail_times``: their seat request fails that often with a transient error first (more
        than the participants' ``max_attempts``: it is dead-lettered). Without either, the
        spec's ``refuse_seat`` / ``flaky_seat`` numbers say.
        """
        if poison:
            raise ConfigError("a saga start has no poison form", hint="submit(refuse=True) or fail_times=")
        if extra:
            raise ConfigError(f"a saga start has no option {sorted(extra)}", hint="give refuse= or fail_times=")
        s, place = self.session, self.place
        saga = place.saga
        new = s.mint(count)
        for op in new:
            n = len(s.ops)
            no = refuse or n in saga.refuse_seat
            fails = fail_times or (saga.fail_times if n in saga.flaky_seat else 0)
            body = {"type": "start", "op": op, "n": n, "amount": 1 + n % 7, "refuse": "seat" if no else None}
            body["fail_times"] = fails
            if no:
                self.refused.add(op)
            if fails:
                self.flaky.add(op)
            s.ledger.emit(Kind.SUBMIT, op=op, dest=place.inbox, refuse=body["refuse"], fail_times=fails)
            place.transport.send(place.inbox, json.dumps(body), key=op, headers={"txchaos-op": op})
            s.ops.append(op)
        place.transport.flush()
        s.folder.step(
            f"start {count} saga(s)"
            + (", seat refused" if refuse else "")
            + (f", seat fails {fail_times}x" if fail_times else "")
        )
        s.progress(f"started {len(s.ops)} sagas")
        return new

    def arm_op(self, crash: Crash) -> str | None:
        """Return the operation ``crash`` names: ``op_index`` is a saga, whose step in the crash's process is armed."""
        if crash.op_index is None:
            return None
        saga = self.session.op_id(crash.op_index)
        step = first_step_of(crash.worker or ORCHESTRATOR)
        return step_op(saga, step) if step else saga


def sagas_final(session: SessionView, place: SagaTopics) -> Quiescence:
    """Quiet when every saga is final (or none moves, every process caught up); then a participant
    killed after its reply and before its offset commit gets its request back once restarted, and
    that redelivery happens before the books close."""

    def caught_up(deadline: float) -> bool:
        return poll_until(place.caught_up, deadline=deadline, every_s=0.1)

    return UntilDone(session, place.wait_final, "sagas final", caught_up)


@dataclass
class SagaBooks:
    """A saga run's books: each saga's state (final: its effect; else still in its queue), every
    participant's effect rows, the requests the orchestrator sent (as submissions of their own),
    each request left past its group's offsets, and the dead-lettered ones."""

    session: SessionView
    place: SagaTopics

    def close(self, engine: db.Engine) -> None:
        s, place = self.session, self.place
        states = place.states()
        for op in s.ops:
            state = states.get(op)
            if is_final(state):
                s.ledger.emit(Kind.RESIDUE_EFFECT, op=op, dest="sagas", state=state)
            elif state is not None:
                s.ledger.emit(Kind.RESIDUE_QUEUE, op=op, dest="sagas", state=state)
        for table in sorted(set(EFFECT_TABLES.values())):
            for op in db.column_values(engine, table, "op_id"):
                s.ledger.emit(Kind.RESIDUE_EFFECT, op=op, dest=table)
        for process, topic in place.requests.items():
            ends = place.transport.probe.end_offsets(topic)
            records = kafka.read_range(place.bootstrap, topic, {}, ends)
            seen: set[str] = set()
            for rec in records:
                if rec.key and rec.key not in seen:
                    seen.add(rec.key)
                    s.ledger.emit(Kind.SUBMIT, op=rec.key, msg=rec.coord, dest=topic, by="orchestrator")
            left = place.transport.probe.backlog(place.groups[process], topic)
            for rec in records:
                if rec.partition in left and rec.offset >= left[rec.partition][0]:
                    s.ledger.emit(
                        Kind.RESIDUE_QUEUE,
                        op=rec.key,
                        msg=rec.coord,
                        dest=topic,
                        partition=rec.partition,
                        offset=rec.offset,
                    )
            for rec in kafka.read_visible(place.bootstrap, kafka.dlt_name(topic)):
                s.ledger.emit(
                    Kind.DEAD_LETTER,
                    op=rec.key,
                    msg=rec.coord,
                    dest=rec.topic,
                    partition=rec.partition,
                    offset=rec.offset,
                    error=rec.headers.get("txchaos-error", ""),
                )
        s.folder.step("close the books: saga states, effect tables, requests, dead-letter topics")


@dataclass(frozen=True)
class SagaSettings:
    """A saga spec's typed options: the saga's variant and its stages' Kafka discipline."""

    saga: SagaOptions
    kafka: KafkaStageOptions

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SagaSettings:
        return cls(SagaOptions.from_options(options), KafkaStageOptions.from_options(options))


def _check(spec: ScenarioSpec) -> None:
    for crash in spec.crashes:
        if crash.worker not in PROCESSES:
            raise ConfigError(
                f"saga crash at {crash.point} names process {crash.worker!r}",
                hint=f"set Crash(worker=...) to one of {', '.join(PROCESSES)}",
            )


FLOW = register(
    kafka_flow(
        "kafka_saga",
        "an orchestrator and two participants, each a Kafka stage",
        parts=Parts(SagaTopics, SagaStarts, sagas_final, saga_books),
        parse=SagaSettings.from_options,
        check_spec=_check,
    )
)
