"""A state machine for the Kafka saga: start sagas, refuse seats, flaky seats, crashes in any process, latency.

Each example is one ``RunSession`` of the ``kafka_saga`` flow (fresh topics and tables, toxics removed). Rules act
while sagas run; after quiescence ``teardown`` checks the pattern's two invariants, on the
database and on the verdict:

- every saga ends in a final state (``completed`` or ``compensated``): nothing ``stuck`` or
  ``lost``;
- no step's effect is applied twice: no ``duplicate-effect`` on any ``<saga>.<step>``.

Like every machine (``harness.machines.base``), a failure is raised in one place (teardown) with the run
folder, the seed, the step list and every flagged id, so Hypothesis sees one bug per program;
the first counterexample is kept in ``first_failure`` even when a replay meets other timing.
A spec with ``expect`` hunts those classes: its examples fail only when one of them shows (a
bad variant's search must not stop at a smaller failure of another class); a spec without it
(the fixed saga) fails on anything.

>>> Machine = saga_machine(spec, endpoints)
>>> run_state_machine_as_test(Machine, settings=profile("ci"))
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import rule

from harness.machines.base import NetworkMachine, bind, failure
from harness.patterns.saga_options import ORCHESTRATOR, PROCESSES, first_step_of, step_op
from harness.protocols import proxies
from harness.run.core.outcome import RunResult
from harness.run.core.session import RunSession
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.spec.steps import Arm, Submit
from harness.stack.base import Endpoints

# The windows of every Kafka stage: DB committed (its outputs not produced yet), outputs produced
# and the offset not committed, handed over. Hypothesis draws a list's first entries most often
# (a CI run's 40-example hunt drew after_poll 11 times in 14): the windows between two commits,
# where the pattern's bugs live, come first, and so do the participants in ``processes``.
CRASH_POINTS = ("after_db_commit", "before_offset_commit", "after_poll")
PARTICIPANTS_FIRST = (*(p for p in PROCESSES if p != ORCHESTRATOR), ORCHESTRATOR)
# The records the orchestrator handles for one saga: its start, the payment's and the seat's reply.
ORCHESTRATOR_RECORDS = ("", ".pay", ".seat")
PROXIES = proxies("kafka", "postgres")
FLAKY = (1, 9)  # a seat failing once (retried with backoff) or on every attempt (dead-lettered)


class SagaMachine(NetworkMachine[RunSession]):
    """Drive ``spec``'s saga against ``endpoints`` (class attributes, set by ``saga_machine``)."""

    flows = ("kafka_saga",)
    timeout_cap_s = 30.0
    network_proxies = PROXIES
    processes: ClassVar[tuple[str, ...]] = PARTICIPANTS_FIRST
    crash_points: ClassVar[tuple[str, ...]] = CRASH_POINTS
    # The first counterexample: (its failure message, its run, its steps).
    first_failure: ClassVar[tuple[str, RunResult, list[str]] | None] = None
    durations: ClassVar[list[float]] = []

    own_state: ClassVar[dict[str, Any]] = {"first_failure": None, "durations": []}

    def open_session(self, spec: ScenarioSpec) -> RunSession:
        return RunSession(spec, type(self).endpoints).open()

    # -- rules ---------------------------------------------------------------------------------
    @rule()
    def refuse_seat(self) -> None:
        """Start one saga whose seat is refused (a semantic error reply): it must be compensated."""
        self._step("refuse_seat()")
        self.do(Submit(1, extra=(("refuse", True),)))

    @rule(fail_times=st.sampled_from(FLAKY))
    def flaky_seat(self, fail_times: int) -> None:
        """Start one saga whose seat request fails ``fail_times`` times with a transient error."""
        self._step(f"flaky_seat({fail_times})")
        self.do(Submit(1, extra=(("fail_times", fail_times),)))

    @rule(data=st.data())
    def arm_crash(self, data: st.DataObject) -> None:
        """Start one saga and kill a process at a point while it handles one of that saga's records."""
        cls = type(self)
        process = data.draw(st.sampled_from(cls.processes), label="process")
        point = data.draw(st.sampled_from(cls.crash_points), label="point")
        saga = self.run.op_id(len(self.run.ops))
        if process == ORCHESTRATOR:
            suffix = data.draw(st.sampled_from(ORCHESTRATOR_RECORDS), label="record")
            op = saga + suffix
        else:
            op = step_op(saga, first_step_of(process))
        self._step(f"arm_crash({process!r}, {point!r}, {op.removeprefix(saga) or 'start'!r})")
        self.do(Arm(Crash(point, worker=process), op=op), Submit(1))

    # -- the verdict ---------------------------------------------------------------------------
    def remember(self, message: str, result: RunResult) -> None:
        cls = type(self)
        if cls.first_failure is None:
            cls.first_failure = (message, result, list(cls.last_steps))

    def judge(self, result: RunResult) -> str | None:
        """Fail when a saga is not final, a step applied twice, or (unhunted) any anomaly."""
        cls = type(self)
        cls.durations.append(time.monotonic() - self.began)
        verdict = result.verdict
        note(f"verdict: {verdict.headline()}")
        ops = set(self.run.ops)
        open_sagas = sorted(op for op in ops if op in verdict.ops("stuck") | verdict.ops("lost"))
        broken = [] if verdict.anomaly_free else [verdict.headline()]
        if open_sagas:
            broken.append(f"sagas not in a final state: {', '.join(open_sagas)}")
        if self.first_duplicate is not None:
            step, dup = self.first_duplicate
            broken.append(f"step applied twice: {', '.join(dup)} (already after step {step})")
        hunted = cls.spec.expect
        if broken and hunted:
            # A bad variant's search hunts its spec's classes only, as the CQRS machine does: the
            # naive-unique saga also dead-letters a step whose reply already went out (a crash
            # before the offset commit), a smaller failure that would end the search for ``stuck``.
            found = set(verdict.found()) | ({"stuck"} if open_sagas else set())
            found |= {"duplicate-effect"} if self.first_duplicate is not None else set()
            if not found & hunted:
                return None
        return failure(broken, verdict)


def saga_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[SagaMachine]:
    """Return a ``SagaMachine`` subclass bound to ``spec`` (``flow="kafka_saga"``) and ``endpoints``."""
    name = f"Saga{spec.variant.title().replace('-', '')}Machine"
    return bind(SagaMachine, spec, endpoints, name, "pass a saga spec (flow='kafka_saga')", **attrs)
