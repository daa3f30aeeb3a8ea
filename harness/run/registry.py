"""The registered flows: what runs on which transport, and what a spec of each may say.

A ``Flow`` is a frozen description: its name (what a spec's ``flow=`` may give), its transport, the session
class that runs it (named as ``module:Class``, imported only when a run starts), the crash points
and actions its runtime knows, the optional spec fields it accepts and the check of its
``options``. ``ScenarioSpec`` validates itself against its flow before any service starts;
``RunSession(spec, endpoints)`` and ``harness.run_scenario`` run every flow registered here.

A new flow is one session module and one ``register(Flow(...))`` line below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.patterns.saga_options import PROCESSES as SAGA_PROCESSES
from harness.patterns.saga_options import SagaOptions
from harness.traps.base import POINTS as TRAP_POINTS
from harness.worker.crash import ACTIONS, STAGE_POINTS, TRAP_ACTIONS
from harness.worker.kafka_options import KAFKA_ACTIONS, KAFKA_POINTS, KafkaStageOptions

if TYPE_CHECKING:
    from harness.run.session import RunSession
    from harness.run.spec import ScenarioSpec

# Optional spec fields; a flow lists those it accepts (``workers`` means more than one).
OPTIONAL_FIELDS = ("chain", "helpers", "outbox_table", "poison", "workers")
SERVICE_ACTIONS = TRAP_ACTIONS  # what a trap does to the service instance it fires on


@dataclass(frozen=True)
class Flow:
    """One registered flow: a topology on a transport, run by one session class."""

    name: str
    transport: str
    session: str
    summary: str
    points: tuple[str, ...] = ()
    actions: tuple[str, ...] = ("kill",)
    accepts: frozenset[str] = frozenset()
    refusal: str = ""  # the hint when a spec uses a field this flow does not accept
    check_spec: Callable[[ScenarioSpec], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.accepts <= set(OPTIONAL_FIELDS):
            raise ValueError(f"flow {self.name} accepts unknown fields {sorted(self.accepts - set(OPTIONAL_FIELDS))}")
        if ":" not in self.session:
            raise ValueError(f"flow {self.name} names its session {self.session!r}, not 'module:Class'")

    def check(self, spec: ScenarioSpec) -> None:
        """Refuse what ``spec`` says that this flow cannot run (fields, crashes, then options)."""
        used = {
            "chain": bool(spec.chain),
            "helpers": bool(spec.helpers),
            "outbox_table": spec.outbox_table is not None,
            "poison": bool(spec.poison),
            "workers": spec.workers != 1,
        }
        if any(used[name] and name not in self.accepts for name in OPTIONAL_FIELDS):
            words = [
                "several workers" if name == "workers" else name for name in OPTIONAL_FIELDS if name not in self.accepts
            ]
            listed = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
            raise ConfigError(f"a {self.label} scenario with {listed}", hint=self.refusal)
        points = (*self.points, *spec.points)
        for crash in spec.crashes:
            if crash.action not in self.actions:
                raise ConfigError(
                    f"unknown crash action {crash.action!r}", hint=f"use one of {', '.join(self.actions)}"
                )
            if crash.point not in points:
                raise ConfigError(f"unknown crash point {crash.point!r}", hint=f"use one of {', '.join(points)}")
        if self.check_spec is not None:
            self.check_spec(spec)

    @property
    def label(self) -> str:
        return {"activemq": "stage", "kafka": "Kafka", "dtm": "DTM"}.get(self.name, self.name)

    def session_class(self) -> type[RunSession]:
        """Import and return the session class that runs this flow."""
        module, _, name = self.session.partition(":")
        cls: type[RunSession] = getattr(importlib.import_module(module), name)
        return cls


FLOWS: dict[str, Flow] = {}


def register(flow: Flow) -> Flow:
    """Register ``flow`` under its name (a name registered twice is a programming error)."""
    if flow.name in FLOWS:
        raise ValueError(f"flow {flow.name!r} is registered twice")
    FLOWS[flow.name] = flow
    return flow


def flow_named(name: object) -> Flow:
    """Return the registered flow called ``name`` (what a spec's ``flow=`` gives)."""
    flow = FLOWS.get(name) if isinstance(name, str) else None
    if flow is None:
        raise ConfigError(
            f"unknown flow {name!r}",
            hint=" or ".join(repr(f) for f in FLOWS)
            + " (the registered flows: "
            + "; ".join(f"{f.name}: {f.summary}" for f in FLOWS.values())
            + ")",
        )
    return flow


def flows() -> Iterator[Flow]:
    """Yield every registered flow, in registration order."""
    yield from FLOWS.values()


def session_class(spec: ScenarioSpec) -> type[RunSession]:
    """Return the session class that runs ``spec``'s flow."""
    return spec.flow.session_class()


def _kafka_options(spec: ScenarioSpec) -> None:
    KafkaStageOptions.from_options(spec.options)


def _saga(spec: ScenarioSpec) -> None:
    SagaOptions.from_options(spec.options)
    KafkaStageOptions.from_options(spec.options)
    for crash in spec.crashes:
        if crash.worker not in SAGA_PROCESSES:
            raise ConfigError(
                f"saga crash at {crash.point} names process {crash.worker!r}",
                hint=f"set Crash(worker=...) to one of {', '.join(SAGA_PROCESSES)}",
            )


def _cqrs(spec: ScenarioSpec) -> None:
    KafkaStageOptions.from_options(spec.options)
    if not spec.contract.per_key or spec.contract.expects_downstream:
        raise ConfigError(
            f"{spec.label}: a CQRS replica's contract must judge per key and expect no downstream",
            hint="set contract=FlowContract(expects_downstream=False, per_key=True)",
        )


def dtm_holds(options: dict[str, object]) -> tuple[set[int], float, float]:
    """Return the held operation numbers, how long they are held at most, and every other
    transaction's duration (``options["local_tx_s"]``: keeps transfers in flight under a fault)."""
    numbers = options.get("slow_commits", [])
    hold, busy = options.get("hold_s", 6.0), options.get("local_tx_s", 0.0)
    if (
        not isinstance(numbers, list | tuple)
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
        or not isinstance(hold, int | float)
        or not isinstance(busy, int | float)
    ):
        raise ConfigError(
            f"slow_commits={numbers!r}, hold_s={hold!r}, local_tx_s={busy!r}",
            hint="give slow_commits as a list of operation numbers, hold_s and local_tx_s in seconds",
        )
    return set(numbers), float(hold), float(busy)


def _dtm(spec: ScenarioSpec) -> None:
    dtm_holds(spec.options)


register(
    Flow(
        "activemq",
        "activemq",
        "harness.run.runner:StageRunSession",
        "a chain of STOMP queue stages with helpers and an outbox",
        points=STAGE_POINTS,
        actions=ACTIONS,
        accepts=frozenset(OPTIONAL_FIELDS),
    )
)


def _kafka_flow(name: str, session: str, summary: str, check: Callable[[ScenarioSpec], None]) -> Flow:
    """Return a flow of Kafka stages: their crash points and actions, no chain, helpers or outbox."""
    return Flow(
        name,
        "kafka",
        session,
        summary,
        points=KAFKA_POINTS,
        actions=KAFKA_ACTIONS,
        accepts=frozenset({"poison", "workers"}),
        refusal="the Kafka run has one consumer stage so far: leave those out",
        check_spec=check,
    )


register(
    _kafka_flow(
        "kafka", "harness.run.kafka_runner:KafkaRunSession", "one consumer-group stage on topics", _kafka_options
    )
)
register(
    _kafka_flow(
        "kafka_saga",
        "harness.run.saga_runner:SagaRunSession",
        "an orchestrator and two participants, each a Kafka stage",
        _saga,
    )
)
register(
    _kafka_flow(
        "kafka_cqrs",
        "harness.run.cqrs_runner:CqrsRunSession",
        "entity events keyed by aggregate id into one Kafka replica stage",
        _cqrs,
    )
)
register(
    Flow(
        "dtm",
        "http",
        "harness.run.dtm_runner:DtmRunSession",
        "a 2-phase message transfer: a service and its branch over DTM",
        accepts=frozenset({"helpers"}),
        refusal="the DTM run has one service and its helpers (the branch): leave those out",
        check_spec=_dtm,
    )
)


def _service(spec: ScenarioSpec) -> None:
    """Refuse a service scenario's crash the service cannot reach (its protocols) or a worker name."""
    service = spec.service
    if service is None:
        raise ConfigError(f"{spec.label} names no service", hint="build it with ScenarioSpec.for_service(service, ...)")
    reachable = service.points()
    for crash in spec.crashes:
        if not service.relays:
            raise ConfigError(
                f"service {service.name} has relays=False but {spec.label} arms a trap at {crash.point}",
                hint="a trap fires in a relay: leave relays=True (the default) or drop the crashes",
            )
        if crash.point not in reachable:
            speaks = ", ".join(sorted(service.protocols())) or "no trapped protocol"
            raise ConfigError(
                f"trap point {crash.point!r} is not on a connection of service {service.name} (it speaks {speaks})",
                hint=f"use one of {', '.join(reachable)}, or give the service the placeholder of that protocol",
            )
        if crash.worker is not None:
            raise ConfigError(
                f"service crash at {crash.point} names worker {crash.worker!r}",
                hint="leave worker out: a trap fires on whichever instance reaches it",
            )


for _transport in ("activemq", "kafka"):
    register(
        Flow(
            f"service_{_transport}",
            _transport,
            f"harness.run.service_session:{'ActiveMQ' if _transport == 'activemq' else 'Kafka'}ServiceSession",
            f"a team's own service (any language) on {_transport}, crashed by wire-level traps",
            points=tuple(TRAP_POINTS),
            actions=SERVICE_ACTIONS,
            # Poison operations reach the service through its body template's {poison}.
            accepts=frozenset({"poison"}),
            refusal="a service scenario runs the service's own instances: leave those out",
            check_spec=_service,
        )
    )
