"""A state machine for the DTM 2-phase message transfer: transfers, crashes, held commits, faults, DTM restarts.

Each example is one ``DtmRunSession`` (fresh tables, toxics removed, its own gids). Rules act
while transfers run; after quiescence ``teardown`` checks the two invariants of the pattern:

- every committed debit has exactly one credit, and no credit lacks its debit: the verdict is
  clean (no ``lost``, ``duplicate-effect``, ``orphan-effect``, ``stuck`` or ``in-doubt``);
- money is conserved: the debits and the credits sum to the same amount.

Like ``harness.machines.stage``, a failure is raised in one place (teardown), carrying the
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

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from harness.errors import ConfigError
from harness.faults import KillBroker, Latency, Partition, ResetPeer
from harness.patterns.dtm_transfer import BRANCH_POINTS, SERVICE_POINTS
from harness.run.dtm_runner import DtmRunSession
from harness.run.runner import RunResult
from harness.run.spec import Crash, FaultWindow, ScenarioSpec
from harness.stack.base import Endpoints

PROXIES = ("dtm", "postgres")
HOLD_S = 6.0  # a local transaction held until DTM checks it back (~1-3 s after prepare), at most this
TOXICS: dict[str, Callable[[], object]] = {
    "latency": lambda: Latency(150, jitter_ms=20),
    "reset_peer": ResetPeer,
    "partition": Partition,
}


class DtmMachine(RuleBasedStateMachine):
    """Drive ``spec``'s transfer against ``endpoints`` (class attributes, set by ``dtm_machine``)."""

    spec: ClassVar[ScenarioSpec]
    endpoints: ClassVar[Endpoints]
    crash_points: ClassVar[tuple[str, ...]] = (*SERVICE_POINTS, *BRANCH_POINTS)
    dtm_restarts: ClassVar[bool] = True
    last_steps: ClassVar[list[str]] = []
    last_result: ClassVar[RunResult | None] = None
    # Operations whose local transaction was held past the check-back in the last example.
    last_held: ClassVar[list[str]] = []
    # The first counterexample: (its failure message, its run, the held operations, its steps).
    first_failure: ClassVar[tuple[str, RunResult, list[str], list[str]] | None] = None
    examples: ClassVar[int] = 0
    found_at: ClassVar[tuple[int, float] | None] = None
    started_at: ClassVar[float | None] = None

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        cls.examples += 1
        if cls.started_at is None:
            cls.started_at = time.monotonic()
        cls.last_steps, cls.last_held = [], []
        spec = replace(cls.spec, seed=cls.examples, settle_s=0.2, timeout_s=min(cls.spec.timeout_s, 40.0))
        self.run = DtmRunSession(spec, cls.endpoints).open()
        note(f"run folder: {self.run.folder.path}")

    def _step(self, text: str) -> None:
        type(self).last_steps.append(text)

    # -- rules ---------------------------------------------------------------------------------
    @rule(n=st.integers(min_value=1, max_value=3))
    def submit(self, n: int) -> None:
        self._step(f"submit({n})")
        self.run.submit(n)
        self._settle()

    @rule(data=st.data())
    def arm_crash(self, data: st.DataObject) -> None:
        """Submit one transfer and kill the service (or the branch) at a point while it runs it."""
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"arm_crash({point!r})")
        worker = "branch" if point in BRANCH_POINTS else "service"
        self.run.arm(Crash(point, worker=worker), op=self.run.op_id(len(self.run.ops)))
        self.run.submit(1)
        self._settle()

    @rule()
    def slow_commit(self) -> None:
        """Submit one transfer whose local transaction is still open when DTM checks back."""
        self._step("slow_commit()")
        type(self).last_held += self.run.submit(1, hold_s=HOLD_S)
        self._settle()

    @rule(proxy=st.sampled_from(PROXIES), toxic=st.sampled_from(sorted(TOXICS)))
    def network_fault(self, proxy: str, toxic: str) -> None:
        """Submit two transfers and hold a fault on the service's way to DTM or Postgres for 1 s."""
        self._step(f"network_fault({proxy!r}, {toxic!r})")
        self.run.submit(2)
        self.run.hold_fault(FaultWindow(TOXICS[toxic](), hold_s=1.0, target=proxy))
        self._settle()

    @precondition(lambda self: type(self).dtm_restarts)
    @rule()
    def restart_dtm(self) -> None:
        """Submit two transfers, kill -9 the DTM server and start it again on its store."""
        self._step("restart_dtm()")
        self.run.submit(2)
        self.run.hold_fault(FaultWindow(KillBroker("dtm"), hold_s=0.5))
        self._settle()

    def _settle(self) -> None:
        """Wait (bounded) until DTM has decided every transfer so far; teardown reports any it has not."""
        self.run.wait_decided(timeout_s=30.0)

    # -- invariants ----------------------------------------------------------------------------
    def _violated(self, message: str, result: RunResult) -> None:
        cls = type(self)
        if cls.found_at is None and cls.started_at is not None:
            cls.found_at = (cls.examples, time.monotonic() - cls.started_at)
        if cls.first_failure is None:
            cls.first_failure = (message, result, list(cls.last_held), list(cls.last_steps))
        raise AssertionError(message)

    def teardown(self) -> None:
        result = self.run.close()  # quiescence, books, verdict; heals the run in any case
        type(self).last_result = result
        verdict = result.verdict
        if self.run.books is None:
            raise AssertionError(f"{result.run_dir}: the run did not close its books")
        debited, credited = self.run.books
        note(f"verdict: {verdict.headline()}; debited {debited}, credited {credited}")
        broken = [] if verdict.clean else [verdict.headline()]
        if debited != credited:
            broken.append(f"money not conserved: debited {debited}, credited {credited}")
        if broken:
            ops = "".join(f"\n{cls}: {', '.join(sorted(verdict.ops(cls)))}" for cls in verdict.found())
            self._violated(
                f"{'; '.join(broken)}{ops}\nrun folder: {result.run_dir}\nseed: {verdict.seed}\n"
                f"steps: {' -> '.join(type(self).last_steps)}",
                result,
            )


def dtm_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[DtmMachine]:
    """Return a ``DtmMachine`` subclass bound to ``spec`` (``broker="dtm"``) and ``endpoints``."""
    if spec.broker != "dtm":
        raise ConfigError(f"{spec.label} runs on {spec.broker}", hint="pass a DTM spec (broker='dtm')")
    if not isinstance(endpoints, Endpoints):
        raise ConfigError(
            f"endpoints must be an Endpoints object, not {type(endpoints).__name__}",
            hint="pass the txchaos_stack fixture's value",
        )
    name = f"Dtm{spec.variant.title().replace('-', '')}Machine"
    namespace: dict[str, Any] = {
        "spec": spec,
        "endpoints": endpoints,
        "last_steps": [],
        "last_held": [],
        "first_failure": None,
        "examples": 0,
        "found_at": None,
        "started_at": None,
        **attrs,
    }
    namespace["__module__"] = os.environ.get("TXCHAOS_MACHINE_MODULE", __name__)
    return type(name, (DtmMachine,), namespace)
