"""The parts a flow is made of, and what each reads of the session it serves.

``RunSession`` is written once and never subclassed: a flow's registration (``Flow``) names the
parts it runs with, and the session builds them and calls them at each turn of the lifecycle.

    topology     where the flow runs: its destinations, sink and worker specs (``Topology``)
    processes    who does the work: txchaos's workers or a team's instances (``parts.Processes``)
    workload     what ``Submit`` sends and how the flow is idle between operations (``Workload``)
    quiescence   how the session knows nothing more will happen (``Quiescence``)
    books        what the session closes into the ledger once the processes stopped (``books.Book``)

Every part is built from the session (``SessionView``: what a part may read) and, except the
topology, the flow's topology, typed as the part needs it. So the ActiveMQ and Kafka stage flows
share the workload and the quiescence of ``sink_parts``, a service flow is a stage flow with
its processes part swapped, and a new flow writes only the parts that differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from harness.clients import db
from harness.ledger.writer import LedgerWriter
from harness.poll import deadline_in
from harness.run.core.outcome import Progress
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.ops import OpIds
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.stack.base import Endpoints
from harness.worker.crash import CrashArm
from harness.worker.spec import WorkerSpec


class SessionView(Protocol):
    """What a part reads of the session it serves (``harness.run.core.session.RunSession``)."""

    spec: ScenarioSpec
    endpoints: Endpoints
    folder: Any  # the ``RunFolder``: its path, its step log; the parts hand it to books and transports
    ledger: LedgerWriter
    ns: str  # the run's namespace: every destination it creates starts with it
    ops: OpIds
    progress: Progress
    bypass_faults: bool
    helper_ports: dict[str, int]
    arms: list[CrashArm]
    processes: Any  # the processes part (``harness.run.core.parts.Processes``)
    topology: Any  # the flow's ``Topology``, as the part that reads it knows it

    @property
    def pool(self) -> WorkerPool | None: ...

    def engine(self, what: str) -> db.Engine: ...

    def op_id(self, n: int) -> str: ...

    def mint(self, count: int) -> list[str]: ...

    def quiescent(self, out: Callable[[], int], what: str, pool: WorkerPool) -> None: ...


class Topology(Protocol):
    """Where a flow runs: named when the session is built, provisioned after the reset, released once."""

    # drive() submits the operations before the first fault window before the workers join.
    late_workers: ClassVar[bool]
    # The proxies the driver's submissions pass through: a fault window that cuts one of them holds
    # the submissions until it is healed; under any other the submissions go on (``core/plan.py``).
    submits_via: ClassVar[frozenset[str]]
    group: str  # the consumer group of a flow (or a service) that has one

    def provision(self) -> None: ...

    def worker_specs(self) -> list[WorkerSpec]: ...

    def announce(self) -> None:
        """Write the folder steps that say which processes started."""
        ...

    def effect_tables(self) -> tuple[tuple[str, str], ...]:
        """Return the (table, column) pairs whose values are operations applied: a duplicate is one applied twice."""
        ...

    def release(self) -> None: ...


class TopologyKind(Protocol):
    """A ``Topology`` class: checked before a session exists, then built from it."""

    def __call__(self, session: Any) -> Topology: ...

    def check(self, spec: ScenarioSpec, endpoints: Endpoints) -> None: ...


class Workload(Protocol):
    """What the flow's operations are: how ``Submit`` sends them, and when the flow is idle."""

    def submit(self, count: int, *, poison: bool = False, **extra: Any) -> list[str]: ...

    def alone(self) -> set[int]:
        """Return the operation numbers drive() submits alone, the flow idle before and after."""
        ...

    def wait_idle(self) -> None:
        """Wait until the operations so far are done (drive() calls it around one submitted alone)."""
        ...

    def out_count(self) -> int | None:
        """Return how many operations came out so far (None: the flow cannot tell while it runs)."""
        ...

    def arm_op(self, crash: Crash) -> str | None:
        """Return the operation ``crash`` names (None: the nth hit of its point)."""
        ...


class Quiescence(Protocol):
    """How the session knows the flow is quiet: every operation done, or nothing more will happen."""

    def wait(self, pool: WorkerPool) -> None: ...


@dataclass
class UntilDone:
    """A quiescence: the flow's own wait until every operation is done (it returns those that are
    not, with their state), then every process serving again, then what a redelivery brings
    (``settle``, bounded by the deadline) before ``settle_s`` and the folder's quiescence step."""

    session: SessionView
    done: Callable[[], dict[str, str]]
    what: str  # how the folder says an operation is done ("decided by DTM", "sagas final")
    settle: Callable[[float], object] = lambda deadline: None

    def wait(self, pool: WorkerPool) -> None:
        s = self.session
        deadline = deadline_in(s.spec.timeout_s)
        pending = self.done()
        pool.wait_serving(deadline)
        self.settle(deadline)
        finished = len(s.ops) - len(pending)
        s.quiescent(lambda: finished, self.what, pool)
        if pending:
            s.progress(f"{len(pending)} operation(s) not {self.what} by the timeout: {sorted(set(pending.values()))}")


class Plain:
    """The workload defaults: nothing submitted alone, idle at once, no count while running, arms by number."""

    session: SessionView

    def alone(self) -> set[int]:
        return set()

    def wait_idle(self) -> None:
        return None

    def out_count(self) -> int | None:
        return None

    def arm_op(self, crash: Crash) -> str | None:
        return None if crash.op_index is None else self.session.op_id(crash.op_index)
