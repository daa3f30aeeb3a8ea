"""The processes part of a session: who does the flow's work, and how the run starts, arms and stops them.

One of a session's parts (``harness.run.core.roles``) is a ``Processes``: txchaos's own worker
processes (``Workers``, every built-in flow: the specs its topology gives), or a team's own
service instances behind trap proxies (``harness.run.flows.service.ServiceInstances``: the
service flows are the ActiveMQ and Kafka stage flows with that part swapped in). A flow names
its part in its registration (``Parts(processes=...)``); ``RunSession`` builds it and calls it at
each turn of the lifecycle:

    check(spec, endpoints)   before anything starts (a class method: no session exists yet)
    provision()              after the flow's destinations exist (a service's trap proxies)
    make_pool()              the pool the session starts, stops and restarts
    announce()               the folder steps that say what started
    armed(crash, arm)        after an arm is recorded (a service's wire trap)
    kill(n), thaw()          the steps ``Kill`` (SIGKILL a worker or an instance) and ``Thaw``
    during_fault()           around every fault window
    release()                healing, once
    after_close()            once the verdict is written (a service's own failure is raised here)
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, ClassVar, Protocol

from harness import procfs
from harness.errors import ConfigError
from harness.faults.base import active
from harness.faults.process import Pause, ProcessGone
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.processes.supervisor import Supervised, WorkerPool
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.stack.base import Endpoints
from harness.worker.crash import CrashArm
from harness.worker.spec import WorkerSpec


class Processes(Protocol):
    """What a session asks of the part that runs the flow's processes (see the module docstring)."""

    # How the verdict words an arm it never saw fire: a worker's ``crash`` point or a wire ``trap``.
    arm_via: ClassVar[str]
    # Whether the processes may join after a backlog is submitted (a Kafka group's ``late_workers``).
    may_join_late: ClassVar[bool]
    # Whether the processes write their deliveries to the ledger (txchaos's workers do; a team's
    # service does not): without them a message a killed process held is seen only when it comes back.
    ledgers_deliveries: ClassVar[bool]
    start_timeout_s: float

    @classmethod
    def check(cls, spec: ScenarioSpec, endpoints: Endpoints) -> None: ...

    def provision(self) -> None: ...

    def make_pool(self) -> WorkerPool: ...

    def announce(self) -> None: ...

    def body(self, fields: dict[str, object]) -> str | None: ...

    def armed(self, crash: Crash, arm: CrashArm) -> None: ...

    def kill(self, number: int) -> None: ...

    def pause(self, number: int) -> Pause:
        """Return the fault that stops instance ``number`` (SIGSTOP) until healed (a ``Freeze`` step)."""
        ...

    def thaw(self) -> int: ...

    def during_fault(self) -> AbstractContextManager[object]: ...

    def release(self) -> None: ...

    def after_close(self) -> None: ...


class ProcessesKind(Protocol):
    """A ``Processes`` class: checked before a session exists, then built from it."""

    def __call__(self, session: Any) -> Processes: ...

    def check(self, spec: ScenarioSpec, endpoints: Endpoints) -> None: ...


class Session(Protocol):
    """What ``Workers`` reads of its session: the topology's worker specs and how it announces them."""

    folder: Any
    ledger: Any
    topology: Any  # a ``harness.run.core.roles.Topology``

    @property
    def pool(self) -> WorkerPool | None: ...


def worker_spec(
    run_dir: Path,
    name: str,
    handler: str,
    *,
    stage: str | None = None,
    input_queue: str,
    output_queue: str | None,
    options: dict[str, object],
    kind: str,
) -> WorkerSpec:
    """Return the spec of one worker process of the run in ``run_dir``."""
    return WorkerSpec(
        name=name,
        run_dir=str(run_dir),
        endpoints_path=str(run_dir / "endpoints.json"),
        handler=handler,
        stage=stage or name,
        input_queue=input_queue,
        output_queue=output_queue,
        options=options,
        kind=kind,
    )


