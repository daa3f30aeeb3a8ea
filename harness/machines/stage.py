"""A state machine for a stage pattern: submit, crash, force redeliveries, slow the network, restart the broker.

Each example is one ``RunSession``: a fresh namespace, tables truncated, toxics removed. Rules
act while the flow runs; the invariant "no duplicate effect" is checked after every step, and
"nothing lost, nothing stuck" (the full verdict) after quiescence in ``teardown``, which is where
any failure is raised (see ``no_duplicate_effect``). A failure
carries the run folder, the seed and the step list; Hypothesis shrinks it to a short program.

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

import os
import time
from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import ConfigError
from harness.faults.broker import kill_service, restart_service
from harness.ledger.schema import Kind
from harness.run.kafka_runner import KafkaRunSession
from harness.run.runner import RunResult, RunSession
from harness.run.spec import Crash, ScenarioSpec
from harness.stack.base import Endpoints

CRASH_POINTS = ("before_db_commit", "after_db_commit", "after_broker_commit")
REDELIVERY_POINTS = ("before_db_commit", "after_db_commit")
REDELIVERY_ACTIONS = ("abort_unsubscribe", "disconnect")
PROXIES = ("activemq_stomp", "postgres")
# A Kafka stage's windows: the crash points around its DB and offset commits, and a consumer that
# leaves the group before its offset commit (everything after the last commit comes back).
KAFKA_CRASH_POINTS = ("after_poll", "after_db_commit", "before_offset_commit")
KAFKA_REDELIVERY_POINTS = ("after_db_commit", "before_offset_commit")
KAFKA_PROXIES = ("kafka", "postgres")


class StageMachine(RuleBasedStateMachine):
    """Drive ``spec``'s stage against ``endpoints`` (class attributes, set by ``stage_machine``)."""

    spec: ClassVar[ScenarioSpec]
    endpoints: ClassVar[Endpoints]
    crash_points: ClassVar[tuple[str, ...]] = CRASH_POINTS
    redelivery_points: ClassVar[tuple[str, ...]] = REDELIVERY_POINTS
    redelivery_actions: ClassVar[tuple[str, ...]] = REDELIVERY_ACTIONS
    network_proxies: ClassVar[tuple[str, ...]] = PROXIES
    poison: ClassVar[bool] = False
    broker_restarts: ClassVar[bool] = False
    # Kafka: also arm a crash on the last of several records produced together (one poll batch).
    batch_crashes: ClassVar[bool] = False
    # The steps of the last example, in order: after a failure, the shrunk counterexample.
    last_steps: ClassVar[list[str]] = []
    last_result: ClassVar[RunResult | None] = None
    examples: ClassVar[int] = 0
    # When the first counterexample appeared (example number, seconds since the first example):
    # the rest of the examples are Hypothesis shrinking it.
    found_at: ClassVar[tuple[int, float] | None] = None
    started_at: ClassVar[float | None] = None

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        cls.examples += 1
        if cls.started_at is None:
            cls.started_at = time.monotonic()
        cls.last_steps = []
        spec = replace(cls.spec, seed=cls.examples, settle_s=0.2, timeout_s=min(cls.spec.timeout_s, 20.0))
        self.run: RunSession | KafkaRunSession = self.open_session(spec)
        self.proxies = ToxiproxyAdmin(cls.endpoints.toxiproxy_api)
        self.toxics: set[tuple[str, str]] = set()
        self.first_duplicate: tuple[int, list[str]] | None = None
        note(f"run folder: {self.run.folder.path}")

    def open_session(self, spec: ScenarioSpec) -> RunSession | KafkaRunSession:
        """Return this example's run, open (a pattern's own machine opens its own session class)."""
        endpoints = type(self).endpoints
        return (KafkaRunSession(spec, endpoints) if spec.broker == "kafka" else RunSession(spec, endpoints)).open()

    def _step(self, text: str) -> None:
        type(self).last_steps.append(text)

    # -- rules ---------------------------------------------------------------------------------
    @rule(n=st.integers(min_value=1, max_value=3))
    def submit(self, n: int) -> None:
        self._step(f"submit({n})")
        self.run.submit(n)

    @precondition(lambda self: bool(type(self).crash_points))
    @rule(data=st.data())
    def arm_crash(self, data: st.DataObject) -> None:
        """Submit one operation and kill the worker at a point while it processes it.

        Arming and submitting are one step: an arm with no operation after it does nothing, and
        Hypothesis, left to pair them, spent most examples on programs that never crash anything.
        """
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"arm_crash({point!r})")
        self.run.arm(Crash(point), op=self.run.op_id(len(self.run.ops)))
        self.run.submit(1)

    @precondition(lambda self: type(self).batch_crashes and bool(type(self).crash_points))
    @rule(data=st.data(), n=st.integers(min_value=2, max_value=4))
    def crash_in_batch(self, data: st.DataObject, n: int) -> None:
        """Submit ``n`` operations in one flush and kill the worker at a point on the last of them.

        Records produced together are polled together, so the crash lands inside a batch: the
        window where what the batch did before it is redone, or what it stored is lost.
        """
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"crash_in_batch({point!r}, {n})")
        self.run.arm(Crash(point), op=self.run.op_id(len(self.run.ops) + n - 1))
        self.run.submit(n)

    @precondition(lambda self: bool(type(self).redelivery_actions))
    @rule(data=st.data())
    def force_redelivery(self, data: st.DataObject) -> None:
        """Submit one operation and make the worker give its message back: NACK, ABORT+UNSUBSCRIBE, disconnect."""
        cls = type(self)
        point = data.draw(st.sampled_from(cls.redelivery_points), label="point")
        action = data.draw(st.sampled_from(cls.redelivery_actions), label="action")
        self._step(f"force_redelivery({point!r}, {action!r})")
        self.run.arm(Crash(point, action=action), op=self.run.op_id(len(self.run.ops)))
        self.run.submit(1)

    @precondition(lambda self: type(self).poison)
    @rule()
    def submit_poison(self) -> None:
        """Submit one message that crashes the worker on every delivery."""
        self._step("submit_poison()")
        self.run.submit(1, poison=True)

    @precondition(lambda self: type(self).broker_restarts)
    @rule()
    def restart_broker(self) -> None:
        """kill -9 the run's broker (ActiveMQ or Kafka) and start it again on its data, while the flow runs."""
        broker = type(self).spec.broker
        self._step("restart_broker()")
        self.run.ledger.emit(Kind.FAULT_START, point=f"kill:{broker}")
        kill_service(type(self).endpoints, broker)
        took = restart_service(type(self).endpoints, broker)
        self.run.ledger.emit(Kind.FAULT_END, point=f"kill:{broker}", restart_s=round(took, 3))

    @rule(data=st.data(), latency_ms=st.sampled_from([20, 150]))
    def slow_network(self, data: st.DataObject, latency_ms: int) -> None:
        proxy = data.draw(st.sampled_from(type(self).network_proxies), label="proxy")
        self._step(f"slow_network({proxy!r}, {latency_ms})")
        name = f"latency-{len(self.toxics)}"
        self.proxies.add_toxic(proxy, type="latency", name=name, attributes={"latency": latency_ms, "jitter": 10})
        self.toxics.add((proxy, name))
        self.run.ledger.emit(Kind.FAULT_START, point=name, proxy=proxy, latency_ms=latency_ms)

    @precondition(lambda self: bool(self.toxics))
    @rule()
    def heal_network(self) -> None:
        self._step("heal_network()")
        self._heal()

    def _heal(self) -> None:
        for proxy, name in sorted(self.toxics):
            self.proxies.remove_toxic(proxy, name)
            self.run.ledger.emit(Kind.FAULT_END, point=name, proxy=proxy)
        self.toxics.clear()

    # -- invariants ----------------------------------------------------------------------------
    def _violated(self, message: str) -> None:
        """Fail the example. One raise site on purpose: Hypothesis tells failures apart by where
        they are raised, and every anomaly of a program must shrink as one bug, not as several."""
        cls = type(self)
        if cls.found_at is None and cls.started_at is not None:
            cls.found_at = (cls.examples, time.monotonic() - cls.started_at)
        raise AssertionError(message)

    @invariant()
    def no_duplicate_effect(self) -> None:
        """Check after every step; the failure is raised in ``teardown``, after quiescence.

        A real flow's timing varies: the same program may show its duplicate after step 2 on one
        run and after step 3 on the replay. Raising here would make the example stop at a
        different step each time, which Hypothesis rejects as flaky data generation and cannot
        shrink. The step where it was first seen is kept and reported.
        """
        if self.first_duplicate is None:
            duplicated = self.run.duplicate_effects()
            if duplicated:
                self.first_duplicate = (len(type(self).last_steps), duplicated)
                note(f"duplicate-effect on {duplicated} after step {len(type(self).last_steps)}")

    def teardown(self) -> None:
        try:
            self._heal()
        finally:
            result = self.run.close()  # quiescence, residue, verdict; heals the run in any case
        type(self).last_result = result
        verdict = result.verdict
        note(f"verdict: {verdict.headline()}")
        seen = ""
        if self.first_duplicate is not None:
            step, ops = self.first_duplicate
            seen = f"\nduplicate-effect on {ops} already after step {step}"
        if not verdict.clean or seen:
            self._violated(
                f"{verdict.headline()}{seen}\nrun folder: {result.run_dir}\nseed: {verdict.seed}\n"
                f"steps: {' -> '.join(type(self).last_steps)}"
            )


