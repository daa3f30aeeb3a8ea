"""Run one scenario against a live stack: the fixed lifecycle of every run.

prepare (schema, reset, queues) -> start sink and workers -> arm crashes -> submit ->
wait for quiescence -> stop workers -> drain residue -> snapshot effects -> verdict.
Healing (stop workers and sink, copy logs, write the manifest) runs in ``finally``, so an
error never loses what the ledger already holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.clients import db
from harness.clients.activemq import StompClient, drain
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import HarnessError
from harness.ledger.reader import compact
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.folder import RunFolder
from harness.run.sink import Sink, op_of
from harness.run.spec import ScenarioSpec
from harness.run.supervisor import WorkerPool
from harness.stack.base import Endpoints
from harness.verify.checker import check_run
from harness.verify.verdict import Verdict
from harness.worker.crash import CrashArm, write_arms
from harness.worker.spec import WorkerSpec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    """A finished run: its folder and verdict, and whether the verdict is what the spec expects."""

    run_dir: Path
    verdict: Verdict
    spec: ScenarioSpec

    @property
    def as_expected(self) -> bool:
        return set(self.verdict.found()) == set(self.spec.expect)


def _quiet(_: str) -> None:
    return None


class ScenarioRun:
    """Drive one scenario run; ``execute`` returns the result."""

    def __init__(
        self, spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
    ) -> None:
        self.spec = spec
        self.endpoints = endpoints
        self.progress = progress
        self.folder = RunFolder.create(spec.name, spec.variant, spec.seed, runs_root)
        self.ledger = LedgerWriter(self.folder.path / "ledger", "driver")
        ns = f"txchaos.{self.folder.run_id}"
        self.input_queue, self.output_queue = f"{ns}.in", f"{ns}.out"
        self.ops = [f"{spec.variant}-s{spec.seed}-op{i:05d}" for i in range(spec.messages)]

    def execute(self) -> RunResult:
        spec, ep, folder = self.spec, self.endpoints, self.folder
        folder.start(spec, ep)
        self.ledger.emit(Kind.RUN_START, scenario=spec.label, seed=spec.seed, run_id=folder.run_id)
        engine = db.engine(ep.postgres_url)
        pool: WorkerPool | None = None
        sink: Sink | None = None
        started = time.monotonic()
        try:
            self._prepare(engine)
            sink = Sink(ep.stomp, self.ledger, input_queue=self.input_queue, output_queue=self.output_queue)
            sink.start()
            pool = WorkerPool(self._worker_specs(), folder.path, self.ledger)
            pool.start()
            folder.step(f"start {spec.workers} worker(s) running {spec.handler} on {self.input_queue}")
            self._arm()
            self._submit()
            self._await_quiescence(sink, pool)
            pool.stop()
            pool = None
            self._drain_residue()
            sink.stop()
            sink = None
            self._snapshot_effects(engine)
        finally:
            if pool is not None:
                pool.stop()
            if sink is not None:
                sink.stop(idle_s=0)
            engine.dispose()
            self.ledger.emit(Kind.RUN_END, took_s=round(time.monotonic() - started, 3))
            folder.finish(ep, took_s=round(time.monotonic() - started, 3))
        return self._verdict()

    # -- phases --------------------------------------------------------------------------------
    def _prepare(self, engine: db.Engine) -> None:
        db.apply_schema(engine, self.spec.schema)
        db.truncate_all(engine)
        ToxiproxyAdmin(self.endpoints.toxiproxy_api).reset()
        self.folder.step(f"reset: schema {self.spec.schema}, tables truncated, toxics removed")

    def _worker_specs(self) -> list[WorkerSpec]:
        endpoints_path = self.folder.path / "endpoints.json"
        endpoints_path.write_text(self.endpoints.to_json())
        return [
            WorkerSpec(
                name=f"worker-{i}",
                run_dir=str(self.folder.path),
                endpoints_path=str(endpoints_path),
                handler=self.spec.handler,
                stage=self.spec.name,
                input_queue=self.input_queue,
                output_queue=self.output_queue if self.spec.contract.expects_downstream else None,
                options=dict(self.spec.options),
            )
            for i in range(self.spec.workers)
        ]

    def _arm(self) -> None:
        arms = []
        for i, crash in enumerate(self.spec.crashes):
            op = self.ops[crash.op_index] if crash.op_index is not None else None
            arms.append(CrashArm(id=f"arm-{i}", point=crash.point, op=op, nth=crash.nth))
            self.folder.step(crash.describe(self.ops))
        write_arms(self.folder.path, arms)

    def _submit(self) -> None:
        ep = self.endpoints.stomp
        with StompClient(ep.host, ep.port, client_id="txchaos-driver") as client:
            for i, op in enumerate(self.ops):
                self.ledger.emit(Kind.SUBMIT, op=op, dest=self.input_queue)
                client.send(
                    self.input_queue, json.dumps({"op": op, "n": i, "amount": 1 + i % 7}), headers={"txchaos-op": op}
                )
            # An empty transaction's ABORT receipt proves the broker has taken every SEND before it.
            client.abort(client.begin())
        self.folder.step(f"submit {len(self.ops)} operations to {self.input_queue}")
        self.progress(f"submitted {len(self.ops)} operations")

    def _await_quiescence(self, sink: Sink, pool: WorkerPool) -> None:
        """Wait until every operation came out (downstream or DLQ), then settle; bounded."""
        want = set(self.ops)
        deadline = time.monotonic() + self.spec.timeout_s
        last_report = 0
        while time.monotonic() < deadline:
            sink.check()
            done = len(want & sink.accounted())
            if done == len(want):
                break
            if done - last_report >= max(1, len(want) // 10):
                self.progress(f"{done}/{len(want)} operations out, {pool.restarts} worker restart(s)")
                last_report = done
            time.sleep(0.02)
        else:
            self.progress(f"timeout after {self.spec.timeout_s}s: {len(want - sink.accounted())} operation(s) not out")
        time.sleep(self.spec.settle_s)  # let late duplicates arrive before the books close
        self.folder.step(f"quiescence after {len(sink.accounted() & want)}/{len(want)} out; {pool.restarts} restart(s)")

    def _drain_residue(self) -> None:
        ep = self.endpoints.stomp
        with StompClient(ep.host, ep.port, client_id="txchaos-residue") as client:
            for msg in drain(client, [self.input_queue], idle_s=0.3):
                self.ledger.emit(Kind.RESIDUE_QUEUE, op=op_of(msg), msg=msg.message_id, dest=self.input_queue)
        self.folder.step(f"drain residue of {self.input_queue}")

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
            raise HarnessError(
                f"verifying {path} failed: {exc}", hint="the ledger segments are kept in ledger/"
            ) from exc
        verdict = Verdict(**{**verdict.__dict__, "steps": tuple(self.folder.manifest.get("steps", ()))})
        verdict.write(path / "verdict.json")
        return RunResult(path, verdict, self.spec)


def run_scenario(
    spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
) -> RunResult:
    """Run ``spec`` against ``endpoints`` and return the result (the verdict is in the run folder)."""
    return ScenarioRun(spec, endpoints, runs_root=runs_root, progress=progress).execute()
