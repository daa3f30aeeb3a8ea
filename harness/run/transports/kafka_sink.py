"""The Kafka sink: reads the flow's output topic and dead-letter topic, recording what came out."""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.clients import db, kafka
from harness.clients.kafka import TopicReader, dlt_name
from harness.errors import HarnessError
from harness.ledger.schema import Kind
from harness.ledger.writer import Detail, LedgerWriter, Subject
from harness.run.transports.base import RunRecord
from harness.run.transports.sink import SinkBase
from harness.worker.kafka_context import op_of

_NO_DETAIL = Detail()

# How often a sink with nothing downstream asks for its group's committed offsets, and how long it waits.
PROGRESS_EVERY_S = 0.5
PROGRESS_TIMEOUT_S = 1.0


class KafkaSink(SinkBase):
    """Read ``output_topic`` (if any) and ``input_topic``'s ``-dlt`` from the start, in a thread.

    It reads ``read_committed`` outside any consumer group: the view of a downstream consumer,
    which never sees the records of an aborted transaction. Each record is one ``downstream``
    or ``dead_letter`` event with its partition and offset.

    A flow with nothing downstream (a replica) has no output to count. Given its ``group``, the
    sink counts what its group committed on the input instead: a record is done once its
    offset is committed after the work. A soak's closed loop waits for that count, so it submits
    more as the group commits.
    """

    def __init__(
        self,
        bootstrap: str,
        ledger: LedgerWriter,
        *,
        input_topic: str,
        output_topic: str | None,
        group: str | None = None,
    ) -> None:
        topics = {dlt_name(input_topic): Kind.DEAD_LETTER}
        if output_topic:
            topics[output_topic] = Kind.DOWNSTREAM
        super().__init__(ledger, topics, name="kafka-sink")
        self.bootstrap = bootstrap
        self.topics = topics
        # When the sink last found itself read to the end of every topic with nothing new since.
        self._caught_up_at: float | None = None
        self._reader = TopicReader(bootstrap, list(self.topics), client_id="txchaos-sink")
        self.input_topic = input_topic
        self._group = None if output_topic else group
        self._committed = 0  # records of the input the group committed, when nothing is downstream
        self._parts: list[int] = []

    def _run(self) -> None:
        probe = kafka.OffsetProbe(self.bootstrap) if self._group else None
        next_progress = 0.0
        try:
            while not self._stop.is_set():
                if probe is not None and time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + PROGRESS_EVERY_S
                    self._read_progress(probe)
                records = self._reader.poll(500, 0.05)
                if not records:
                    now = time.monotonic()
                    caught_up = self._caught_up()
                    with self._lock:
                        self._caught_up_at = now if caught_up else None
                ops = []
                seen: dict[Kind, tuple[list[Subject], list[Detail]]] = {}  # by kind, in the order read
                for rec in records:
                    op = self.op_in(rec.headers, rec.value, op_of(rec)) or rec.coord
                    kind = self.topics.get(rec.topic, Kind.DOWNSTREAM)
                    error = rec.headers.get("txchaos-error")
                    subjects, details = seen.setdefault(kind, ([], []))
                    subjects.append(
                        self.ledger.subject(
                            op=op, msg=rec.coord, dest=rec.topic, partition=rec.partition, offset=rec.offset
                        )
                    )
                    details.append(_NO_DETAIL if error is None else Detail(error=error))
                    ops.append(op)
                with self.ledger.batch():  # one write a poll; each counted out once its event is written
                    for kind, (subjects, details) in seen.items():
                        self.ledger.emit_each(kind, subjects, details=details)
                self._saw_all(ops)
        except BaseException as exc:  # surfaced by check(): a dead sink must fail the run, not hang it
            self._error = exc
        finally:
            self._reader.close()
            if probe is not None:
                probe.close()

    def _read_progress(self, probe: kafka.OffsetProbe) -> None:
        """Count the input records the group committed; under a fault, the last count stands."""
        assert self._group is not None
        try:
            self._parts = self._parts or probe.partitions(self.input_topic, PROGRESS_TIMEOUT_S)
            committed = probe.committed(self._group, self.input_topic, PROGRESS_TIMEOUT_S, parts=self._parts)
        except HarnessError:
            return
        with self._lock:
            self._committed = max(self._committed, sum(offset or 0 for offset in committed.values()))

    def count(self) -> int:
        """Return how many operations came out so far (with nothing downstream: how many the group committed)."""
        if self._group is None:
            return super().count()
        with self._lock:
            return self._committed

    def _caught_up(self) -> bool:
        """Return whether the reader is at the end of every topic; not while the broker cannot say.

        The sink reads through the proxy (Kafka's advertised address): a soak's partition or
        broker restart leaves its position queries unanswered, which says "not yet", not that
        the sink died. Its polls already ride such faults out (librdkafka reconnects).
        """
        try:
            return self._reader.caught_up()
        except HarnessError:
            return False

    def caught_up_since(self, since: float) -> bool:
        """Return whether the sink, checking after the monotonic time ``since``, had read every
        record its topics held (outputs written before then have been seen)."""
        with self._lock:
            return self._caught_up_at is not None and self._caught_up_at > since

    def check(self) -> None:
        if self._error is not None:
            raise HarnessError(f"the Kafka sink failed: {self._error}") from self._error


@dataclass(frozen=True)
class GroupBacklog:
    """Every input record past the group's committed offsets is a ``residue_queue`` (still to be processed)."""

    probe: kafka.OffsetProbe
    group: str
    topic: str
    ledger: LedgerWriter
    record: RunRecord

    def close(self, engine: db.Engine) -> None:
        left = self.probe.backlog(self.group, self.topic)
        start = {p: first for p, (first, _end) in left.items()}
        for rec in kafka.read_range(self.probe.bootstrap, self.topic, start, {p: end for p, (_f, end) in left.items()}):
            self.ledger.emit(
                Kind.RESIDUE_QUEUE,
                op=rec.headers.get("txchaos-op") or rec.key,
                msg=rec.coord,
                dest=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
            )
        self.record.step(f"residue of {self.topic} past the group's committed offsets {start}")
