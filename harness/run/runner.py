"""Run one scenario against a live stack: the fixed lifecycle of every run.

``RunSession`` is the lifecycle split into steps, for drivers that act while the flow runs
(Hypothesis state machines): ``open`` (schema, reset, sink, workers) -> ``arm`` / ``submit``
as often as wanted -> ``close`` (quiescence, stop workers, drain residue, snapshot effects,
verdict). ``run_scenario`` is the one-shot form. Healing (stop workers and sink, copy logs,
write the manifest) runs in ``finally``: an error never loses what the ledger holds.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.clients import db
from harness.clients.activemq import StompClient, drain
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import HarnessError
from harness.faults.base import active
from harness.ledger.reader import compact
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.folder import RunFolder
from harness.run.settle import Settlement
from harness.run.sink import Sink, op_of
from harness.run.spec import Crash, FaultWindow, ScenarioSpec
from harness.run.supervisor import WorkerPool
from harness.stack.base import Endpoints
from harness.stack.procs import free_ports
from harness.verify.checker import check_run
from harness.verify.verdict import Verdict
from harness.worker.crash import CrashArm, write_arms
from harness.worker.spec import WorkerSpec

Progress = Callable[[str], None]
# How long the flow must stay idle before operations that never came out are judged (``_Idleness``):
# twice the redelivery plugin's 1 s delay, and room for a restarted broker to dispatch again.
IDLE_S = 2.0


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


def begin_run(spec: ScenarioSpec, endpoints: Endpoints, folder: RunFolder, ledger: LedgerWriter) -> None:
    """Open the run's folder and ledger: manifest, run_start event, no crash armed."""
    folder.start(spec, endpoints)
    ledger.emit(Kind.RUN_START, scenario=spec.label, seed=spec.seed, run_id=folder.run_id)
    write_arms(folder.path, [])


def reset_state(spec: ScenarioSpec, endpoints: Endpoints, folder: RunFolder) -> db.Engine:
    """Give the run a clean stack: its schema applied, every table empty, no toxic left."""
    engine = db.engine(endpoints.postgres_url)
    db.apply_schema(engine, spec.schema)
    db.truncate_all(engine)
    ToxiproxyAdmin(endpoints.toxiproxy_api).reset()
    folder.step(f"reset: schema {spec.schema}, tables truncated, toxics removed")
    return engine


