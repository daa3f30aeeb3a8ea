"""Run one Kafka scenario: per-run topics, a consumer group of worker processes, a verdict.

``KafkaRunSession`` is ``RunSession``'s Kafka twin with the same steps: ``open`` (schema and
tables, the run's topics ``<ns>.in``, ``<ns>.out`` and ``<ns>.in-dlt``, the sink, the workers)
-> ``arm`` / ``submit`` / ``hold_fault`` -> ``close`` (quiescence, stop the workers, residue,
effect snapshot, verdict). Operations are records keyed by their id. The residue is every
input record past the group's committed offsets: what the group would still have to process.
Healing (stop workers and sink, delete the run's topics, copy logs, manifest) runs in
``finally``.

``run_kafka_scenario`` submits its operations before the workers join, as a consumer catching
up on a backlog: the polled batches are then the same on every run of a seed (with one
partition, exactly ``batch_size`` records in offset order), so the anomalies are too.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.clients import db, kafka
from harness.errors import ConfigError, HarnessError
from harness.faults.base import active
from harness.ledger.reader import compact
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.folder import RunFolder
from harness.run.kafka_sink import KafkaSink
from harness.run.runner import RunResult, begin_run, reset_state
from harness.run.spec import Crash, FaultWindow, ScenarioSpec
from harness.run.supervisor import WorkerPool
from harness.stack.base import Endpoints
from harness.verify.checker import check_run
from harness.worker.crash import CrashArm, write_arms
from harness.worker.kafka_options import KafkaStageOptions
from harness.worker.spec import WorkerSpec

Progress = Callable[[str], None]
COMMITTED_POLL_S = 0.25  # how often quiescence asks the coordinator for the group's offsets


def _quiet(_: str) -> None:
    return None


class KafkaRunSession:
    """One Kafka run, driven step by step.

    >>> with KafkaRunSession(spec, endpoints) as run:
    ...     run.submit(20)
    ...     run.arm(Crash("before_offset_commit", op_index=7))
    ...     result = run.close()
    """

    def __init__(
        self, spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
    ) -> None:
        if spec.broker not in ("kafka", "kafka_cqrs"):
            raise ConfigError(f"{spec.label} runs on {spec.broker}", hint="set broker='kafka' or use RunSession")
        self.spec = spec
        self.opts = KafkaStageOptions.from_options(spec.options)
        self.endpoints = endpoints
        self.bootstrap = endpoints.kafka.address
        self.progress = progress
        self.folder = RunFolder.create(spec.name, spec.variant, spec.seed, runs_root)
        self.ledger = LedgerWriter(self.folder.path / "ledger", "driver")
        ns = f"txchaos.{self.folder.run_id}"
        self.input_topic, self.output_topic = f"{ns}.in", f"{ns}.out"
        self.dlt = kafka.dlt_name(self.input_topic)
        self.group = f"{ns}.group"
        self.ops: list[str] = []
        self.arms: list[CrashArm] = []
        self._numbers = itertools.count()
        self._engine: db.Engine | None = None
        self._pool: WorkerPool | None = None
        self._sink: KafkaSink | None = None
        self._producer: kafka.OutputProducer | None = None
        self._topics: list[str] = []
        self._started = 0.0
        self._result: RunResult | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, *, start_workers: bool = True) -> KafkaRunSession:
        """Reset the stack's state for this run, create its topics, start the sink (and the workers)."""
        spec, ep, folder = self.spec, self.endpoints, self.folder
        self._started = time.monotonic()
        begin_run(spec, ep, folder, self.ledger)
        try:
            self._engine = reset_state(spec, ep, folder)
            self._topics = [self.input_topic, self.output_topic, self.dlt]
            kafka.create_topics(self.bootstrap, self._topics, partitions=self.opts.partitions)
            folder.step(f"create topics {', '.join(self._topics)} ({self.opts.partitions} partition(s))")
            output = self.output_topic if spec.contract.expects_downstream else None
            self._sink = KafkaSink(self.bootstrap, self.ledger, input_topic=self.input_topic, output_topic=output)
            self._sink.start()
            self._producer = kafka.OutputProducer(self.bootstrap, client_id=f"txchaos-driver-{folder.run_id}")
            if start_workers:
                self.start_workers()
        except BaseException:
            self._heal()
            raise
        return self

    def start_workers(self) -> None:
        """Start the consumer group's worker processes (once)."""
        if self._pool is not None:
            return
        self._pool = WorkerPool(self._worker_specs(), self.folder.path, self.ledger)
        self._pool.start()
        o = self.opts
        self.folder.step(
            f"start {self.spec.workers} worker(s) running {self.spec.handler} in group {self.group} on "
            f"{self.input_topic}: batch {o.batch_size}, offset store {o.offset_store}, commit {o.commit}, "
            f"db tx per {o.db_tx}"
        )

    def close(self) -> RunResult:
        """Wait for quiescence, collect the residue and return the verdict; heals in any case."""
        if self._result is not None:
            return self._result
        if self._sink is None or self._engine is None:
            raise HarnessError("close() of a run that is not open", hint="call open() (or use the session as `with`)")
        try:
            self.start_workers()
            assert self._pool is not None
            self._await_quiescence(self._sink, self._pool)
            self._pool.stop()
            self._pool = None
            self._residue()
            self._sink.stop()
            self._sink = None
            self._snapshot_effects(self._engine)
            self.folder.close_books()  # the snapshot is in the ledger: the folder is complete
        finally:
            self._heal()
        self._result = self._verdict()
        return self._result

    def _heal(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        if self._sink is not None:
            self._sink.stop(idle_s=0)
            self._sink = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._topics:
            try:
                kafka.delete_topics(self.bootstrap, self._topics)
            except HarnessError as exc:  # the ledger holds the run; a leftover topic harms nothing
                self.folder.step(f"could not delete the run's topics: {exc}")
            self._topics = []
        took = round(time.monotonic() - self._started, 3)
        self.ledger.emit(Kind.RUN_END, took_s=took)
        self.folder.finish(self.endpoints, took_s=took)

    def __enter__(self) -> KafkaRunSession:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None or self._sink is not None:
            self._heal()

    # -- acting while the flow runs ------------------------------------------------------------
    def submit(self, count: int, *, poison: bool = False) -> list[str]:
        """Produce ``count`` new operations, keyed by their (requester-made) ids; return the ids.

        ``poison`` marks them as poison records (as do the spec's ``poison`` numbers). Returns
        once the broker has acknowledged every record; the ledger holds a SUBMIT for each before
        it goes out.
        """
        if self._producer is None:
            raise HarnessError("submit() to a run that is not open", hint="call open() first")
        new = [self.op_id(next(self._numbers)) for _ in range(count)]
        for op in new:
            n = len(self.ops)
            self.ledger.emit(Kind.SUBMIT, op=op, dest=self.input_topic)
            fields: dict[str, object] = {"op": op, "n": n, "amount": 1 + n % 7}
            if poison or n in self.spec.poison:
                fields["poison"] = True  # a record its handler cannot process, on every delivery
            body = json.dumps(fields)
            self._producer.produce(self.input_topic, body, key=op, headers={"txchaos-op": op})
            self.ops.append(op)
        self._producer.flush()
        self.folder.step(f"submit {count} operation(s) to {self.input_topic}")
        self.progress(f"submitted {len(self.ops)} operations")
        return new

    def arm(self, crash: Crash, *, op: str | None = None) -> CrashArm:
        """Arm a crash point: on ``op`` (or the spec's ``op_index``), or on the nth hit."""
        if op is None and crash.op_index is not None:
            op = self.op_id(crash.op_index)
        arm = CrashArm(
            id=f"arm-{len(self.arms)}",
            point=crash.point,
            op=op,
            nth=crash.nth,
            action=crash.action,
            worker=crash.worker,
        )
        self.arms.append(arm)
        write_arms(self.folder.path, self.arms)
        on = f"op {op}" if op else f"hit #{crash.nth}"
        who = f" in {crash.worker}" if crash.worker else ""
        self.folder.step(f"arm {crash.action} at {crash.point} on {on}{who}")
        return arm

    def hold_fault(self, window: FaultWindow) -> None:
        """Apply ``window``'s fault, let the flow run under it for ``hold_s``, then heal it."""
        fault: Any = window.fault
        bound = fault.on(self.endpoints) if window.target is None else fault.on(window.target, self.endpoints)
        self.folder.step(f"fault {window.describe()}")
        with active(bound, self.ledger):
            time.sleep(window.hold_s)
        self.progress(f"healed {bound.name}")

    def op_id(self, n: int) -> str:
        """Return the id of the run's operation number ``n`` (deterministic, so a seed replays)."""
        return f"{self.spec.variant}-s{self.spec.seed}-op{n:05d}"

    def duplicate_effects(self) -> list[str]:
        """Return the operation ids whose effect is applied more than once right now."""
        if self._engine is None:
            raise HarnessError("duplicate_effects() of a run that is not open", hint="call open() first")
        return db.duplicated_values(self._engine, self.spec.effect_table, self.spec.effect_column)

    @property
    def restarts(self) -> int:
        return self._pool.restarts if self._pool else 0

    # -- phases --------------------------------------------------------------------------------
    def _worker_specs(self) -> list[WorkerSpec]:
        spec = self.spec
        endpoints_path = self.folder.path / "endpoints.json"
        endpoints_path.write_text(self.endpoints.to_json())
        output = self.output_topic if spec.contract.expects_downstream else None
        return [
            WorkerSpec(
                name=f"worker-{i}",
                run_dir=str(self.folder.path),
                endpoints_path=str(endpoints_path),
                handler=spec.handler,
                stage=spec.name,
                input_queue=self.input_topic,
                output_queue=output,
                options={**spec.options, "group": self.group},
                kind="kafka",
            )
            for i in range(spec.workers)
        ]

    def consumed(self) -> bool:
        """Return True when the group has committed every input record (nothing left to process)."""
        ends = kafka.end_offsets(self.bootstrap, self.input_topic)
        done = kafka.committed_offsets(self.bootstrap, self.group, self.input_topic)
        return all((done.get(p) or 0) >= end for p, end in ends.items())

    def _await_quiescence(self, sink: KafkaSink, pool: WorkerPool) -> None:
        """Wait until every operation came out, or the group has committed all input, the sink has
        read its topics to their end since, and nothing came out for ``settle_s`` (a lost
        operation never comes out); bounded by the timeout.

        The quiet time counts from when the commit was first seen: with the auto offset store a
        commit covers records whose output is still to come.
        """
        want = set(self.ops)
        settle = max(self.spec.settle_s, COMMITTED_POLL_S)
        deadline = time.monotonic() + self.spec.timeout_s
        last_report, next_check = 0, 0.0
        consumed_at: float | None = None
        while time.monotonic() < deadline:
            sink.check()
            done = len(want & sink.accounted())
            if done == len(want):
                pool.wait_serving(deadline)  # a replaced consumer may still get records back
                self._await_committed(deadline)
                break
            now = time.monotonic()
            if consumed_at is None and now >= next_check:
                next_check = now + COMMITTED_POLL_S
                if self.consumed():
                    consumed_at = time.monotonic()  # the outputs were flushed before this commit
            # Every output written before the commit must have been read, or an operation still on
            # its way (a dead letter the sink has not fetched yet) would be reported lost.
            # A consumer being replaced may still get records back: idle means every one serves.
            if (
                consumed_at is not None
                and min(now - consumed_at, sink.quiet_s()) >= settle
                and sink.caught_up_since(consumed_at)
                and pool.serving()
            ):
                self.progress(f"input consumed and committed; {len(want) - done} operation(s) never came out")
                break
            if done - last_report >= max(1, len(want) // 10):
                self.progress(f"{done}/{len(want)} operations out, {pool.restarts} worker restart(s)")
                last_report = done
            time.sleep(0.02)
        else:
            self.progress(f"timeout after {self.spec.timeout_s}s: {len(want - sink.accounted())} operation(s) not out")
        time.sleep(self.spec.settle_s)  # let late duplicates arrive before the books close
        out = len(sink.accounted() & want)
        self.folder.step(f"quiescence after {out}/{len(want)} out; {pool.restarts} restart(s)")

    def _await_committed(self, deadline: float) -> None:
        """Wait (bounded) until the group committed all input: a worker killed after its output
        but before its offset commit gets the records back, and its skip commits them."""
        while time.monotonic() < deadline and not self.consumed():
            time.sleep(COMMITTED_POLL_S)

    def _residue(self) -> None:
        """Record every input record past the group's committed offsets (still to be processed)."""
        ends = kafka.end_offsets(self.bootstrap, self.input_topic)
        committed = kafka.committed_offsets(self.bootstrap, self.group, self.input_topic)
        start = {p: committed.get(p) or 0 for p in ends}
        for rec in kafka.read_range(self.bootstrap, self.input_topic, start, ends):
            self.ledger.emit(
                Kind.RESIDUE_QUEUE,
                op=rec.headers.get("txchaos-op") or rec.key,
                msg=rec.coord,
                dest=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
            )
        self.folder.step(f"residue of {self.input_topic} past the group's committed offsets {start}")

    def _snapshot_effects(self, engine: db.Engine) -> None:
        table, column = self.spec.effect_table, self.spec.effect_column
        for op in db.column_values(engine, table, column):
            self.ledger.emit(Kind.RESIDUE_EFFECT, op=op, dest=table)
        self.folder.step(f"snapshot effect table {table}")

    def _verdict(self) -> RunResult:
        path = self.folder.path
        try:
            compact(path / "ledger")
            verdict = check_run(path, self.spec.contract, scenario=self.spec.label, seed=self.spec.seed)
        except Exception as exc:
            hint = "the ledger segments are kept in ledger/"
            raise HarnessError(f"verifying {path} failed: {exc}", hint=hint) from exc
        verdict = replace(verdict, steps=tuple(self.folder.manifest.get("steps", ())))
        verdict.write(path / "verdict.json")
        return RunResult(path, verdict, self.spec)


def run_kafka_scenario(
    spec: ScenarioSpec,
    endpoints: Endpoints,
    *,
    runs_root: Path | None = None,
    progress: Progress = _quiet,
    session: type[KafkaRunSession] = KafkaRunSession,
) -> RunResult:
    """Run ``spec`` (``broker="kafka"``) against ``endpoints`` and return the result.

    The operations before the first fault window are submitted before the workers join (a
    backlog, so the batches are the same on every run of the seed); the rest as the faults say.
    ``session``: a ``KafkaRunSession`` subclass that submits its own records (CQRS entity events).
    """
    run = session(spec, endpoints, runs_root=runs_root, progress=progress).open(start_workers=False)
    try:
        for crash in spec.crashes:
            run.arm(crash)
        windows = sorted(spec.faults, key=lambda w: w.after_ops)
        backlog = min([w.after_ops for w in windows] or [spec.messages])
        if backlog:
            run.submit(backlog)
        run.start_workers()
        for window in windows:
            if window.after_ops > len(run.ops):
                run.submit(window.after_ops - len(run.ops))
            run.hold_fault(window)
        if spec.messages > len(run.ops):
            run.submit(spec.messages - len(run.ops))
        return run.close()
    finally:
        run.__exit__(None, None, None)
