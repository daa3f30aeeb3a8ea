"""A state machine for a stage pattern: submit, crash, force redeliveries, slow the network, restart the broker.

Each example is one ``RunSession``: a fresh namespace, tables truncated, toxics removed. Rules
act while the flow runs; the invariant "no duplicate effect" is checked after every step, and
"nothing lost, nothing stuck" (the full verdict) after quiescence in ``teardown``, which is where
any failure is raised (see ``MachineBase.no_duplicate_effect``). A failure carries the run
folder, the seed and the step list; Hypothesis shrinks it to a short program.

What the rules may choose from is class data, so a pattern widens it without new rules:
``crash_points`` (its own points, e.g. ``after_external_call``), ``redelivery_actions``
(add ``nack`` only on a broker with the redelivery plugin: without it a NACK dead-letters at
once), ``poison`` (also submit poison messages), ``broker_restarts`` (kill -9 and restart
ActiveMQ while the flow runs; each costs seconds) and ``batch_crashes`` (Kafka, on by default
there: a crash on the last of several records produced together, inside one poll batch).

Subclass, or bind one with ``stage_machine(spec, endpoints)``:

>>> Machine = stage_machine(spec, endpoints)
>>> run_state_machine_as_test(Machine, settings=profile("ci"))
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from harness.faults import KillBroker
from harness.machines.base import NetworkMachine, bind
from harness.protocols import proxies
from harness.run.core.outcome import RunResult
from harness.run.core.session import RunSession
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.spec.steps import Arm, Hold, Submit
from harness.stack.base import Endpoints

CRASH_POINTS = ("before_db_commit", "after_db_commit", "after_broker_commit")
REDELIVERY_POINTS = ("before_db_commit", "after_db_commit")
REDELIVERY_ACTIONS = ("abort_unsubscribe", "disconnect")
PROXIES = proxies("stomp", "postgres")
# A Kafka stage's windows: the crash points around its DB and offset commits, and a consumer that
# leaves the group before its offset commit (everything after the last commit comes back).
KAFKA_CRASH_POINTS = ("after_poll", "after_db_commit", "before_offset_commit")
KAFKA_REDELIVERY_POINTS = ("after_db_commit", "before_offset_commit")
KAFKA_PROXIES = proxies("kafka", "postgres")
# What a Kafka stage's machine draws from instead of the ActiveMQ defaults.
KAFKA_RULES: dict[str, Any] = {
    "crash_points": KAFKA_CRASH_POINTS,
    "redelivery_points": KAFKA_REDELIVERY_POINTS,
    "redelivery_actions": ("disconnect",),
    "network_proxies": KAFKA_PROXIES,
    "batch_crashes": True,
}


class StageMachine(NetworkMachine[RunSession]):
    """Drive ``spec``'s stage against ``endpoints`` (class attributes, set by ``stage_machine``)."""

    flows: ClassVar[tuple[str, ...]] = ("activemq", "kafka")
    crash_points: ClassVar[tuple[str, ...]] = CRASH_POINTS
    redelivery_points: ClassVar[tuple[str, ...]] = REDELIVERY_POINTS
    redelivery_actions: ClassVar[tuple[str, ...]] = REDELIVERY_ACTIONS
    network_proxies: ClassVar[tuple[str, ...]] = PROXIES
    poison: ClassVar[bool] = False
    broker_restarts: ClassVar[bool] = False
    # Kafka: also arm a crash on the last of several records produced together (one poll batch).
    batch_crashes: ClassVar[bool] = False

    def open_session(self, spec: ScenarioSpec) -> RunSession:
        """Return this example's run, open (a pattern's own machine opens its own session class)."""
        return RunSession(spec, type(self).endpoints).open()  # the session of the spec's flow

    # -- rules ---------------------------------------------------------------------------------
    @precondition(lambda self: bool(type(self).crash_points))
    @rule(data=st.data())
    def arm_crash(self, data: st.DataObject) -> None:
        """Submit one operation and kill the worker at a point while it processes it.

        Arming and submitting are one step: an arm with no operation after it does nothing, and
        Hypothesis, left to pair them, spent most examples on programs that never crash anything.
        """
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"arm_crash({point!r})")
        self.do(Arm(Crash(point), at=len(self.run.ops)), Submit(1))

    @precondition(lambda self: type(self).batch_crashes and bool(type(self).crash_points))
    @rule(data=st.data(), n=st.integers(min_value=2, max_value=4))
    def crash_in_batch(self, data: st.DataObject, n: int) -> None:
        """Submit ``n`` operations in one flush and kill the worker at a point on the last of them.

        Records produced together are polled together, so the crash lands inside a batch: the
        window where what the batch did before it is redone, or what it stored is lost.
        """
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"crash_in_batch({point!r}, {n})")
        self.do(Arm(Crash(point), at=len(self.run.ops) + n - 1), Submit(n))

    @precondition(lambda self: bool(type(self).redelivery_actions))
    @rule(data=st.data())
    def force_redelivery(self, data: st.DataObject) -> None:
        """Submit one operation and make the worker give its message back: NACK, ABORT+UNSUBSCRIBE, disconnect."""
        cls = type(self)
        point = data.draw(st.sampled_from(cls.redelivery_points), label="point")
        action = data.draw(st.sampled_from(cls.redelivery_actions), label="action")
        self._step(f"force_redelivery({point!r}, {action!r})")
        self.do(Arm(Crash(point, action=action), at=len(self.run.ops)), Submit(1))

    @precondition(lambda self: type(self).poison)
    @rule()
    def submit_poison(self) -> None:
        """Submit one message that crashes the worker on every delivery."""
        self._step("submit_poison()")
        self.do(Submit(1, poison=True))

    @precondition(lambda self: type(self).broker_restarts)
    @rule()
    def restart_broker(self) -> None:
        """kill -9 the run's broker (ActiveMQ or Kafka) and start it again on its data, while the flow runs."""
        self._step("restart_broker()")
        service = type(self).spec.flow.transport  # the flow's transport is the service to kill
        self.do(Hold(KillBroker(service), hold_s=0.0))

    # -- the verdict ---------------------------------------------------------------------------
    def judge(self, result: RunResult) -> str | None:
        """Fail on any anomaly of the verdict, or a duplicate effect seen while the flow ran."""
        return self.any_anomaly(result)


def stage_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[StageMachine]:
    """Return a ``StageMachine`` subclass bound to ``spec`` and ``endpoints``."""
    name = f"{spec.name.title().replace('_', '')}{spec.variant.title().replace('-', '')}Machine"
    rules = KAFKA_RULES if spec.flow.name == "kafka" else {}
    return bind(
        StageMachine,
        spec,
        endpoints,
        name,
        "bind it with its pattern's machine: cqrs_machine, saga_machine or dtm_machine (TARGETS[...].machine)",
        **{**rules, **attrs},  # a target's own attributes win over the flow's defaults
    )