class RunSession:
    """One run, driven step by step.

    >>> with RunSession(spec, endpoints) as run:
    ...     ops = run.submit(5)
    ...     run.arm(Crash("after_db_commit", op_index=2))
    ...     result = run.close()
    """

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
        # The input queue of every stage: the first is fed by submit, each next by the one before.
        self.stage_queues = [self.input_queue, *(f"{ns}.{s.name}" for s in spec.chain)]
        ports = free_ports(sum(h.port for h in spec.helpers))
        self.helper_ports = {h.name: ports.pop() for h in spec.helpers if h.port}
        self.ops: list[str] = []
        self.arms: list[CrashArm] = []
        self._numbers = itertools.count()
        self._engine: db.Engine | None = None
        self._pool: WorkerPool | None = None
        self._sink: Sink | None = None
        self._producer: StompClient | None = None
        self._started = 0.0
        self._result: RunResult | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> RunSession:
        """Reset the stack's state for this run and start the sink and the workers."""
        spec, ep, folder = self.spec, self.endpoints, self.folder
        self._started = time.monotonic()
        begin_run(spec, ep, folder, self.ledger)
        try:
            self._engine = reset_state(spec, ep, folder)
            output = self.output_queue if spec.contract.expects_downstream else None
            self._sink = Sink(ep.stomp, self.ledger, input_queues=self.stage_queues, output_queue=output)
            self._sink.start()
            self._pool = WorkerPool(self._worker_specs(), folder.path, self.ledger)
            self._pool.start()
            folder.step(f"start {spec.workers} worker(s) running {spec.handler} on {self.input_queue}")
            for stage, queue in zip(spec.chain, self.stage_queues[1:], strict=True):
                folder.step(f"start {stage.workers} {stage.name} worker(s) running {stage.handler} on {queue}")
            for helper in spec.helpers:
                folder.step(f"start helper {helper.name} running {helper.handler}")
            self._producer_client()
        except BaseException:
            self._heal()
            raise
        return self

    def close(self) -> RunResult:
        """Wait for quiescence, collect the residue and return the verdict; heals in any case."""
        if self._result is not None:
            return self._result
        if self._pool is None or self._sink is None or self._engine is None:
            raise HarnessError("close() of a run that is not open", hint="call open() (or use the session as `with`)")
        try:
            self._await_quiescence(self._sink, self._pool)
            self._pool.stop()
            self._pool = None
            self._drain_residue()
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
        took = round(time.monotonic() - self._started, 3)
        self.ledger.emit(Kind.RUN_END, took_s=took)
        self.folder.finish(self.endpoints, took_s=took)

    def __enter__(self) -> RunSession:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None or self._sink is not None:
            self._heal()

    # -- acting while the flow runs ------------------------------------------------------------
    def submit(self, count: int, *, poison: bool = False) -> list[str]:
        """Submit ``count`` new operations (requester-made ids) and return their ids.

        ``poison`` marks them as poison messages (as do the spec's ``poison`` numbers). A broker
        connection lost meanwhile (a broker restart) is opened again once; operations already
        sent stay sent, and the ledger holds a SUBMIT for each before it goes out.
        """
        new = [self.op_id(next(self._numbers)) for _ in range(count)]
        for op in new:
            n = len(self.ops)
            fields: dict[str, object] = {"op": op, "n": n, "amount": 1 + n % 7}
            if poison or n in self.spec.poison:
                fields["poison"] = True
            self.ledger.emit(Kind.SUBMIT, op=op, dest=self.input_queue)
            self._send(json.dumps(fields), op)
            self.ops.append(op)
        # An empty transaction's ABORT receipt proves the broker has taken every SEND before it.
        self._producer_client().abort(self._producer_client().begin())
        self.folder.step(f"submit {count} {'poison ' if poison else ''}operation(s) to {self.input_queue}")
        self.progress(f"submitted {len(self.ops)} operations")
        return new

    def _producer_client(self) -> StompClient:
        if self._producer is None:
            ep = self.endpoints.stomp
            self._producer = StompClient(
                ep.host, ep.port, client_id=f"txchaos-driver-{self.folder.run_id}", heartbeats=(0, 0)
            )
        return self._producer

    def _send(self, body: str, op: str) -> None:
        try:
            self._producer_client().send(self.input_queue, body, headers={"txchaos-op": op})
        except HarnessError:
            if self._producer is not None:
                self._producer.close()
            self._producer = None  # the broker went away (a restart): one new connection, then fail
            self._producer_client().send(self.input_queue, body, headers={"txchaos-op": op})

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
        """Return the workers of every stage, then the helper processes."""
        spec = self.spec
        endpoints_path = self.folder.path / "endpoints.json"
        endpoints_path.write_text(self.endpoints.to_json())
        urls = {f"{name}_url": f"http://127.0.0.1:{port}" for name, port in self.helper_ports.items()}
        final = self.output_queue if spec.contract.expects_downstream else None
        outputs = [*self.stage_queues[1:], final]
        stages = [
            ("worker", spec.name, spec.handler, spec.workers, spec.options),
            *((s.name, s.name, s.handler, s.workers, s.options) for s in spec.chain),
        ]

        def worker(name: str, stage: str, handler: str, options: dict[str, object], **kw: object) -> WorkerSpec:
            return WorkerSpec(
                name=name,
                run_dir=str(self.folder.path),
                endpoints_path=str(endpoints_path),
                handler=handler,
                stage=stage,
                options={**urls, **options},
                **kw,  # type: ignore[arg-type]
            )

        out = [
            worker(f"{prefix}-{i}", stage, handler, dict(options), input_queue=queue, output_queue=output)
            for (prefix, stage, handler, count, options), queue, output in zip(
                stages, self.stage_queues, outputs, strict=True
            )
            for i in range(count)
        ]
        # A helper that feeds a stage (an outbox relay) finds its input queue here, keyed like the
        # stage's worker names: "worker" for the first stage, then each chain stage's name.
        queues = {prefix: queue for (prefix, *_), queue in zip(stages, self.stage_queues, strict=True)}
        for h in spec.helpers:
            options = {"queues": queues, **h.options, **({"port": self.helper_ports[h.name]} if h.port else {})}
            out.append(
                worker(
                    h.name, h.name, h.handler, options, input_queue=self.input_queue, output_queue=None, kind="process"
                )
            )
        return out

    def _await_quiescence(self, sink: Sink, pool: WorkerPool) -> None:
        """Wait until every operation came out (downstream or DLQ), or the flow is idle with some
        never out (``_idle``), then settle; bounded by the timeout."""
        want = set(self.ops)
        deadline = time.monotonic() + self.spec.timeout_s
        last_report = 0
        # A crash loop (a poison message) never ends on its own: once the workers have died more
        # often than the contract's max_deliveries with nothing coming out, stop waiting for it.
        limit = self.spec.contract.max_deliveries
        progressed, restarts_then = -1, pool.restarts
        idle = _Idleness(Settlement(self.folder.path / "ledger"), pool, sink, max(self.spec.settle_s, IDLE_S))
        while time.monotonic() < deadline:
            sink.check()
            done = len(want & sink.accounted())
            if done == len(want):
                # A worker killed after its DB commit gets its message back once it is replaced,
                # and the replacement must settle it before the queues are drained as residue.
                if pool.wait_serving(deadline):
                    self._await_settled(deadline)
                break
            if idle.idle(self._outbox_empty):
                self.progress(f"the flow is idle; {len(want) - done} operation(s) never came out")
                self.folder.step(f"quiescence: idle for {idle.quiet_s}s with {len(want) - done} operation(s) not out")
                break
            if done > progressed:
                progressed, restarts_then = done, pool.restarts
            elif limit is not None and pool.restarts - restarts_then > limit:
                looped = pool.restarts - restarts_then
                self.progress(f"crash loop: {looped} worker restarts and no operation out; not waiting longer")
                self.folder.step(f"crash loop: {looped} restarts with {len(want) - done} operation(s) not out")
                break
            if done - last_report >= max(1, len(want) // 10):
                self.progress(f"{done}/{len(want)} operations out, {pool.restarts} worker restart(s)")
                last_report = done
            time.sleep(0.02)
        else:
            self.progress(f"timeout after {self.spec.timeout_s}s: {len(want - sink.accounted())} operation(s) not out")
        self._await_outbox(deadline)
        time.sleep(self.spec.settle_s)  # let late duplicates arrive before the books close
        out = len(sink.accounted() & want)
        self.folder.step(f"quiescence after {out}/{len(want)} out; {pool.restarts} restart(s)")

    def _await_settled(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) until every delivered input message is committed or NACKed."""
        settlement = Settlement(self.folder.path / "ledger")
        while (pending := settlement.unsettled()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if pending:
            self.folder.step(f"quiescence: {len(pending)} delivered message(s) never settled")

    def _outbox_empty(self) -> bool:
        outbox, engine = self.spec.outbox_table, self._engine
        return outbox is None or engine is None or not db.column_values(engine, outbox, "op_id", where_null="sent_at")

    def _await_outbox(self, deadline: float) -> None:
        """Wait (bounded by ``deadline``) until the outbox holds no unsent row.

        An operation can come out before its outbox row is marked sent (a relay killed between
        send and mark): the sweeper sends it again and marks it later. Snapshotting before then
        would report a row that is about to be relayed as an orphan.
        """
        outbox, engine = self.spec.outbox_table, self._engine
        if outbox is None or engine is None:
            return
        while time.monotonic() < deadline and db.column_values(engine, outbox, "op_id", where_null="sent_at"):
            time.sleep(0.05)

    def _drain_residue(self) -> None:
        ep = self.endpoints.stomp
        with StompClient(ep.host, ep.port, client_id="txchaos-residue", heartbeats=(0, 0)) as client:
            # A queue that stays empty this long after the workers are gone is empty.
            for msg in drain(client, self.stage_queues, idle_s=min(0.3, max(0.1, self.spec.settle_s))):
                dest = msg.headers.get("destination", "").removeprefix("/queue/") or self.input_queue
                self.ledger.emit(Kind.RESIDUE_QUEUE, op=op_of(msg), msg=msg.message_id, dest=dest)
        self.folder.step(f"drain residue of {', '.join(self.stage_queues)}")

    def _snapshot_effects(self, engine: db.Engine) -> None:
        table, column = self.spec.effect_table, self.spec.effect_column
        for op in db.column_values(engine, table, column):
            self.ledger.emit(Kind.RESIDUE_EFFECT, op=op, dest=table)
        self.folder.step(f"snapshot effect table {table}")
        outbox = self.spec.outbox_table
        if outbox is not None:
            for op in db.column_values(engine, outbox, "op_id", where_null="sent_at"):
                self.ledger.emit(Kind.RESIDUE_OUTBOX, op=op, dest=outbox)
            self.folder.step(f"snapshot unrelayed rows of {outbox}")

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


class _Idleness:
    """Tell when every piece of evidence about the operations still out is in.

    Idle means, unbroken for ``quiet_s``: every worker alive and subscribed (none dead or being
    replaced), every delivered message settled by the process that received it (a message a
    killed worker held comes back), no operation NACKed and not seen since (a redelivery the
    broker's plugin holds a second or more), nothing new in the ledger or at the sink, no worker
    restarted, and no unsent outbox row. A message still in a queue would have been delivered to
    one of the idle workers (prefetch 1) within that time; an operation still out then never
    comes out, and the books can close on it without waiting out the timeout.
    """

    def __init__(self, settlement: Settlement, pool: WorkerPool, sink: Sink, quiet_s: float) -> None:
        self.settlement, self.pool, self.sink, self.quiet_s = settlement, pool, sink, quiet_s
        self._since: float | None = None
        self._restarts = pool.restarts

    def idle(self, outbox_empty: Callable[[], bool]) -> bool:
        """Return whether the flow has been idle for ``quiet_s``; call it in the waiting loop."""
        now = time.monotonic()
        busy = (
            self.pool.restarts != self._restarts
            or not self.pool.serving()
            or bool(self.settlement.unsettled())
            or bool(self.settlement.given_back(self.sink.accounted()))
        )
        self._restarts = self.pool.restarts
        if busy:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        quiet_for = min(now - self._since, now - self.settlement.last_event, self.sink.quiet_s())
        # The outbox is asked last and rarely: a database query, not a look at files.
        return quiet_for >= self.quiet_s and outbox_empty()


def run_scenario(
    spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
) -> RunResult:
    """Run ``spec`` against ``endpoints`` and return the result (the verdict is in the run folder)."""
    with RunSession(spec, endpoints, runs_root=runs_root, progress=progress) as run:
        for crash in spec.crashes:
            run.arm(crash)
        for window in sorted(spec.faults, key=lambda w: w.after_ops):
            if window.after_ops > len(run.ops):
                run.submit(window.after_ops - len(run.ops))
            run.hold_fault(window)
        if spec.messages > len(run.ops):
            run.submit(spec.messages - len(run.ops))
        return run.close()
