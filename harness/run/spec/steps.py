"""Steps as data: the small vocabulary every driver of a run speaks.

A run is driven by steps: ``Start`` the flow's processes, ``Submit`` operations, ``Arm`` a crash
point or wire trap, ``Open`` a fault (kept until ``Heal``) or ``Hold`` one for a while, ``Wait``
while the flow runs, ``Kill`` an instance or ``Freeze`` it until healed, ``Thaw`` frozen ones,
wait until the flow is ``Idle``.
``RunSession.apply`` applies one; ``drive`` turns a spec into them, the state machines emit them,
and a soak's fault schedule is a generator of them. Each applied step is a line of the run folder's ``steps.jsonl``
(``to_record``), from which ``harness.run.core.replay`` runs the same steps again, no Hypothesis
needed.

>>> steps = [Start(), Arm(Crash("after_db_commit"), at=2), Submit(3), Hold(Latency(150), "postgres", 1.0)]
>>> [from_record(to_record(s)) for s in steps] == steps
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from harness import faults
from harness.errors import ConfigError
from harness.run.spec.checks import check_int, check_seconds
from harness.run.spec.scenario import NETWORK_TARGETS, Crash


@dataclass(frozen=True)
class Start:
    """Start the flow's processes (workers or a service's instances); a second start does nothing."""


@dataclass(frozen=True)
class Submit:
    """Submit ``count`` operations; ``extra`` goes to the flow's ``submit`` (a saga's ``refuse``, a DTM ``hold_s``)."""

    count: int = 1
    poison: bool = False
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_int("submit count", self.count, 1, 1_000_000)
        if not isinstance(self.poison, bool):
            raise ConfigError(f"submit poison={self.poison!r}", hint="write poison=True or leave it out")
        object.__setattr__(self, "extra", tuple(sorted(dict(self.extra).items())))


@dataclass(frozen=True)
class Arm:
    """Arm ``crash``: on operation number ``at``, or on the operation id ``op`` (a saga's ``<op>.pay``),
    else on the crash's own ``op_index`` or ``nth`` hit."""

    crash: Crash
    at: int | None = None
    op: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.crash, Crash):
            raise ConfigError(f"arm {self.crash!r} is not a Crash", hint='write Arm(Crash("after_db_commit"), at=3)')
        if self.at is not None:
            check_int("arm at", self.at, 0, 1_000_000)
        if self.op is not None and (not isinstance(self.op, str) or not self.op or self.at is not None):
            raise ConfigError(
                f"arm op={self.op!r}, at={self.at!r}", hint="give at= (a number) or op= (an id), not both"
            )


def _check_fault(fault: object, target: str | None) -> None:
    if not dataclasses.is_dataclass(fault) or type(fault).__name__ not in faults.__all__:
        raise ConfigError(
            f"fault {fault!r} is not a fault spec", hint="use Latency(...), ResetPeer(), Partition(), KillBroker(...)"
        )
    if not isinstance(fault, faults.KillBroker) and target not in NETWORK_TARGETS:
        raise ConfigError(f"network fault target {target!r} is not a proxy", hint=f"target one of {NETWORK_TARGETS}")


@dataclass(frozen=True)
class Open:
    """Apply ``fault`` (on the proxy ``target``; none for a broker kill) until the next ``Heal``."""

    fault: object
    target: str | None = None

    def __post_init__(self) -> None:
        _check_fault(self.fault, self.target)


@dataclass(frozen=True)
class Hold:
    """Apply ``fault``, let the flow run under it for ``hold_s``, then heal it."""

    fault: object
    target: str | None = None
    hold_s: float = 1.0

    def __post_init__(self) -> None:
        _check_fault(self.fault, self.target)
        check_seconds("hold_s", self.hold_s, 0, 600)


@dataclass(frozen=True)
class Wait:
    """Let the flow run for ``seconds`` (under whatever ``Open`` applied), then go on."""

    seconds: float = 1.0

    def __post_init__(self) -> None:
        check_seconds("wait seconds", self.seconds, 0, 600)


@dataclass(frozen=True)
class Heal:
    """Heal every fault ``Open`` applied, in reverse order."""


