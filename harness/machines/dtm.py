"""A state machine for the DTM 2-phase message transfer: transfers, crashes, held commits, faults, DTM restarts.

Each example is one ``RunSession`` of the ``dtm`` flow (fresh tables, toxics removed, its own gids). Rules act
while transfers run; after quiescence ``teardown`` checks the two invariants of the pattern:

- every committed debit has exactly one credit, and no credit lacks its debit: the verdict is
  clean (no ``lost``, ``duplicate-effect``, ``orphan-effect``, ``stuck`` or ``in-doubt``);
- money is conserved: the debits and the credits sum to the same amount.

Like every machine (``harness.machines.base``), a failure is raised in one place (teardown), carrying the
run folder, the seed, the step list and every flagged operation id, so Hypothesis sees one bug
per program. Each rule waits until DTM has decided its transfers: a killed process takes every
request it has in flight with it, so transfers of two rules running at once would make a
program's outcome depend on timing, and Hypothesis's replay of a counterexample flaky. What
the first counterexample was stays in ``first_failure`` even when the replay differs anyway (a
fault's timing against a transfer is still real timing).

>>> Machine = dtm_machine(spec, endpoints)
>>> run_state_machine_as_test(Machine, settings=profile("ci"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from harness.faults import KillBroker, Latency, Partition, ResetPeer
from harness.machines.base import MachineBase, bind, failure
from harness.patterns.dtm_transfer import BRANCH_POINTS, SERVICE_POINTS
from harness.protocols import proxies
from harness.run.core.outcome import RunResult
from harness.run.core.session import RunSession
from harness.run.flows.dtm import DtmService
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.spec.steps import Arm, Hold, Idle, Submit
from harness.stack.base import Endpoints

PROXIES = proxies("dtm", "postgres")
HOLD_S = 6.0  # a local transaction held until DTM checks it back (~1-3 s after prepare), at most this
# Each binds to a proxy of the stack: ``TOXICS[name]().on(proxy, endpoints)``.
TOXICS: dict[str, Callable[[], Any]] = {
    "latency": lambda: Latency(150, jitter_ms=20),
    "reset_peer": ResetPeer,
    "partition": Partition,
}


class DtmMachine(MachineBase[RunSession]):
    """Drive ``spec``'s transfer against ``endpoints`` (class attributes, set by ``dtm_machine``)."""

    flows = ("dtm",)
    timeout_cap_s = 40.0
    crash_points: ClassVar[tuple[str, ...]] = (*SERVICE_POINTS, *BRANCH_POINTS)
    dtm_restarts: ClassVar[bool] = True
    # Operations whose local transaction was held past the check-back in the last example.
    last_held: ClassVar[list[str]] = []
    # The first counterexample: (its failure message, its run, the held operations, its steps).
    first_failure: ClassVar[tuple[str, RunResult, list[str], list[str]] | None] = None

    own_state: ClassVar[dict[str, Any]] = {"last_held": [], "first_failure": None}

    def begin_example(self) -> None:
        type(self).last_held = []

    def open_session(self, spec: ScenarioSpec) -> RunSession:
        return RunSession(spec, type(self).endpoints).open()

    # -- rules ---------------------------------------------------------------------------------
    @rule(n=st.integers(min_value=1, max_value=3))
    def submit(self, n: int) -> None:
        """Submit ``n`` transfers and let them settle (DTM decides each before the next rule)."""
        super().submit(n)
        self.do(Idle())

    @rule(data=st.data())
    def arm_crash(self, data: st.DataObject) -> None:
        """Submit one transfer and kill the service (or the branch) at a point while it runs it."""
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"arm_crash({point!r})")
        worker = "branch" if point in BRANCH_POINTS else "service"
        self.do(Arm(Crash(point, worker=worker), at=len(self.run.ops)), Submit(1), Idle())

    @rule()
    def slow_commit(self) -> None:
        """Submit one transfer whose local transaction is still open when DTM checks back."""
        self._step("slow_commit()")
        type(self).last_held.append(self.run.op_id(len(self.run.ops)))
        self.do(Submit(1, extra=(("hold_s", HOLD_S),)), Idle())

    @rule(proxy=st.sampled_from(PROXIES), toxic=st.sampled_from(sorted(TOXICS)))
    def network_fault(self, proxy: str, toxic: str) -> None:
        """Submit two transfers and hold a fault on the service's way to DTM or Postgres for 1 s."""
        self._step(f"network_fault({proxy!r}, {toxic!r})")
        self.do(Submit(2), Hold(TOXICS[toxic](), proxy, 1.0), Idle())

    @precondition(lambda self: type(self).dtm_restarts)
    @rule()
    def restart_dtm(self) -> None:
        """Submit two transfers, kill -9 the DTM server and start it again on its store."""
        self._step("restart_dtm()")
        self.do(Submit(2), Hold(KillBroker("dtm"), hold_s=0.5), Idle())

    # -- the verdict ---------------------------------------------------------------------------
    def no_duplicate_effect(self) -> None:
        """Not an invariant here: a transfer's two effects are judged after quiescence, by the books."""

    def remember(self, message: str, result: RunResult) -> None:
        cls = type(self)
        if cls.first_failure is None:
            cls.first_failure = (message, result, list(cls.last_held), list(cls.last_steps))

    def judge(self, result: RunResult) -> str | None:
        """Fail on any anomaly of the verdict, or money not conserved between debits and credits."""
        verdict = result.verdict
        closing = cast(DtmService, self.run.topology).closing_money
        if closing is None:
            raise AssertionError(f"{result.run_dir}: the run did not close its books")
        debited, credited = closing
        note(f"verdict: {verdict.headline()}; debited {debited}, credited {credited}")
        broken = [] if verdict.anomaly_free else [verdict.headline()]
        if debited != credited:
            broken.append(f"money not conserved: debited {debited}, credited {credited}")
        return failure(broken, verdict)


def dtm_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[DtmMachine]:
    """Return a ``DtmMachine`` subclass bound to ``spec`` (``flow="dtm"``) and ``endpoints``."""
    name = f"Dtm{spec.variant.title().replace('-', '')}Machine"
    return bind(DtmMachine, spec, endpoints, name, "pass a DTM spec (flow='dtm')", **attrs)
