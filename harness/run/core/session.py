"""The run lifecycle, written once: ``RunSession``.

A run is ``open`` (handlers checked, folder and ledger, schema reset, the flow's destinations
provisioned, workers started) -> ``arm`` / ``submit`` / ``hold_fault`` as often as wanted ->
``close`` (quiescence, stop workers, close the books into the ledger, mark the folder complete,
verdict). Healing (stop workers, release the flow's clients and destinations, copy logs, write
the manifest) runs in ``finally`` and at most once, so a Ctrl-C or SIGTERM (raised as a
KeyboardInterrupt) never loses what the ledger holds. Everything between is a step
(``harness.run.spec.steps``) that ``apply`` applies and the folder records as data: ``drive``
turns the spec into steps (``harness.run.core.plan``: start, arm, submit up to each fault window,
hold it, submit the rest), a state machine emits them, ``harness.run.core.replay`` runs a folder's steps again.

The session is written once and never subclassed: a flow's registration names its parts
(``harness.run.core.roles``: topology, processes, workload, quiescence, books) and the session
builds and calls them. ``RunSession(spec, endpoints)`` runs any spec; ``run_scenario``
(``harness.run_scenario``, the pytest fixture, the CLI) drives one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, Self, cast

from harness.clients import db
from harness.errors import ConfigError, HarnessError
from harness.faults.base import active
from harness.ledger.reader import Compaction
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.core.books import Book
from harness.run.core.folder import RunFolder
from harness.run.core.outcome import Progress, RunResult, _quiet, begin_run, judge_folder, reset_state
from harness.run.core.parts import FREEZE_SKIPPED, WORKERS, Processes, ProcessesKind, both, freeze
from harness.run.core.plan import plan
from harness.run.core.roles import Quiescence, Topology, TopologyKind, Workload
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.handlers import check_handlers
from harness.run.spec.ops import OpIds
from harness.run.spec.scenario import Crash, FaultWindow, ScenarioSpec
from harness.run.spec.schema import Schema
from harness.run.spec.steps import Arm, Freeze, Heal, Hold, Idle, Kill, Open, Start, Step, Submit, Thaw, Wait
from harness.signals import deferred
from harness.stack.base import Endpoints
from harness.stack.hold import StackHold
from harness.stack.procs import free_ports
from harness.verify import declared
from harness.worker.crash import CrashArm, write_arms


class RunSession:
    """One run, driven step by step; ``RunSession(spec, endpoints)`` is the session of the spec's flow.

    >>> with RunSession(spec, endpoints) as run:
    ...     ops = run.submit(5)
    ...     run.arm(Crash("after_db_commit", op_index=2))
    ...     result = run.close()
    """

    def __init__(
        self,
        spec: ScenarioSpec,
        endpoints: Endpoints,
        *,
        runs_root: Path | None = None,
        progress: Progress = _quiet,
        bypass_faults: bool = False,
    ) -> None:
        if not isinstance(spec, ScenarioSpec):
            raise ConfigError(f"{spec!r} is not a ScenarioSpec", hint="build the spec with harness.ScenarioSpec(...)")
        flow = spec.flow
        if flow.parts is None:
            raise ConfigError(f"{spec.label} names no registered flow", hint="give flow= a registered flow")
        self._parts = flow.parts
        topology = cast(TopologyKind, flow.parts.topology)
        topology.check(spec, endpoints)
        processes = cast(ProcessesKind, flow.parts.processes) if flow.parts.processes else WORKERS
        processes.check(spec, endpoints)
        # Before the folder exists: a handler that does not import fails naming itself, not as
        # "worker-0 keeps dying before it subscribes", and leaves no half-made run behind.
        check_handlers(spec)
        Schema.of(spec.schema).check()
        self.spec = spec
        self.endpoints = endpoints
        self.progress = progress
        # The harness's own broker connections (the producer that submits, the sink that reads) skip
        # the proxy where the transport allows it, so a soak's nemesis cuts the system under test only.
        self.bypass_faults = bypass_faults
        self.folder = RunFolder.create(spec.name, spec.variant, spec.seed, runs_root)
        self.ledger = LedgerWriter(self.folder.path / "ledger", "driver")
        self.ns = f"txchaos.{self.folder.run_id}"
        ports = free_ports(sum(h.port for h in spec.helpers))
        self.helper_ports = {h.name: ports.pop() for h in spec.helpers if h.port}
        self.ops = OpIds(f"{spec.variant}-s{spec.seed}-op")  # ids derived from numbers, never stored
        self.arms: list[CrashArm] = []
        self._numbers = itertools.count()
        self._engine: db.Engine | None = None
        self._pool: WorkerPool | None = None
        self._restarted = 0  # restarts of the pools stopped so far
        self._live = False
        self._started = 0.0
        self._result: RunResult | None = None
        self._faults = ExitStack()  # the faults ``Open`` applied, healed by ``Heal`` or on close
        self._stack_hold: StackHold | None = None  # held from ``open`` until healed
        self.topology: Topology = topology(self)
        self.processes: Processes = processes(self)
        self.workload: Workload = flow.parts.workload(self, self.topology)
        self.quiescence: Quiescence = flow.parts.quiescence(self, self.topology)

    # -- what the parts read ------------------------------------------------------------------
    @property
    def pool(self) -> WorkerPool | None:
        """The running processes' pool (None before ``Start`` and after the close)."""
        return self._pool

    def submit(self, count: int, *, poison: bool = False, **extra: Any) -> list[str]:
        """Submit ``count`` new operations and return their ids (``extra``: the workload's own options).

        A submission is whole: a signal that arrives while it sends waits until every operation
        it wrote a SUBMIT for is out, or the ledger would claim operations never sent.
        """
        self.engine("submit")  # refuses a run that is not open
        with deferred():
            return self.workload.submit(count, poison=poison, **extra)

    def books(self) -> tuple[Book, ...]:
        """Return the books the run closes into the ledger, in order, once its processes stopped."""
        books: tuple[Book, ...] = self._parts.books(self, self.topology)
        return books

    def wait_idle(self) -> None:
        """Wait until the operations so far are done (drive() calls it around one submitted alone)."""
        self.workload.wait_idle()

    def out_count(self) -> int | None:
        """Return how many operations came out so far (None: the flow cannot tell while it runs).

        A soak's closed loop keeps submitted minus out under its window; its progress shows it.
        """
        return self.workload.out_count()

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, *, start_workers: bool = True) -> Self:
        """Reset the stack's state for this run, provision the flow and start its workers."""
        spec, ep, folder = self.spec, self.endpoints, self.folder
        try:  # before anything touches the stack: another run may be using it
            self._stack_hold = StackHold(ep, f"the run {folder.path}")
        except ConfigError:
            self.ledger.close()
            folder.discard_unused()  # made a moment ago, nothing in it: leave nothing behind
            raise
        self._started = time.monotonic()
        self._live = True
        begin_run(spec, ep, folder, self.ledger)
        try:
            self._engine = reset_state(spec, ep, folder)
            (folder.path / "endpoints.json").write_text(ep.to_json())
            self.topology.provision()
            self.processes.provision()
            if start_workers:
                self.start_workers()
        except BaseException:
            self._heal()
            raise
        return self

    def start_workers(self) -> None:
        """Start the flow's worker processes (once)."""
        if self._pool is not None:
            return
        self._pool = self.processes.make_pool()
        self._pool.start(self.processes.start_timeout_s)
        self.processes.announce()

    def close(self, *, progress: Progress | None = None, compaction: Compaction | None = None) -> RunResult:
        """Wait for quiescence, close the books and return the verdict; heals in any case.

        ``progress`` (default: the session's) hears how the verdict of a large ledger is coming;
        ``compaction``, begun while the run went, is finished for it (``judge_folder``).
        """
        if self._result is not None:
            return self._result
        if self._engine is None:
            raise HarnessError("close() of a run that is not open", hint="call open() (or use the session as `with`)")
        try:
            self._faults.close()  # the final heal: quiescence is judged on a healthy stack
            self.start_workers()
            assert self._pool is not None
            self.quiescence.wait(self._pool)
            self._stop_pool()
            for book in self.books():
                book.close(self._engine)
            declared.snapshot(self._engine, self.spec.contract, self.ledger, self.ops, step=self.folder.step)
            self.folder.close_books()  # the snapshot is in the ledger: the folder is complete
        finally:
            self._heal()
        self._result = judge_folder(self.folder, self.spec, progress or self.progress, compaction)
        self.processes.after_close()  # a service that failed by itself says so once the books are closed
        return self._result

    def _heal(self) -> None:
        if not self._live:
            return
        self._live = False
        try:
            self._faults.close()
            self._stop_pool()
            self.processes.release()
            self.topology.release()
        finally:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None
            took = round(time.monotonic() - self._started, 3)
            try:
                self.ledger.emit(Kind.RUN_END, took_s=took)
                self.folder.finish(self.endpoints, took_s=took)
            finally:
                if self._stack_hold is not None:
                    self._stack_hold.release()

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self._heal()

    def drive(self) -> RunResult:
        """Run the spec: open, apply its steps (``plan``), close."""
        self.open(start_workers=False)
        try:
            late = self.topology.late_workers and self.processes.may_join_late
            alone = self.workload.alone()
            via = self.topology.submits_via
            for step in plan(self.spec, late=late, alone=alone, submitted=lambda: len(self.ops), submits_via=via):
                self.apply(step)
            return self.close()
        finally:
            self._heal()

    # -- acting while the flow runs ------------------------------------------------------------
    def apply(self, step: Step) -> None:
        """Apply one step to the open run, recorded first in the folder's ``steps.jsonl``."""
        self.engine("apply")  # refuses a run that is not open
        self.folder.record(step)
        submit: Callable[..., list[str]] = self.submit
        match step:
            case Start():
                self.start_workers()
            case Submit(count=count, poison=poison, extra=extra):
                submit(count, poison=poison, **dict(extra))
            case Arm(crash=crash, at=at, op=op):
                if at is None and op is None and crash.op_index is None and crash.nth is None:
                    raise ConfigError(f"arm at {crash.point} names no operation", hint="give at=, op_index= or nth=")
                self.arm(crash, op=op if op is not None else None if at is None else self.op_id(at))
            case Open(fault=fault, target=target):
                self.folder.step(f"fault {fault!r}{f' on {target}' if target else ''} until healed")
                self._faults.enter_context(self._under_fault(fault, target))
            case Hold(fault=fault, target=target, hold_s=hold_s):
                self._hold(fault, target, hold_s)
            case Wait(seconds=seconds):
                time.sleep(seconds)
            case Heal():
                self._faults.close()
                self._faults = ExitStack()
                if self._pool is not None:
                    self._pool.expedite()  # workers backing off from the outage start now, not a backoff later
            case Kill(instance=instance):
                self.kill_instance(instance)
            case Freeze(instance=instance):
                frozen = freeze(self.processes, instance, self.ledger, self._faults)
                self.folder.step(f"freeze instance {instance} {'until healed' if frozen else FREEZE_SKIPPED}")
            case Thaw():
                self.thaw()
            case Idle():
                self.wait_idle()

    def _under_fault(self, fault: Any, target: str | None) -> AbstractContextManager[object]:
        """Return ``fault`` bound to this stack, applied while the context is open and recorded in the ledger."""
        bound = fault.on(self.endpoints) if target is None else fault.on(target, self.endpoints)
        return both(self.processes.during_fault(), active(bound, self.ledger))

    def _hold(self, fault: Any, target: str | None, hold_s: float) -> None:
        self.folder.step(f"fault {fault!r}{f' on {target}' if target else ''} for {hold_s}s")
        with self._under_fault(fault, target):
            time.sleep(hold_s)
        if self._pool is not None:
            self._pool.expedite()
        self.progress(f"healed {fault!r}")

    def kill_instance(self, number: int = 0) -> None:
        """SIGKILL instance ``number`` of the flow's processes now; they start it again."""
        self.processes.kill(number)

    def thaw(self) -> int:
        """Continue every frozen instance; return how many (processes without traps freeze none)."""
        return self.processes.thaw()

    def mint(self, count: int) -> list[str]:
        """Return the ids of the next ``count`` operations (a workload appends each to ``ops`` once sent)."""
        return [self.op_id(next(self._numbers)) for _ in range(count)]

    def arm(self, crash: Crash, *, op: str | None = None) -> CrashArm:
        """Arm a crash point: on ``op`` (or the spec's ``op_index``), or on the nth hit."""
        if op is None:
            op = self.workload.arm_op(crash)
        arm = CrashArm(f"arm-{len(self.arms)}", crash.point, op, crash.worker, crash.nth, crash.action)
        self.arms.append(arm)
        # Before the arm is live: the verdict accounts for every request (verify/fired.py), and
        # ``op`` stays empty so the request never stretches the operation's span.
        fields: dict[str, Any] = {"point": arm.point, "nth": arm.nth, "action": arm.action, "worker": arm.worker}
        self.ledger.emit(Kind.ARM, arm=arm.id, target_op=op, via=self.processes.arm_via, **fields)
        write_arms(self.folder.path, self.arms)
        on = f"op {op}" if op else f"hit #{crash.nth}"
        who = f" in {crash.worker}" if crash.worker else ""
        self.folder.step(f"arm {crash.action} at {crash.point} on {on}{who}")
        self.processes.armed(crash, arm)
        return arm

    def hold_fault(self, window: FaultWindow) -> None:
        """Apply ``window``'s fault, let the flow run under it for ``hold_s``, then heal it."""
        self.apply(Hold(window.fault, window.target, window.hold_s))

    def op_id(self, n: int) -> str:
        """Return the id of the run's operation number ``n`` (deterministic, so a seed replays)."""
        return self.ops.id(n)

    def engine(self, what: str) -> db.Engine:
        """Return the run's database engine; ``what`` names the call refused when the run is not open."""
        if self._engine is None:
            raise HarnessError(f"{what}() of a run that is not open", hint="call open() first")
        return self._engine

    def duplicate_effects(self) -> list[str]:
        """Return the operation ids whose effect is applied more than once right now."""
        engine = self.engine("duplicate_effects")
        tables = self.topology.effect_tables()
        return sorted({op for table, column in tables for op in db.duplicated_values(engine, table, column)})

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._restarted += self._pool.restarts
            self._pool = None

    @property
    def restarts(self) -> int:
        """How many times the flow's worker processes were started again, in this run so far."""
        return self._restarted + (self._pool.restarts if self._pool else 0)

    def quiescent(self, out: Callable[[], int], what: str, pool: WorkerPool) -> None:
        """Let late duplicates arrive (``settle_s``), then record how far the flow got (``out()`` of the ops)."""
        time.sleep(self.spec.settle_s)
        self.folder.step(f"quiescence after {out()}/{len(self.ops)} {what}; {pool.restarts} restart(s)")


def run_scenario(
    spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
) -> RunResult:
    """Run ``spec`` with its flow's session and return the result: the one entry point.

    >>> result = run_scenario(spec, endpoints)  # harness.run_scenario; in pytest use txchaos_run(spec)
    >>> result.verdict.found()
    {'duplicate-effect': 1}
    """
    if not isinstance(spec, ScenarioSpec):
        raise ConfigError(f"{spec!r} is not a ScenarioSpec", hint="build the spec with harness.ScenarioSpec(...)")
    return RunSession(spec, endpoints, runs_root=runs_root, progress=progress).drive()
