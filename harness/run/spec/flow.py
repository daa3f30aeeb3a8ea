"""What a flow is: ``Flow``, the one registration of everything a run of it needs, and the registry.

A ``Flow`` names its transport, the crash points and actions its runtime knows, the optional
spec fields it accepts, how its ``options`` are parsed (``parse``: once, when a spec is built,
into the typed settings its parts read as ``spec.settings``), any further check of a spec, and
the parts the one session (``harness.run.core.session.RunSession``) runs it with: its topology,
processes, workload, quiescence and books (``harness.run.core.roles``). Each flow registers
itself in its own module under ``harness.run.flows``; importing ``harness.run`` registers them
all. ``ScenarioSpec`` validates itself against its flow before any service starts.

The registry sits below the session and the parts (they import it, it imports none of them): a
flow hands its parts in as values, so nothing here names a class as a string or imports upward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.errors import ConfigError

# Optional spec fields; a flow lists those it accepts (``workers`` means more than one).
OPTIONAL_FIELDS = ("chain", "helpers", "outbox_table", "poison", "workers")


def no_settings(options: dict[str, Any]) -> None:
    """A flow without typed options: its ``options`` go to the handlers as they are."""
    return None


@dataclass(frozen=True)
class Parts:
    """The parts the one session runs a flow with (``harness.run.core.roles``), as values.

    The topology is built from the session, the others from the session and the topology;
    ``books`` returns the books in the order they close; ``processes`` is None for txchaos's own
    workers. A flow that differs from another in one part is that flow's parts with it replaced:

    >>> CQRS_PARTS = replace(TOPIC_PARTS, workload=EntityEvents, books=journal_books)
    """

    topology: Callable[..., Any]
    workload: Callable[..., Any]
    quiescence: Callable[..., Any]
    books: Callable[..., Any]
    processes: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Flow:
    """One registered flow: a topology on a transport, run by one session class.

    >>> register(Flow("kafka", "kafka", "one consumer-group stage on topics", parts=TOPIC_PARTS,
    ...               points=KAFKA_POINTS, parse=KafkaStageOptions.from_options))
    """

    name: str
    transport: str
    summary: str
    # None only for the stand-in ``ScenarioSpec`` uses for an omitted ``flow=``.
    parts: Parts | None = field(default=None, compare=False, repr=False)
    points: tuple[str, ...] = ()
    actions: tuple[str, ...] = ("kill",)
    accepts: frozenset[str] = frozenset()
    refusal: str = ""  # the hint when a spec uses a field this flow does not accept
    # Parses ``spec.options`` into the flow's typed settings (raises ConfigError): run once per spec.
    parse: Callable[[dict[str, Any]], object] = field(default=no_settings, compare=False, repr=False)
    check_spec: Callable[[Any], None] | None = field(default=None, compare=False, repr=False)
    label: str = ""  # how a refusal names a scenario of the flow ("a stage scenario with ...")
    # whether its workload counts the operations out while it runs: a soak's closed loop needs it
    # (a DTM transfer's end is known only to the books at the close)
    counts_out: bool = True

    def __post_init__(self) -> None:
        if not self.accepts <= set(OPTIONAL_FIELDS):
            raise ValueError(f"flow {self.name} accepts unknown fields {sorted(self.accepts - set(OPTIONAL_FIELDS))}")
        if not self.label:
            object.__setattr__(self, "label", self.name)

    def check(self, spec: Any) -> None:
        """Refuse what ``spec`` says that this flow cannot run (fields, crashes, then the flow's own check)."""
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


FLOWS: dict[str, Flow] = {}


def register(flow: Flow) -> Flow:
    """Register ``flow`` under its name (a name registered twice is a programming error)."""
    if flow.name in FLOWS:
        raise ValueError(f"flow {flow.name!r} is registered twice")
    if flow.parts is None:
        raise ValueError(f"flow {flow.name!r} names no parts")
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