class Workers:
    """txchaos's own worker processes: the topology's ``worker_specs``, supervised and restarted."""

    arm_via: ClassVar[str] = "crash"
    may_join_late: ClassVar[bool] = True
    ledgers_deliveries: ClassVar[bool] = True
    start_timeout_s = 60.0

    def __init__(self, session: Session) -> None:
        self.session = session

    @classmethod
    def check(cls, spec: ScenarioSpec, endpoints: Endpoints) -> None:
        return None

    def provision(self) -> None:
        return None

    def make_pool(self) -> WorkerPool:
        s = self.session
        return WorkerPool(s.topology.worker_specs(), s.folder.path, s.ledger)

    def announce(self) -> None:
        self.session.topology.announce()

    def body(self, fields: dict[str, object]) -> str | None:
        return None

    def armed(self, crash: Crash, arm: CrashArm) -> None:
        return None  # the workers read the arms file the session wrote

    def _numbered(self, number: int, step: str) -> Supervised:
        """Return the spec of worker ``number``; refuse a step before the start or past the last worker."""
        pool = self.session.pool
        if pool is None:
            raise ConfigError(f"a {step}({number}) step before the workers started", hint="apply Start() first")
        if not 0 <= number < len(pool.specs):
            names = ", ".join(f"{i}: {spec.name}" for i, spec in enumerate(pool.specs))
            raise ConfigError(f"a {step}({number}) step, but the run has {len(pool.specs)} worker(s)", hint=names)
        return pool.specs[number]

    def kill(self, number: int) -> None:
        """SIGKILL worker ``number`` (of every stage's workers and helpers, in start order) wherever it is."""
        s = self.session
        spec = self._numbered(number, "Kill")
        pool = s.pool
        assert pool is not None
        s.ledger.emit(Kind.CRASH, point="kill", stage=spec.stage, worker=spec.name, action="kill")
        with contextlib.suppress(ProcessLookupError):  # it died by itself meanwhile: restarted anyway
            os.kill(pool.procs[spec.name].pid, signal.SIGKILL)
        s.folder.step(f"kill worker {spec.name}")

    def pause(self, number: int) -> Pause:
        """Return the pause of worker ``number`` (its own process group: the worker and its children)."""
        spec = self._numbered(number, "Freeze")
        pool = self.session.pool
        assert pool is not None
        pool.wait_alive(spec.name, self.start_timeout_s)  # a worker a crash just killed: its replacement
        return Pause(pool.procs[spec.name].pid)

    def thaw(self) -> int:
        """Continue every worker a ``freeze`` arm stopped (SIGCONT to each: a running one ignores it)."""
        pool = self.session.pool
        if pool is None:
            return 0
        stopped = [p.pid for p in pool.procs.values() if p.alive() and _stopped(p.pid)]
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if stopped:
            self.session.folder.step(f"thaw {len(stopped)} frozen worker(s)")
        return len(stopped)

    def during_fault(self) -> AbstractContextManager[object]:
        return nullcontext()

    def release(self) -> None:
        return None

    def after_close(self) -> None:
        return None


def _stopped(pid: int) -> bool:
    """Tell whether process ``pid`` is stopped (state ``T`` in /proc)."""
    return procfs.state(pid) == "T"


WORKERS: ProcessesKind = Workers  # the default part; mypy holds Workers to the protocols


@contextmanager
def both(outer: AbstractContextManager[object], inner: AbstractContextManager[object]) -> Iterator[object]:
    """Enter ``outer`` then ``inner``; leave them in reverse."""
    with outer, inner as value:
        yield value


FREEZE_SKIPPED = "skipped: its process kept ending before it could be stopped"


def freeze(processes: Processes, number: int, ledger: LedgerWriter, faults: ExitStack, attempts: int = 3) -> bool:
    """Stop instance ``number`` until ``faults`` closes; return False when it could not be stopped.

    Its process may end between being looked up and being stopped (killed by a crash point or the
    nemesis a moment before): the replacement is stopped instead. Each failed attempt stays in the
    ledger as a fault window that ended at once with its error, so nothing claims a freeze.
    """
    for _ in range(attempts):
        try:
            faults.enter_context(both(processes.during_fault(), active(processes.pause(number), ledger)))
        except ProcessGone:
            continue
        return True
    return False
