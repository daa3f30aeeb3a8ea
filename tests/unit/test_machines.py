"""The state-machine base: binding, per-class counters, the fault bookkeeping and the teardown template.

No services: the run is a stand-in with a ledger that records events, because what is tested is
the machine's own lifecycle, not a broker or a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from harness.errors import ConfigError
from harness.faults import Latency
from harness.ledger.schema import Kind
from harness.machines.base import MachineBase, NetworkMachine, bind
from harness.machines.cqrs import CqrsMachine
from harness.machines.dtm import DtmMachine
from harness.machines.saga import SagaMachine
from harness.machines.search import check_failure_text, find_counterexample, hunt_target
from harness.machines.stage import StageMachine, stage_machine
from harness.machines.targets import TARGETS, Target
from harness.run.core.outcome import RunResult
from harness.run.spec.scenario import ScenarioSpec
from harness.run.spec.steps import Heal, Open, Step
from harness.stack.base import Endpoints
from harness.verify.verdict import Verdict


@dataclass
class Ledger:
    events: list[tuple[Kind, str]] = field(default_factory=list)

    def emit(self, kind: Kind, **detail: Any) -> None:
        self.events.append((kind, str(detail.get("point"))))


@dataclass
class Folder:
    path: Path


class Run:
    """A closed run whose verdict is given: the teardown template is what is under test."""

    def __init__(self, spec: ScenarioSpec, anomalies: dict[str, int], faults: tuple[dict[str, Any], ...] = ()) -> None:
        self.faults = faults
        self.ledger = Ledger()
        self.ops: list[str] = []
        self.folder = Folder(Path("/tmp/run-x"))
        self.spec = spec
        self.anomalies = anomalies
        self.closed = 0
        self.applied: list[Step | str] = []

    def close(self) -> RunResult:
        self.closed += 1
        self.applied.append("close")
        verdict = Verdict(self.anomalies, (), {}, "test", seed=self.spec.seed, faults=self.faults)
        return RunResult(self.folder.path, verdict, self.spec)

    def duplicate_effects(self) -> list[str]:
        return []

    def apply(self, step: Step) -> None:
        self.applied.append(step)


class Judged(MachineBase[Run]):
    flows = ("activemq",)
    anomalies: dict[str, int] = {}
    faults: tuple[dict[str, Any], ...] = ()
    remembered: list[str] = []

    def open_session(self, spec: ScenarioSpec) -> Run:
        return Run(spec, type(self).anomalies, type(self).faults)

    @rule()
    def submit(self) -> None:
        self._step("submit(1)")

    def judge(self, result: RunResult) -> str | None:
        return None if result.verdict.anomaly_free else result.verdict.headline()

    def remember(self, message: str, result: RunResult) -> None:
        type(self).remembered.append(message)


def _spec(flow: str = "activemq") -> ScenarioSpec:
    return ScenarioSpec(
        name="m",
        variant="v",
        handler="harness.patterns.onepc:naive",
        schema="onepc",
        effect_table="onepc_effects",
        flow=flow,
    )


def _endpoints() -> Endpoints:
    # Binding only checks the type: no rule here reaches a service through it.
    return Endpoints.__new__(Endpoints)


def test_bind_refuses_a_spec_of_another_broker_and_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="kafka_saga") as err:
        bind(Judged, _spec("kafka_saga"), _endpoints(), "X", "use the saga machine")
    assert "use the saga machine" in str(err.value)


def _run(machine: type[MachineBase[Any]], examples: int = 1) -> None:
    run_state_machine_as_test(
        machine, settings=settings(max_examples=examples, stateful_step_count=2, database=None, deadline=None)
    )


def test_each_bound_machine_counts_its_own_examples_and_steps() -> None:
    a = bind(Judged, _spec(), _endpoints(), "A", "-", anomalies={})
    b = bind(Judged, _spec(), _endpoints(), "B", "-", anomalies={})
    _run(a, examples=3)
    assert a.examples >= 3
    assert b.examples == 0
    assert b.last_steps == []


def test_teardown_judges_the_closed_run_and_fails_with_seed_folder_and_steps() -> None:
    machine = bind(Judged, _spec(), _endpoints(), "Bad", "-", anomalies={"lost": 1}, remembered=[])
    with pytest.raises(AssertionError) as failure:
        _run(machine)
    message = str(failure.value)
    assert message.startswith("ANOMALIES: lost=1")
    assert "run folder: /tmp/run-x" in message
    assert "seed: " in message
    assert "steps: " in message
    assert machine.found_at is not None
    assert machine.found_at[0] == 1
    assert machine.remembered[0].startswith("ANOMALIES: lost=1")


UNFIRED = {"type": "crash", "name": "after_db_commit", "fired": False, "why": "crash after_db_commit ... never fired"}
FIRED = {"type": "crash", "name": "before_ack", "fired": True}


def test_a_machine_counts_the_faults_fired_per_example_and_an_unfired_arm_is_no_counterexample() -> None:
    machine = bind(Judged, _spec(), _endpoints(), "Counting", "-", anomalies={}, faults=(FIRED, UNFIRED))
    _run(machine, examples=3)
    assert machine.found_at is None, "an arm the example never reached is not a failure of the flow"
    assert len(machine.fired) == machine.examples
    assert set(machine.fired.values()) == {(1, 2)}
    n = machine.examples
    assert (
        machine.fired_summary()
        == f"faults fired: {n} of {2 * n} requested in {n} examples (0 examples fired none of theirs)"
    )


def test_a_counterexample_says_how_many_of_its_faults_fired() -> None:
    machine = bind(Judged, _spec(), _endpoints(), "BadCount", "-", anomalies={"lost": 1}, faults=(FIRED,))
    with pytest.raises(AssertionError, match="faults fired: 1 of 1 requested"):
        _run(machine)


def test_a_clean_run_passes_teardown_and_is_kept_as_the_last_result() -> None:
    machine = bind(Judged, _spec(), _endpoints(), "Good", "-", anomalies={})
    _run(machine, examples=2)
    assert machine.found_at is None
    assert machine.last_result is not None
    assert machine.last_result.verdict.clean


class Faulty(Judged):
    runs: list[Run] = []

    @rule()
    def submit(self) -> None:  # every step keeps two faults
        type(self).runs.append(self.run)
        self.do(Open(Latency(100), "postgres"), Open(Latency(50), "kafka"))
        assert [f.rsplit(" on ", 1)[1] for f in self.kept_faults[-2:]] == ["postgres", "kafka"]


def test_kept_faults_are_steps_the_run_applies_and_a_heal_comes_before_the_run_closes() -> None:
    machine = bind(Faulty, _spec(), _endpoints(), "Faulty1", "-", anomalies={}, runs=[])
    _run(machine, examples=5)
    runs = {id(run): run for run in machine.runs}.values()  # one per example that kept faults
    assert runs
    for run in runs:
        opened = [s for s in run.applied if isinstance(s, Open)]
        assert opened
        # The faults are the run's (it heals them in reverse, recorded); the machine heals them all at teardown.
        assert run.applied[-2:] == [Heal(), "close"]


def test_every_machine_builds_on_the_base_with_one_way_of_applying_faults() -> None:
    for machine in (StageMachine, SagaMachine, CqrsMachine):
        assert issubclass(machine, NetworkMachine)
    assert issubclass(DtmMachine, MachineBase)
    assert not issubclass(DtmMachine, NetworkMachine)
    rules = {r.function.__name__ for r in DtmMachine.setup_state().rules}
    assert "slow_network" not in rules  # the DTM machine holds its faults per rule instead


@pytest.mark.parametrize("pattern", sorted(TARGETS))
def test_every_target_binds_to_its_machine(pattern: str) -> None:
    target = TARGETS[pattern]()
    for spec in (target.bad, target.fixed):
        machine = target.machine(spec, _endpoints(), **target.attrs)
        assert issubclass(machine, MachineBase)
        assert machine.spec is spec


def test_the_stage_machine_takes_the_kafka_rules_for_a_kafka_spec() -> None:
    kafka = stage_machine(TARGETS["kafka"]().bad, _endpoints())
    assert kafka.network_proxies == ("kafka", "postgres")
    assert kafka.batch_crashes
    assert stage_machine(TARGETS["onepc"]().bad, _endpoints()).network_proxies == ("activemq_stomp", "postgres")


def _target(anomalies: dict[str, int], anomaly: str) -> Target:
    def machine(spec: ScenarioSpec, endpoints: Endpoints) -> type[MachineBase[Any]]:
        return bind(Judged, spec, endpoints, "Hunted", "-", anomalies=anomalies, remembered=[])

    return Target("judged", _spec(), _spec(), anomaly, machine=machine)


def test_a_hunt_returns_the_counterexample_and_where_it_was_found() -> None:
    text, (example, seconds) = hunt_target(_target({"lost": 1}, r"lost=\d"), _endpoints(), cap=3)
    assert text.startswith("ANOMALIES: lost=1")
    assert example == 1
    assert seconds >= 0


def test_a_hunt_whose_failure_is_another_anomaly_fails_and_names_the_one_wanted() -> None:
    with pytest.raises(AssertionError, match="does not name 'stuck'"):
        hunt_target(_target({"lost": 1}, "stuck"), _endpoints(), cap=3)


def test_a_hunt_that_finds_nothing_fails() -> None:
    with pytest.raises(AssertionError, match="found no counterexample in 2 examples"):
        hunt_target(_target({}, "lost"), _endpoints(), cap=2)


FAILURE = "duplicate-effect: a-op1, a-op2\nrun folder: /tmp/run-x\nseed: 7\nsteps: submit(1) -> arm_crash()"
STEPS = ["submit(1)", "arm_crash()"]


def test_a_failure_text_that_names_the_operations_and_carries_its_replay_passes() -> None:
    check_failure_text(FAILURE, "duplicate-effect", {"a-op2", "a-op1"}, STEPS, Path("/tmp/run-x"))


@pytest.mark.parametrize(
    ("message", "flagged", "steps", "missing"),
    [
        (FAILURE, {"a-op1", "a-op3"}, STEPS, "the flagged operations"),
        (FAILURE, {"a-op1", "a-op2"}, ["arm_crash()", "submit(1)"], "the steps"),
        (FAILURE.replace("/tmp/run-x", "/tmp/run-y"), {"a-op1", "a-op2"}, STEPS, "the run folder"),
        (FAILURE.replace("seed: 7", "seed: ?"), {"a-op1", "a-op2"}, STEPS, "a seed"),
    ],
    ids=["an operation", "the steps' order", "the run folder", "the seed"],
)
def test_a_failure_text_without_part_of_it_is_refused_naming_the_part(
    message: str, flagged: set[str], steps: list[str], missing: str
) -> None:
    with pytest.raises(AssertionError, match=f"does not carry {missing}"):
        check_failure_text(message, "duplicate-effect", flagged, steps, Path("/tmp/run-x"))


class _PassesOnReplay(RuleBasedStateMachine):
    """Fails its first example only: a real system whose replay met other timing."""

    runs = 0

    @rule()
    def step(self) -> None:
        pass

    def teardown(self) -> None:
        type(self).runs += 1
        if type(self).runs == 1:
            raise AssertionError("ANOMALIES: duplicate-effect=1 [op7]\nseed: 1\nsteps: step()")


def test_a_counterexample_whose_replay_passes_is_still_reported_with_its_text() -> None:
    # Hypothesis replays a failure before reporting it; a replay that passes makes it raise
    # FlakyFailure. The first failure is the counterexample: the service tests lost it in CI.
    search = settings(max_examples=5, database=None, phases=[Phase.generate], deadline=None)
    assert find_counterexample(_PassesOnReplay, search).startswith("ANOMALIES: duplicate-effect=1 [op7]")


class _Holds(RuleBasedStateMachine):
    @rule()
    def step(self) -> None:
        pass


def test_a_search_that_finds_nothing_returns_no_text() -> None:
    assert find_counterexample(_Holds, settings(max_examples=3, database=None, deadline=None)) == ""


class _Overruns(Judged):
    """An example that draws ``big`` runs out of choices in its step, and its run is judged lost."""

    big = False

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        self._step("submit(1)")
        self.big = self.big or data.draw(st.booleans(), label="big")
        if self.big:
            for _ in range(9):  # more than an example may draw (8 KiB)
                data.draw(st.binary(min_size=1_000, max_size=1_000))

    def judge(self, result: RunResult) -> str | None:
        return "ANOMALIES: lost=1 [op1]" if self.big else None


def _overrun_search(*phases: Phase) -> settings:
    return settings(
        max_examples=15,
        database=None,
        deadline=None,
        phases=phases,
        stateful_step_count=2,
        suppress_health_check=list(HealthCheck),
    )


def test_hypothesis_drops_a_failure_judged_after_its_example_ran_out_of_choices() -> None:
    # The premise of what follows: the lost run fails its teardown, yet Hypothesis reports nothing
    # (a service search in CI judged duplicates in such examples and ended "no counterexample").
    machine = bind(_Overruns, _spec(), _endpoints(), "Dropped", "-", remembered=[])
    run_state_machine_as_test(machine, settings=_overrun_search(Phase.generate))
    assert machine.remembered, "an example drew big and failed its teardown"
    assert machine.remembered[0].startswith("ANOMALIES: lost=1")
    assert machine.dropped is not None
    assert machine.dropped[0] == machine.remembered[0]


def test_a_search_that_does_not_shrink_ends_at_the_dropped_failure_and_reports_it() -> None:
    machine = bind(_Overruns, _spec(), _endpoints(), "DroppedHunt", "-", remembered=[])
    found = find_counterexample(machine, _overrun_search(Phase.generate))
    assert found.startswith("ANOMALIES: lost=1")
    assert "run folder: /tmp/run-x" in found
    assert "steps: submit(1)" in found
    failed_at = int(found.split("seed: ", 1)[1].split()[0])  # an example's seed is its number
    assert machine.examples == failed_at, "no example ran after the one that failed"


def test_a_search_that_shrinks_goes_on_and_still_reports_the_dropped_failure() -> None:
    machine = bind(_Overruns, _spec(), _endpoints(), "DroppedShrink", "-", remembered=[])
    found = find_counterexample(machine, _overrun_search(Phase.generate, Phase.shrink))
    assert found.startswith("ANOMALIES: lost=1")
    failed_at = int(found.split("seed: ", 1)[1].split()[0])
    assert machine.examples > failed_at, "a search that shrinks looks on for a failure Hypothesis can shrink"
    assert found.endswith(f"steps: {' -> '.join(machine.last_steps)}"), "the steps are the failure's"
