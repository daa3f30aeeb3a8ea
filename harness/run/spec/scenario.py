"""Scenario specs: frozen, validated before any service starts."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field, fields, is_dataclass, replace
from typing import TypeVar

from harness.errors import ConfigError
from harness.protocols import PROTOCOLS
from harness.run.spec.checks import (
    check_handler,
    check_identifier,
    check_int,
    check_items,
    check_name,
    check_options,
    check_seconds,
)
from harness.run.spec.flow import Flow, flow_named
from harness.run.spec.schema import Schema
from harness.run.spec.service import Service
from harness.verify.model import ANOMALY_CLASSES, FlowContract


@dataclass(frozen=True)
class Crash:
    """Crash the worker at ``point`` while it processes operation number ``op_index`` (0-based).

    ``op_index=None`` with ``nth`` means the nth time any worker reaches the point. ``action``
    is ``kill`` (SIGKILL) or a forced redelivery: ``nack``, ``abort_unsubscribe``, ``disconnect``.
    ``worker`` limits the arm to one worker (e.g. ``relay``); None means any.
    """

    point: str
    op_index: int | None = None
    nth: int | None = None
    action: str = "kill"
    worker: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.point, str) or not self.point:
            raise ConfigError(
                f"crash point {self.point!r} is not a name", hint="name a crash point, e.g. 'after_db_commit'"
            )
        if self.op_index is not None:
            check_int("crash op_index", self.op_index, 0, 999_999)
        if self.nth is not None:
            if isinstance(self.nth, int) and not isinstance(self.nth, bool) and self.nth < 1:
                raise ConfigError(
                    f"crash nth={self.nth} is not a count", hint="nth counts from 1: nth=1 is the 1st hit"
                )
            check_int("crash nth", self.nth, 1, 1_000_000)
        if not isinstance(self.action, str):
            raise ConfigError(f"crash action {self.action!r} is not a name", hint="use 'kill' or a redelivery name")
        if self.worker is not None and not isinstance(self.worker, str):
            raise ConfigError(f"crash worker {self.worker!r} is not a name", hint="name the worker, e.g. 'relay'")

    def describe(self, ops: list[str]) -> str:
        on = f"op {ops[self.op_index]}" if self.op_index is not None else f"hit #{self.nth}"
        return f"arm {self.action} at {self.point} on {on}"


NETWORK_TARGETS = tuple(p.proxy for p in PROTOCOLS)


@dataclass(frozen=True)
class FaultWindow:
    """Apply ``fault`` once ``after_ops`` operations are submitted; heal it ``hold_s`` later (after
    the submissions it carries, when it carries them: below).

    ``fault`` is a fault spec from ``harness.faults``: a toxic (``Latency(150)``, ``ResetPeer()``
    ...) or ``Partition()`` on the proxy ``target``, or ``KillBroker("activemq")`` (no target:
    the broker is killed with -9 and restarted on its data when the window heals). The flow keeps
    running under the fault. Where the submissions can pass it (a fault that only slows:
    ``Latency``, ``Bandwidth``, ``Slicer``, ``SlowClose``; or one on a proxy they do not pass, such
    as Postgres under an ActiveMQ flow) they go on up to the next window's ``after_ops`` (or the
    last), so operations are in flight while it is open; where it cuts their way (the broker's
    proxy reset or partitioned, the broker killed), they wait until it is healed.
    """

    fault: object
    after_ops: int = 0
    hold_s: float = 1.0
    target: str | None = None

    def __post_init__(self) -> None:
        if not hasattr(self.fault, "on"):
            raise ConfigError(
                f"fault {self.fault!r} is not a fault spec",
                hint="use Latency(...), ResetPeer(), Partition(), KillBroker(...) from harness.faults",
            )
        check_seconds("fault hold_s", self.hold_s, 0, 120, above_low=True)
        check_int("fault after_ops", self.after_ops, 0, 1_000_000)
        is_broker = type(self.fault).__name__ == "KillBroker"
        if not is_broker and self.target not in NETWORK_TARGETS:
            raise ConfigError(
                f"network fault target {self.target!r} is not a proxy",
                hint=f"target one of {', '.join(NETWORK_TARGETS)}",
            )

    def describe(self) -> str:
        on = f" on {self.target}" if self.target else ""
        return f"{self.fault!r}{on} after {self.after_ops} ops for {self.hold_s}s"


@dataclass(frozen=True)
class Stage:
    """A further stage of the flow: consumes the previous stage's output queue."""

    name: str
    handler: str
    workers: int = 1
    options: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("stage name", self.name)
        check_handler(self.handler)
        check_int(f"stage {self.name} workers", self.workers, 1, 16)
        check_options(f"stage {self.name} options", self.options)


