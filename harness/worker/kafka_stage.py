"""The Kafka stage runtime: a consumer-group member running a user's handler per record.

Per batch: poll up to ``batch_size`` records, then for each record a Postgres transaction
around the handler (or one for the whole batch), its output records produced after the DB
commit, its offset stored; then the offset commit. Crash points (``KAFKA_POINTS``) sit between
the steps: the gap between ``after_db_commit`` and ``after_offset_commit`` is the at-least-once
window, and with librdkafka's default offset store (``offset_store="auto"``) any commit covers
records not yet processed, which is the loss window. ``KafkaStageOptions`` chooses the
discipline; the handler stays the same.

Every record is in the ledger with its coordinates (``msg`` = ``topic/partition@offset``,
``partition``, ``offset``) and the consumer's member id and group generation, so a verdict
points at the exact records. A record's offset commit is a ``broker_commit`` event; partition
assignments are ``rebalance`` events.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from harness.clients import db
from harness.clients.db import Connection
from harness.clients.kafka import TP, GroupConsumer, OutputProducer, Record, dlt_name
from harness.clients.kafka.hung import end_process
from harness.errors import HarnessError
from harness.jsontext import dumps, loads
from harness.ledger.schema import Kind
from harness.ledger.writer import Detail, DetailForm, Subject
from harness.worker.base import WorkerRuntime, load_handler
from harness.worker.crash import ForcedRedelivery
from harness.worker.high_water import HighWater
from harness.worker.kafka_context import BatchFailed, BatchHandler, KafkaContext, op_of, per_record
from harness.worker.kafka_options import KafkaStageOptions
from harness.worker.spec import WorkerSpec


class _Disconnect(Exception):
    """Drop the consumer and join again (a forced redelivery)."""


def _offsets_after(records: Sequence[Record]) -> dict[TP, int]:
    """Return the offset after the last of ``records`` per partition: what storing or committing them moves to."""
    after: dict[TP, int] = {}
    for r in records:
        after[r.tp] = max(after.get(r.tp, 0), r.offset + 1)
    return after


class KafkaStageWorker(WorkerRuntime):
    """Consume ``spec.input_queue`` (a topic) in group ``options["group"]`` until SIGTERM."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.opts = KafkaStageOptions.from_options(spec.options)
        self.group = str(spec.options["group"])
        self.bootstrap = self.endpoints.kafka.address
        handler: Any = load_handler(spec.handler)
        self.handler: BatchHandler = handler if getattr(handler, "txchaos_batch", False) else per_record(handler)
        self.high = HighWater(self.run_dir / "kafka-high")
        # Records handed out and not yet covered by an offset commit, per partition: (offset, the
        # ledger columns its events share).
        self.pending: dict[TP, list[tuple[int, Subject]]] = {}
        self._subjects: dict[str, Subject] = {}  # the current batch's records' shared columns, by coordinates
        self.batches = 0
        self._armed: frozenset[str] = frozenset()
        self.consumer: GroupConsumer | None = None
        self.producer: OutputProducer | None = None

    # -- plumbing ------------------------------------------------------------------------------
    def _member(self, *, with_id: bool = False) -> dict[str, Any]:
        """Return the group generation (and member id): per-record events carry the generation,
        ``rebalance`` events also the member id, which (src, pid, generation) then leads to."""
        if self.consumer is None:
            return {}
        m = self.consumer.member()
        return {"member": m.member_id, "generation": m.generation} if with_id else {"generation": m.generation}

    def _subject(self, record: Record, op: str) -> Subject:
        return Subject(op, record.coord, self.spec.stage, record.topic, record.partition, record.offset)

    def _subject_of(self, record: Record, op: str) -> Subject:
        # Five or so events a record share their columns: formatted once, when it is delivered.
        return self._subjects.get(record.coord) or self._subject(record, op)

    def _emit(self, kind: Kind, record: Record, op: str, **detail: Any) -> None:
        self._emit_about(self._subject_of(record, op), kind, **detail)

    def _emit_about(self, subject: Subject, kind: Kind, **detail: Any) -> None:
        # Most events a detail with every other record (its effect's table, its output's topic).
        shared = self.ledger.shared(**detail) if detail else None  # none: the writer's own is quicker
        self.ledger.emit_about(kind, subject, shared=shared)

    def _emit_each(self, kind: Kind, records: Sequence[Record], ops: Sequence[str]) -> None:
        """One ``kind`` event, with no detail, per record: one write for them all."""
        subjects = [self._subject_of(r, op) for r, op in zip(records, ops, strict=True)]
        self.ledger.emit_each(kind, subjects)

    def _reach(self, point: str, record: Record, op: str) -> None:
        # Arms are re-read once per batch (``_deliver``): five points per record, thousands of
        # records a second, and a stat of arms.json each time would be a fifth of the cost.
        self.crash.reach_armed(self._armed, point, op=op, msg=record.coord, stage=self.spec.stage)

    def _reach_all(self, point: str, records: Sequence[Record], ops: Sequence[str]) -> None:
        """``_reach`` ``point`` for each of ``records`` in turn; counted at once when no arm names it."""
        if point in self._armed:
            for r, op in zip(records, ops, strict=True):
                self._reach(point, r, op)
        else:
            self.crash.count(point, len(records))

    def _rebalanced(self, event: str, parts: list[TP]) -> None:
        if event == "lost":
            for tp in parts:
                self.pending.pop(tp, None)  # never committed by us: the next owner redoes them
        self.ledger.emit(
            Kind.REBALANCE,
            stage=self.spec.stage,
            dest=self.spec.input_queue,
            point=event,
            partitions=[p for _, p in parts],
            **self._member(with_id=True),
        )

    def _covered(self, committed: dict[TP, int]) -> None:
        """Write a broker_commit for every handed-out record the committed offsets now cover."""
        member = self._member()
        with self.ledger.batch():  # after the commit: one write for all it covered
            for tp, upto in committed.items():
                waiting = self.pending.get(tp, [])
                self.pending[tp] = [w for w in waiting if w[0] >= upto]
                detail = Detail(committed=upto, **member)  # the partition's records' alike
                covered = [subject for offset, subject in waiting if offset < upto]
                self.ledger.emit_each(Kind.BROKER_COMMIT, covered, shared=detail)

    def _join(self) -> GroupConsumer:
        o = self.opts
        return GroupConsumer(
            self.bootstrap,
            self.group,
            # ``also_consume``: further topics of the same member (a saga orchestrator's dead-letter topics).
            [self.spec.input_queue, *self.spec.options.get("also_consume", ())],
            offset_store="auto" if o.offset_store == "auto" else "manual",
            auto_commit=o.commit == "timer",
            auto_commit_ms=o.auto_commit_ms,
            session_timeout_ms=o.session_timeout_ms,
            heartbeat_ms=o.heartbeat_ms,
            instance_id=self.spec.name if o.static_membership else None,
            client_id=self.spec.name,
            on_rebalance=self._rebalanced,
            on_commit=self._covered if o.commit == "timer" else None,
        )

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> None:
        transactional = f"{self.group}.{self.spec.name}" if self.opts.commit == "transaction" else None
        # One transactional id per worker name: a restarted worker fences its dead predecessor
        # and aborts the transaction it left open.
        self.producer = OutputProducer(
            self.bootstrap, transactional_id=transactional, client_id=self.spec.name, on_hung=self._hung
        )
        while not self.stop.is_set():  # one pass per group membership: a forced disconnect rejoins
            self.consumer = self._join()
            self.ready(group=self.group)
            try:
                while not self.stop.is_set():
                    records = self.consumer.poll_batch(self.opts.batch_size, self.opts.poll_timeout_ms / 1000)
                    if records:
                        self.process_batch(records)
            except _Disconnect:
                pass
            self.consumer.close()  # leaves the group: its partitions move at once
            self.pending.clear()

    def _hung(self, what: str) -> None:
        """A transaction call librdkafka left blocked (``hung.py``): in the ledger, then the process ends."""
        self.ledger.emit(Kind.ERROR, stage=self.spec.stage, dest=self.spec.input_queue, error=what[:500], fatal=True)
        end_process(what)

    def _deliver(self, records: list[Record]) -> list[str]:
        """Write a deliver event per record handed over; return their operation ids."""
        self.batches += 1
        self._armed = self.crash.armed_points()
        member = self._member()
        highest: dict[TP, int] = {}
        for r in records:
            highest[r.tp] = max(highest.get(r.tp, -1), r.offset)
        before = {tp: self.high.mark(tp, top) for tp, top in highest.items()}
        ops: list[str] = []
        subjects: list[Subject] = []
        attempts: list[int] = []
        details: list[Detail] = []
        self._subjects = {}
        form = DetailForm(("index", "redelivered"), batch=self.batches, **member)
        for i, r in enumerate(records):
            op = op_of(r)
            subject = self._subjects[r.coord] = self._subject(r, op)
            redelivered = r.offset <= before[r.tp]
            attempt = 1
            if redelivered:
                self.attempts[r.coord] += 1
                attempt = 1 + self.attempts[r.coord]
            subjects.append(subject)
            attempts.append(attempt)
            details.append(form(i, redelivered))
            self.pending.setdefault(r.tp, []).append((r.offset, subject))
            ops.append(op)
        # one write for the batch's deliveries: nothing can crash between them
        self.ledger.emit_each(Kind.DELIVER, subjects, attempts=attempts, details=details)
        return ops

    def process_batch(self, records: list[Record]) -> None:
        """Run the stage on one polled batch, then commit its offsets as the options say."""
        ops = self._deliver(records)
        producer = self.producer
        assert producer is not None
        if self.opts.commit == "transaction":
            producer.begin()
        try:
            if self.opts.db_tx == "batch":
                self._in_batches(records, ops)
            else:
                self._each(records, ops)
            if self.opts.commit in ("batch", "transaction"):
                self._commit(records, ops)
        except ForcedRedelivery as forced:
            if self.opts.commit == "transaction":
                producer.abort()
            if forced.point == "after_offset_commit":
                return  # committed already: nothing left to give back
            raise _Disconnect from forced

    # -- one record, one batch -----------------------------------------------------------------
    def _context(self, conn: Connection, r: Record, op: str) -> KafkaContext:
        body: dict[str, Any] = loads(r.value) if r.value else {}  # no value: a tombstone
        return KafkaContext(
            op=op,
            body=body,
            db=conn,
            options=self.spec.options,
            worker=self.spec.name,
            stage=self.spec.stage,
            # bound with partial, not a lambda: a handler records an event or two per record
            _record=partial(self._emit_about, self._subject_of(r, op)),
            _crash=partial(self._reach, record=r, op=op),
            _side=self.side,
            message=r,
        )

    def _transaction(self, records: list[Record], ops: list[str], *, poll_points: bool) -> list[KafkaContext]:
        """Run the handler on ``records`` in one DB transaction and commit it; on any error roll
        back, write a rollback per record and re-raise. ``poll_points``: reach ``after_poll`` inside."""
        conn = self.stage_db()
        trans = conn.begin()
        try:
            if poll_points:  # before any context: making one has no effect a crash could cut short
                self._reach_all("after_poll", records, ops)
            contexts = [self._context(conn, r, op) for r, op in zip(records, ops, strict=True)]
            # The handler's events (an effect per record) in one write: nothing in it must be on
            # disk before the commit below, and a crash point it reaches flushes before it kills.
            with self.ledger.batch():
                self.handler(contexts)
            self._reach_all("before_db_commit", records, ops)
            trans.commit()
        except BaseException:
            if trans.is_active:
                trans.rollback()
            self._emit_each(Kind.DB_ROLLBACK, records, ops)
            raise
        self._emit_each(Kind.DB_COMMIT, records, ops)
        return contexts

    def _one(self, r: Record, op: str) -> None:
        """Process one record in its own DB transaction, retrying, then dead-lettering it."""
        self._reach("after_poll", r, op)
        attempt = 0
        while True:
            attempt += 1
            try:
                (ctx,) = self._transaction([r], [op], poll_points=False)
                break
            except ForcedRedelivery:
                raise
            except Exception as exc:
                if not self._survivable(exc, r, op, attempt):
                    raise
                if attempt >= self.opts.max_attempts:
                    # The recoverer knows which record failed: it parks it and says so.
                    self._emit(Kind.ALERT, r, op, reason=f"failed {attempt} times: {exc!r}"[:300])
                    self._to_dlt(r, op, repr(exc)[:300])
                    self._done(r)
                    return
                time.sleep(self.opts.backoff_ms / 1000 * 2 ** (attempt - 1))
        self._reach("after_db_commit", r, op)
        self._outputs([(ctx, r, op)])
        self._done(r)

    def _each(self, records: list[Record], ops: list[str]) -> None:
        for r, op in zip(records, ops, strict=True):
            self._one(r, op)
            if self.opts.commit == "record":
                self._commit([r], [op])

    def _in_batches(self, records: list[Record], ops: list[str]) -> None:
        """Run ``records`` in one DB transaction; a failure goes on as ``batch_errors`` says."""
        failure = self._batch_tx(records, ops, 1)
        if failure is None:
            return
        mode = self.opts.batch_errors
        if mode == "index" and isinstance(failure, BatchFailed) and 0 <= failure.index < len(records):
            i = failure.index
            if i > 0:
                self._in_batches(records[:i], ops[:i])
            self._one(records[i], ops[i])  # alone: retried, then dead-lettered with an alert
            if i + 1 < len(records):
                self._in_batches(records[i + 1 :], ops[i + 1 :])
            return
        if mode == "retry_batch":
            for attempt in range(2, self.opts.max_attempts + 1):
                time.sleep(self.opts.backoff_ms / 1000 * 2 ** (attempt - 2))
                failure = self._batch_tx(records, ops, attempt)
                if failure is None:
                    return
            # The error is the batch's, not a record's: every record of it goes, none is blamed.
            for r, op in zip(records, ops, strict=True):
                self._to_dlt(r, op, f"batch failed {self.opts.max_attempts} times: {failure!r}"[:300])
                self._done(r)
            return
        self._each(records, ops)  # one bad record must not sink the batch: isolate it

    def _batch_tx(self, records: list[Record], ops: list[str], attempt: int) -> Exception | None:
        """Process the batch in one DB transaction; return the handler's error if it failed."""
        try:
            contexts = self._transaction(records, ops, poll_points=True)
        except ForcedRedelivery:
            raise
        except Exception as exc:
            if not self._survivable(exc, None, None, attempt):
                raise
            return exc
        self._reach_all("after_db_commit", records, ops)
        self._outputs(zip(contexts, records, ops, strict=True))
        self._done(*records)  # one store for the batch: no crash point lies between its records
        return None

    def _survivable(self, exc: Exception, r: Record | None, op: str | None, attempt: int) -> bool:
        """Record a handler error; False when it is infrastructure trouble the worker must die of.

        Without a record (a batch transaction failed) the error is the batch's, not an operation's.
        """
        fatal = isinstance(exc, HarnessError) or db.is_connection_error(exc)
        detail: dict[str, Any] = {"error": repr(exc)[:500], "fatal": fatal, "attempt": attempt}
        if r is None or op is None:
            self.ledger.emit(
                Kind.ERROR, stage=self.spec.stage, dest=self.spec.input_queue, batch=self.batches, **detail
            )
        else:
            self._emit(Kind.ERROR, r, op, **detail)
        return not fatal

    def _outputs(self, handled: Iterable[tuple[KafkaContext, Record, str]]) -> None:
        """Produce what each handled record's context sent (and diverted); a send event each, the
        events of all of them one write (producing is asynchronous: the offset commit waits for it)."""
        producer = self.producer
        assert producer is not None
        subjects: list[Subject] = []
        details: list[Detail] = []
        sent_to: dict[tuple[str, str | None], Detail] = {}  # a send event's detail, by (topic, key)
        try:
            for ctx, r, op in handled:
                subject = self._subject_of(r, op)
                if ctx.diverted is not None:
                    details.append(self._dead_letter(r, op, ctx.diverted))
                    subjects.append(subject)
                for body, dest, key in ctx.sent:
                    target = dest or self.spec.output_queue
                    if target is None:
                        hint = "pass topic= to ctx.send"
                        raise HarnessError(f"stage {self.spec.stage} has no output topic", hint=hint)
                    out = key or op
                    producer.produce(target, dumps(body), key=out, headers={"txchaos-op": out})
                    detail = sent_to.get((target, key))
                    if detail is None:
                        keyed = {"key": key} if key else {}
                        detail = sent_to[target, key] = self.ledger.shared(topic=target, **keyed)
                    details.append(detail)
                    subjects.append(subject)
        finally:  # what was produced is in the ledger, an error or not
            self.ledger.emit_each(Kind.SEND, subjects, details=details)

    def _dead_letter(self, r: Record, op: str, reason: str) -> Detail:
        """Produce ``r`` to its dead-letter topic; return its send event's detail."""
        assert self.producer is not None
        target = dlt_name(r.topic)
        headers: dict[str, str | bytes | None] = {
            "txchaos-op": op,
            "txchaos-error": reason[:200],
            "txchaos-source": r.coord,
        }
        self.producer.produce(target, r.value, key=op, headers=headers)
        return Detail(topic=target, reason=reason[:200])

    def _to_dlt(self, r: Record, op: str, reason: str) -> None:
        self.ledger.emit_about(Kind.SEND, self._subject_of(r, op), shared=self._dead_letter(r, op, reason))

    def _done(self, *records: Record) -> None:
        """Store the offsets after ``records`` (manual store): the next commit covers them."""
        if self.opts.offset_store == "manual" and self.opts.commit != "transaction":
            assert self.consumer is not None
            self.consumer.store_offsets(_offsets_after(records))

    def _commit(self, records: list[Record], ops: list[str]) -> None:
        """Commit the offsets ``records`` were processed for (and whatever else the store holds)."""
        producer, consumer = self.producer, self.consumer
        assert producer is not None
        assert consumer is not None
        self._reach_all("before_offset_commit", records, ops)
        if self.opts.commit == "transaction":
            offsets = _offsets_after(records)
            producer.send_offsets(offsets, consumer)
            producer.commit()
            committed = offsets
        else:
            producer.flush()  # outputs durable before the offsets move past their inputs
            committed = consumer.commit()
        self._covered(committed)
        self._reach_all("after_offset_commit", records, ops)