def stage_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[StageMachine]:
    """Return a ``StageMachine`` subclass bound to ``spec`` and ``endpoints``."""
    if spec.broker not in ("activemq", "kafka"):
        raise ConfigError(
            f"{spec.label} runs on {spec.broker!r}, which the stage machine does not drive",
            hint="bind it with its pattern's machine: cqrs_machine, saga_machine or dtm_machine (TARGETS[...].machine)",
        )
    if not isinstance(endpoints, Endpoints):
        raise ConfigError(
            f"endpoints must be an Endpoints object, not {type(endpoints).__name__}",
            hint="pass the txchaos_stack fixture's value",
        )
    name = f"{spec.name.title().replace('_', '')}{spec.variant.title().replace('-', '')}Machine"
    kafka: dict[str, Any] = {}
    if spec.broker == "kafka":
        kafka = {
            "crash_points": KAFKA_CRASH_POINTS,
            "redelivery_points": KAFKA_REDELIVERY_POINTS,
            "redelivery_actions": ("disconnect",),
            "network_proxies": KAFKA_PROXIES,
            "batch_crashes": True,
        }
    namespace: dict[str, Any] = {
        **kafka,
        "spec": spec,
        "endpoints": endpoints,
        "last_steps": [],
        "examples": 0,
        "found_at": None,
        "started_at": None,
        **attrs,
    }
    namespace["__module__"] = os.environ.get("TXCHAOS_MACHINE_MODULE", __name__)
    return type(name, (StageMachine,), namespace)