@dataclass(frozen=True)
class Helper:
    """A helper process of the pattern (``module:main`` taking a ProcessContext): a relay, a service.

    With ``port=True`` the run gives it a free loopback port (``options["port"]``, kept across
    restarts) and tells every stage its address as ``options["<name>_url"]``.
    """

    name: str
    handler: str
    port: bool = False
    options: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("helper name", self.name)
        check_handler(self.handler)
        if not isinstance(self.port, bool):
            raise ConfigError(f"helper {self.name} port={self.port!r} is not True/False", hint="write port=True")
        check_options(f"helper {self.name} options", self.options)


# The stand-in for an omitted ``flow=``: the registered "activemq" flow once the spec is built. A
# spec tells it from a flow given (deprecated ``broker=`` may then name one) by identity.
_DEFAULT_FLOW = Flow("activemq", "activemq", "the default flow (resolved when the spec is built)")
T = TypeVar("T")


@dataclass(frozen=True)
class ScenarioSpec:
    """One seed pattern under one set of faults, with the verdict it must produce.

    >>> ScenarioSpec(name="onepc", variant="naive", handler="harness.patterns.onepc:naive",
    ...              schema="onepc", effect_table="onepc_effects",
    ...              crashes=(Crash("after_db_commit", op_index=3),), expect=frozenset({"duplicate-effect"}))
    """

    name: str
    variant: str
    handler: str
    # The DDL of the tables the handlers write: a built-in name ("onepc"), a path of yours ending in
    # ".sql" (resolved against the working directory now), or a Schema (Schema.sql("CREATE ..."), ...).
    schema: str | Schema
    effect_table: str
    effect_column: str = "op_id"
    messages: int = 20
    workers: int = 1
    crashes: tuple[Crash, ...] = ()
    seed: int = 0
    timeout_s: float = 60.0
    settle_s: float = 0.5
    options: dict[str, object] = field(default_factory=dict)
    contract: FlowContract = field(default_factory=FlowContract)
    expect: frozenset[str] = frozenset()
    description: str = ""
    # Further stages after the first (each consumes the previous output) and helper processes.
    chain: tuple[Stage, ...] = ()
    helpers: tuple[Helper, ...] = ()
    # Operation numbers whose message is a poison message (body ``"poison": true``).
    poison: frozenset[int] = frozenset()
    # A transactional outbox (op_id, sent_at): rows never relayed are recorded as residue.
    outbox_table: str | None = None
    # Faults applied while the flow runs, in order of after_ops.
    faults: tuple[FaultWindow, ...] = ()
    # Pattern-specific crash points the handlers mark (``ctx.crash_point(name)``), besides the flow's.
    points: tuple[str, ...] = ()
    # The registered flow that runs the spec (harness.run.spec.flow), given as a Flow or its name:
    # "activemq" (a chain of queue stages), "kafka" (a consumer group; options include
    # KafkaStageOptions), "kafka_saga" (options include SagaOptions; a crash names its process in
    # ``worker``), "kafka_cqrs" (entity events into a replica) or "dtm" (a 2-phase message
    # transfer; its crash points are only ``points``). Always the registered Flow once built.
    flow: Flow = _DEFAULT_FLOW
    # A team's own service under test (``ScenarioSpec.for_service``): its flow is ``service_<transport>``.
    service: Service | None = None
    # Deprecated: the flow's name under its old field name; ``flow=`` says it. Not a field: a spec
    # never stores it (``spec.broker`` reads the InitVar's class default None; read ``spec.flow.name``).
    broker: InitVar[str | None] = None
    # The flow's typed options, parsed from ``options`` once, when the spec is built (``Flow.parse``).
    settings: object = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self, broker: str | None) -> None:
        check_name("scenario name", self.name)
        check_name("scenario variant", self.variant)
        if broker is not None:
            if self.flow is not _DEFAULT_FLOW:
                raise ConfigError(
                    f"{self.label} names its flow twice: flow={getattr(self.flow, 'name', self.flow)!r}, "
                    f"broker={broker!r}",
                    hint=f"drop broker= (the old name of flow=) and write flow={broker!r}",
                )
            warnings.warn(f"ScenarioSpec(broker=...) is deprecated: write flow={broker!r}", DeprecationWarning, 3)
            object.__setattr__(self, "flow", broker)
        # A name (``flow="kafka"``) or a Flow equal to a registered one becomes the registered Flow.
        given = self.flow
        object.__setattr__(self, "flow", flow_named(given.name if isinstance(given, Flow) else given))
        if isinstance(given, Flow) and given is not _DEFAULT_FLOW and given != self.flow:
            raise ConfigError(
                f"flow {given.name!r} is not the registered flow of that name",
                hint="register(Flow(...)) it in harness.run.spec.flow, or pass its name",
            )
        if self.service is None:
            check_handler(self.handler)
        elif not isinstance(self.service, Service):
            raise ConfigError(f"service {self.service!r} is not a Service", hint="pass service=Service(...)")
        elif self.handler or self.flow.name != f"service_{self.service.transport}":
            raise ConfigError(
                f"{self.label} runs service {self.service.name} with handler={self.handler!r}, flow={self.flow.name!r}",
                hint="build a service scenario with ScenarioSpec.for_service(service, ...)",
            )
        self._check_types()
        names = ["worker", *(s.name for s in self.chain), *(h.name for h in self.helpers)]
        if len(set(names)) != len(names):
            raise ConfigError(f"stage and helper names repeat: {names}", hint="give each stage and helper its own name")
        for window in self.faults:
            if not 0 <= window.after_ops <= self.messages:
                raise ConfigError(
                    f"fault after_ops={window.after_ops} but the scenario sends {self.messages} messages",
                    hint=f"choose after_ops from 0 to {self.messages}",
                )
        bad = sorted(i for i in self.poison if not 0 <= i < self.messages)
        if bad:
            raise ConfigError(
                f"poison operation number(s) {bad} but the scenario sends {self.messages} messages",
                hint=f"choose poison numbers from 0 to {self.messages - 1}",
            )
        object.__setattr__(self, "settings", self.flow.parse(self.options))
        self.flow.check(self)  # its fields, crash points and actions, and its own check
        for crash in self.crashes:
            if crash.op_index is None and crash.nth is None:
                raise ConfigError(
                    f"crash at {crash.point} names no message",
                    hint="give op_index (which operation) or nth (which hit of the point)",
                )
            if crash.op_index is not None and not 0 <= crash.op_index < self.messages:
                raise ConfigError(
                    f"crash op_index={crash.op_index} but the scenario sends {self.messages} messages",
                    hint=f"choose an op_index from 0 to {self.messages - 1}",
                )
        unknown = self.expect - set(ANOMALY_CLASSES)
        if unknown:
            raise ConfigError(
                f"unknown anomaly class(es) {sorted(unknown)} in expect",
                hint=f"use classes from {', '.join(ANOMALY_CLASSES)}",
            )

    def _check_types(self) -> None:
        """Check every field's type and range, and normalise the collections and the schema."""
        check_int("messages", self.messages, 1, 1_000_000)
        check_int("workers", self.workers, 1, 16)
        check_int("seed", self.seed, -(2**63), 2**63 - 1)
        check_seconds("timeout_s", self.timeout_s, 0, 86_400, above_low=True)
        check_seconds("settle_s", self.settle_s, 0, 600)
        check_identifier("effect_table", self.effect_table)
        check_identifier("effect_column", self.effect_column)
        if self.outbox_table is not None:
            check_identifier("outbox_table", self.outbox_table)
        check_options("options", self.options)
        check_items("crashes", self.crashes, Crash, 'Crash("after_db_commit", op_index=3)')
        check_items("faults", self.faults, FaultWindow, 'FaultWindow(Latency(100), target="postgres")')
        check_items("chain", self.chain, Stage, 'Stage("ship", "mypkg.stages:ship")')
        check_items("helpers", self.helpers, Helper, 'Helper("relay", "mypkg.relay:main")')
        check_items("points", self.points, str, '"after_reserve"')
        check_items("expect", self.expect, str, '"duplicate-effect"')
        check_items("poison", self.poison, int, "3")
        if not isinstance(self.contract, FlowContract):
            raise ConfigError(f"contract {self.contract!r} is not a FlowContract", hint="pass FlowContract(...)")
        if not isinstance(self.description, str):
            raise ConfigError(f"description {self.description!r} is not text", hint="write it as a string")
        # A list or set where a tuple/frozenset is declared would make the frozen spec mutable.
        for name, kind in (
            ("crashes", tuple),
            ("faults", tuple),
            ("chain", tuple),
            ("helpers", tuple),
            ("points", tuple),
            ("expect", frozenset),
            ("poison", frozenset),
        ):
            object.__setattr__(self, name, kind(getattr(self, name)))
        requires = [("effect_table", self.effect_table, self.effect_column)]
        if self.outbox_table is not None:
            requires += [("outbox_table", self.outbox_table, "op_id"), ("outbox_table", self.outbox_table, "sent_at")]
        object.__setattr__(self, "schema", Schema.of(self.schema).requiring(*requires))

    @classmethod
    def for_service(
        cls, service: Service, *, variant: str, schema: str | Schema, effect_table: str, **fields: object
    ) -> ScenarioSpec:
        """Return the scenario of a team's own ``service`` (its name is the service's unless given).

        >>> ScenarioSpec.for_service(svc, variant="naive", schema="services/orders/schema.sql",
        ...     effect_table="orders_effects", crashes=(Crash("pg_after_commit", op_index=3),),
        ...     expect=frozenset({"duplicate-effect"}))
        """
        if not isinstance(service, Service):
            raise ConfigError(f"service {service!r} is not a Service", hint="pass harness.Service(...)")
        fields.setdefault("name", service.name)
        return cls(
            variant=variant,
            handler="",
            schema=schema,
            effect_table=effect_table,
            flow=flow_named(f"service_{service.transport}"),
            service=service,
            **fields,  # type: ignore[arg-type]
        )

    @property
    def label(self) -> str:
        return f"{self.name}:{self.variant}"

    def with_options(self, overrides: Mapping[str, object]) -> ScenarioSpec:
        """Return this spec with some ``options`` changed (a soak's batch size, a topic's partitions).

        A key must be one the spec already sets or one of its flow's typed options: a misspelt key
        would otherwise reach no one and change nothing. The new spec is validated as any other.

        >>> spec.with_options({"batch_size": 500, "partitions": 3}).settings_as(KafkaStageOptions).batch_size
        500
        """
        typed = {f.name for f in fields(self.settings)} if is_dataclass(self.settings) else set()
        known = set(self.options) | typed
        for key in overrides:
            if key not in known:
                raise ConfigError(
                    f"option {key!r} is not one {self.label} takes",
                    hint=f"use one of {', '.join(sorted(known)) or '(none: this flow takes no options)'}",
                )
        return replace(self, options={**self.options, **overrides})

    def settings_as(self, kind: type[T]) -> T:
        """Return the flow's typed options (``settings``), checked to be a ``kind``.

        >>> spec.settings_as(KafkaStageOptions).batch_size
        50
        """
        if not isinstance(self.settings, kind):
            raise TypeError(
                f"{self.label}: flow {self.flow.name} parses its options into {self.settings!r}, not {kind}"
            )
        return self.settings
