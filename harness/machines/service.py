"""A state machine for a team's own service: submit, arm wire traps, freeze and thaw, kill, slow the network.

Each example is one run of the service scenario (its processes part ``ServiceInstances``): its instances started
behind their trap relays, tables truncated, toxics removed. The rules act while the service
runs; the verdict after quiescence (and any duplicate effect seen meanwhile) is judged in
``teardown``, with the run folder, the seed and the step list, and Hypothesis shrinks a failure
to a short program. The traps it arms are those the service's protocols reach (``Service.points``):

- ``arm_trap``: submit one operation and fire a trap on it (an op-recognising point), or on the
  next hit of a point that names no operation (a Kafka offset commit), with ``kill``, ``freeze``
  (thawed by ``thaw`` or after ``Service.freeze_s``) or ``drop``;
- ``kill_instance``: SIGKILL an instance at a random moment, as Jepsen's nemesis does;
- ``slow_network`` / ``heal_network`` on the service's proxies; ``restart_broker`` when enabled.

>>> Machine = service_machine(spec, endpoints)
>>> run_state_machine_as_test(Machine, settings=profile("ci"))
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from harness.faults import KillBroker
from harness.machines.base import NetworkMachine, bind
from harness.protocols import TRAPPED
from harness.run.core.outcome import RunResult
from harness.run.core.session import RunSession
from harness.run.flows.service import ServiceInstances
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.spec.steps import Arm, Hold, Kill, Submit, Thaw
from harness.stack.base import Endpoints

# Points whose message names no operation: armed on the next hit instead (see docs/traps.md).
BY_HIT = ("kafka_before_offset_commit",)
PROXIES = {p.name: p.proxy for p in TRAPPED}  # a trapped protocol -> the proxy its network faults go on


class ServiceMachine(NetworkMachine[RunSession]):
    """Drive ``spec``'s service against ``endpoints`` (class attributes, set by ``service_machine``)."""

    flows: ClassVar[tuple[str, ...]] = ("service_activemq", "service_kafka")
    trap_points: ClassVar[tuple[str, ...]] = ()
    trap_actions: ClassVar[tuple[str, ...]] = ("kill", "freeze", "drop")
    broker_restarts: ClassVar[bool] = False
    # A service restarted by a trap may need a Kafka group rejoin (seconds) per kill: room for a few.
    timeout_cap_s: ClassVar[float] = 45.0
    # How long a freeze holds at most in an example (the service's own freeze_s if shorter).
    freeze_cap_s: ClassVar[float] = 2.0
    # Off by default: a kill at a random moment makes a counterexample that replays differently
    # (Hypothesis then cannot shrink it); the traps kill at a named point, the same on every replay.
    random_kills: ClassVar[bool] = False
    # Whether this example armed a freeze: before one, ``thaw`` has nothing to continue, and a
    # step spent on it is a step not spent on a trap (a search once drew five thaws in a row).
    armed_freeze = False

    def open_session(self, spec: ScenarioSpec) -> RunSession:
        if spec.service is not None:  # frozen instances hold the example up: thaw them sooner
            service = replace(spec.service, freeze_s=min(spec.service.freeze_s, type(self).freeze_cap_s))
            spec = replace(spec, service=service)
        session = RunSession(spec, type(self).endpoints)
        assert isinstance(session.processes, ServiceInstances)  # a service flow's part
        return session.open()

    @property
    def instances(self) -> ServiceInstances:
        """The example's service instances and their traps (the run's processes part)."""
        processes = self.run.processes
        assert isinstance(processes, ServiceInstances)
        return processes

    # -- rules ---------------------------------------------------------------------------------
    @rule(data=st.data())
    def arm_trap(self, data: st.DataObject) -> None:
        """Submit one operation and fire a trap in the service's commit path while it handles it.

        Arming and submitting are one step, as for stages: a trap with no operation after it does nothing.
        """
        cls = type(self)
        point = data.draw(st.sampled_from(cls.trap_points), label="point")
        action = data.draw(st.sampled_from(cls.trap_actions), label="action")
        self._step(f"arm_trap({point!r}, {action!r})")
        if point in BY_HIT:
            self.do(Arm(Crash(point, nth=self.instances.traps.hits(point) + 1, action=action)))
        else:
            self.do(Arm(Crash(point, action=action), at=len(self.run.ops)))
        self.armed_freeze = self.armed_freeze or action == "freeze"
        self.do(Submit(1))

    @precondition(lambda self: self.armed_freeze)
    @rule()
    def thaw(self) -> None:
        """Continue every frozen instance (once a freeze was armed; a no-op when none is frozen now)."""
        self._step("thaw()")
        self.do(Thaw())

    @precondition(lambda self: type(self).random_kills)
    @rule(data=st.data())
    def kill_instance(self, data: st.DataObject) -> None:
        """SIGKILL an instance wherever it is (between commits or not); it is started again."""
        number = data.draw(st.integers(0, self.instances.service.instances - 1), label="instance")
        self._step(f"kill_instance({number})")
        self.do(Kill(number))

    @precondition(lambda self: type(self).broker_restarts)
    @rule()
    def restart_broker(self) -> None:
        """kill -9 the service's broker and start it again on its data, while the service runs."""
        self._step("restart_broker()")
        self.do(Hold(KillBroker(type(self).spec.flow.transport), hold_s=0.0))

    # -- the verdict ---------------------------------------------------------------------------
    def judge(self, result: RunResult) -> str | None:
        """Fail on any anomaly of the verdict, or a duplicate effect seen while the service ran."""
        return self.any_anomaly(result)


def service_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[ServiceMachine]:
    """Return a ``ServiceMachine`` subclass bound to ``spec``'s service and ``endpoints``."""
    service = spec.service
    points = service.points() if service is not None else ()
    proxies = tuple(PROXIES[p] for p in sorted(service.protocols())) if service is not None else ()
    name = f"{spec.name.title().replace('_', '')}{spec.variant.title().replace('-', '')}ServiceMachine"
    return bind(
        ServiceMachine,
        spec,
        endpoints,
        name,
        "bind a txchaos stage with stage_machine; service_machine drives ScenarioSpec.for_service(...) specs",
        **{"trap_points": points, "network_proxies": proxies, **attrs},
    )