@dataclass(frozen=True)
class Kill:
    """SIGKILL instance ``instance`` of the flow's processes wherever it is; it is started again."""

    instance: int = 0

    def __post_init__(self) -> None:
        check_int("kill instance", self.instance, 0, 64)


@dataclass(frozen=True)
class Freeze:
    """SIGSTOP instance ``instance`` of the flow's processes until the next ``Heal`` (a fault window).

    A frozen consumer keeps its messages and its database transaction open; the broker drops it
    once its heart-beats stop and gives its messages to another instance.
    """

    instance: int = 0

    def __post_init__(self) -> None:
        check_int("freeze instance", self.instance, 0, 64)


@dataclass(frozen=True)
class Thaw:
    """Continue every frozen instance (a trap's ``freeze``); nothing when none is frozen."""


@dataclass(frozen=True)
class Idle:
    """Wait until the operations submitted so far are done (the flow's own idea of done)."""


Step = Start | Submit | Arm | Open | Hold | Wait | Heal | Kill | Freeze | Thaw | Idle
VOCABULARY: dict[str, type[Step]] = {
    "start": Start,
    "submit": Submit,
    "arm": Arm,
    "open": Open,
    "hold": Hold,
    "wait": Wait,
    "heal": Heal,
    "kill": Kill,
    "freeze": Freeze,
    "thaw": Thaw,
    "idle": Idle,
}
_NAMES = {kind: name for name, kind in VOCABULARY.items()}


def to_record(step: Step) -> dict[str, Any]:
    """Return ``step`` as one JSON-ready line: ``{"step": "arm", "crash": {...}, "at": 3}``."""
    record: dict[str, Any] = {"step": _NAMES[type(step)]}
    for f in dataclasses.fields(step):
        value = getattr(step, f.name)
        if f.name == "fault":
            value = {"kind": type(value).__name__, **dataclasses.asdict(value)}
        elif f.name == "crash":
            value = dataclasses.asdict(value)
        elif f.name == "extra":
            value = dict(value)
        record[f.name] = value
    return record


def from_record(record: dict[str, Any]) -> Step:
    """Return the step a ``to_record`` line describes (a ConfigError names a line it cannot read)."""
    fields = dict(record)
    name = fields.pop("step", None)
    kind = VOCABULARY.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError(f"step {record!r} is not one of {', '.join(VOCABULARY)}", hint="write steps with to_record")
    try:
        if "fault" in fields:
            spec = dict(fields["fault"])
            fault_kind = spec.pop("kind")
            if fault_kind not in faults.__all__:
                raise ConfigError(f"step {record!r} names fault {fault_kind!r}", hint="a fault of harness.faults")
            fields["fault"] = getattr(faults, fault_kind)(**spec)
        if "crash" in fields:
            fields["crash"] = Crash(**fields["crash"])
        if "extra" in fields:
            fields["extra"] = tuple(dict(fields["extra"]).items())
        step: Step = kind(**fields)
    except (TypeError, KeyError) as exc:
        raise ConfigError(f"step {record!r} does not read: {exc}", hint="write steps with to_record") from exc
    return step


def describe(step: Step) -> str:
    """Return ``step`` as a short line for people: ``arm kill at after_db_commit on op #3``."""
    match step:
        case Submit(count=count, poison=poison, extra=extra):
            more = "".join(f", {k}={v!r}" for k, v in extra)
            return f"submit {count}{' poison' if poison else ''}{more}"
        case Arm(crash=crash, at=at, op=op):
            number = at if at is not None else crash.op_index
            on = f"op {op}" if op else f"op #{number}" if number is not None else f"hit #{crash.nth}"
            return f"arm {crash.action} at {crash.point} on {on}{f' in {crash.worker}' if crash.worker else ''}"
        case Open(fault=fault, target=target):
            return f"open {fault!r}{f' on {target}' if target else ''}"
        case Hold(fault=fault, target=target, hold_s=hold_s):
            return f"hold {fault!r}{f' on {target}' if target else ''} for {hold_s}s"
        case Wait(seconds=seconds):
            return f"wait {seconds}s"
        case Kill(instance=instance):
            return f"kill instance {instance}"
        case Freeze(instance=instance):
            return f"freeze instance {instance}"
        case _:
            return _NAMES[type(step)]
