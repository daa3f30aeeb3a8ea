"""A soak's nemesis: a seeded fault schedule, as data, built from the run layer's steps.

A schedule is a list of ``Timed`` entries, each a step (``harness.run.spec.steps``) due at a
second of the run: ``Open`` a fault and, ``hold_s`` later, ``Heal`` it; ``Kill`` a worker or a
service instance; ``Arm`` a crash point on an operation a few ahead of the last one submitted
(``ArmAhead``: which number that is depends on how far the run got, so it is resolved when it is
due and the resolved ``Arm`` is what ``steps.jsonl`` records). A window is opened, held and
healed, then the nemesis rests (the stagger); some windows open a second fault halfway (a
compound window: a broker reset while Postgres is slow is how a redelivery reaches a second
worker while the first is still in its transaction), and ``Heal`` heals both. The driver
heals whatever is open at the end (the final heal) and lets the flow quiesce before the books
close.

The same ``(kinds, seed, length)`` always gives the same schedule (``plan``), and the schedule
is written to the run folder as ``nemesis.json`` (``to_records``), from which it reads back.

>>> schedule = plan(("latency", "kill"), seed=3, length_s=60, targets=("activemq_stomp", "postgres"))
>>> [t.at_s for t in schedule.entries][:2]
[3.0, 6.3]
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.faults import KillBroker, Latency, Partition, ResetPeer, Timeout
from harness.run.spec.checks import check_int, check_seconds
from harness.run.spec.scenario import Crash
from harness.run.spec.steps import Arm, Freeze, Heal, Kill, Open, Step, Thaw, from_record, to_record

# What a schedule can draw from. "broker" kill -9s the flow's broker and restarts it on heal,
# "postgres" the database; "crash" arms a crash point of the flow on an operation soon to come;
# "pause" stops one worker (SIGSTOP) at whatever it is doing for the window; "freeze" arms a worker
# to stop itself at a point inside its transaction (``before_db_commit``) on an operation soon to
# come, and thaws it after the window: its transaction stays open while the broker, its
# heart-beats gone, hands its message to another worker.
KINDS = ("latency", "reset", "partition", "timeout", "kill", "pause", "freeze", "crash", "broker", "postgres")
# The default mix: every kind but the timeout (a partition's slower cousin). In a mix, a broker or
# database restart (seconds of downtime, and on Kafka a group that settles after it) comes at
# most once per ``Pace.restart_every_s``; named alone, restarts come at the schedule's pace.
DEFAULT = ("latency", "reset", "partition", "kill", "pause", "freeze", "crash", "broker", "postgres")
RESTARTS = ("broker", "postgres")
ARMED = ("crash", "freeze")  # kinds that arm a crash point of the flow: none without one
FREEZE_POINTS = ("before_db_commit",)  # inside the transaction, its outputs sent in it
PAUSE_MIN_S = 3.5  # a paused consumer is dropped by the broker once its heart-beats (1 s) stop
NETWORK = ("latency", "reset", "partition", "timeout")
PG = "postgres"  # the service a "postgres" window restarts
SCHEDULE_FILE = "nemesis.json"
_NETWORK_KIND: dict[type, str] = {Latency: "latency", ResetPeer: "reset", Partition: "partition", Timeout: "timeout"}


@dataclass(frozen=True)
class ArmAhead:
    """Arm ``crash`` on the operation ``ahead`` numbers after the last one submitted when it is due."""

    crash: Crash
    ahead: int = 5

    def __post_init__(self) -> None:
        check_int("arm ahead", self.ahead, 0, 100_000)

    def resolve(self, submitted: int) -> Arm:
        return Arm(self.crash, at=submitted + self.ahead)


@dataclass(frozen=True)
class Timed:
    """``step`` due ``at_s`` seconds after the run's first submission."""

    at_s: float
    step: Step | ArmAhead

    def __post_init__(self) -> None:
        check_seconds("nemesis at_s", self.at_s, 0, 7 * 24 * 3600)


@dataclass(frozen=True)
class Schedule:
    """The nemesis of one soak: what it draws from (``kinds``), its seed and its timed steps."""

    kinds: tuple[str, ...]
    seed: int
    entries: tuple[Timed, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda t: t.at_s)))

    @property
    def windows(self) -> int:
        """How many fault windows it opens (each a window in the ledger; a freeze at a crash point is an arm)."""
        return sum(isinstance(t.step, Open | Freeze) for t in self.entries)

    def to_records(self) -> dict[str, Any]:
        def entry(t: Timed) -> dict[str, Any]:
            if isinstance(t.step, ArmAhead):
                return {"at_s": t.at_s, "arm_ahead": to_record(Arm(t.step.crash, at=0)), "ahead": t.step.ahead}
            return {"at_s": t.at_s, **to_record(t.step)}

        return {"kinds": list(self.kinds), "seed": self.seed, "entries": [entry(t) for t in self.entries]}

    @classmethod
    def from_records(cls, raw: dict[str, Any]) -> Schedule:
        try:
            entries = []
            for item in raw["entries"]:
                fields = dict(item)
                at_s = float(fields.pop("at_s"))
                if "arm_ahead" in fields:
                    arm = from_record(fields["arm_ahead"])
                    assert isinstance(arm, Arm)
                    entries.append(Timed(at_s, ArmAhead(arm.crash, int(fields["ahead"]))))
                else:
                    entries.append(Timed(at_s, from_record(fields)))
            return cls(tuple(raw["kinds"]), int(raw["seed"]), tuple(entries))
        except (KeyError, TypeError, ValueError, AssertionError) as exc:
            raise ConfigError(
                f"nemesis schedule does not read: {exc}", hint=f"pass a {SCHEDULE_FILE} a soak wrote"
            ) from exc

    def write(self, folder: Path) -> Path:
        path = folder / SCHEDULE_FILE
        path.write_text(json.dumps(self.to_records(), indent=1, default=str))
        return path


NONE = Schedule((), 0, ())


def parse_kinds(text: str) -> tuple[str, ...]:
    """Return the kinds ``--nemesis`` names: ``default``, ``none`` or a comma list of ``KINDS``."""
    if text == "default":
        return DEFAULT
    if text == "none":
        return ()
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ConfigError(
            f"--nemesis {text!r}: "
            + (f"no fault kind named {', '.join(map(repr, unknown))}" if unknown else "names no fault kind"),
            hint=f"write default, none, a {SCHEDULE_FILE} a soak wrote, or a comma list of: {', '.join(KINDS)}",
        )
    return kinds


@dataclass(frozen=True)
class Pace:
    """How the nemesis spaces its windows: rest ``rest_s`` ± 50 %, then hold a fault ``hold_s`` ± 50 %."""

    rest_s: float = 4.0
    hold_s: float = 3.0
    first_s: float = 3.0  # nothing before: the flow warms up clean
    compound: float = 0.4  # the share of network windows that open a second network fault halfway
    restart_every_s: float = 120.0  # in a mix, at most one broker or database restart this often

    def __post_init__(self) -> None:
        if not isinstance(self.compound, int | float) or not 0 <= self.compound <= 1:
            raise ConfigError(f"nemesis compound={self.compound!r}", hint="a share from 0 to 1")
        check_seconds("nemesis restart_every_s", self.restart_every_s, 0, 24 * 3600)
        check_seconds("nemesis rest_s", self.rest_s, 0.1, 3600)
        check_seconds("nemesis hold_s", self.hold_s, 0.1, 3600)
        check_seconds("nemesis first_s", self.first_s, 0, 3600)


def plan(
    kinds: tuple[str, ...],
    *,
    seed: int,
    length_s: float,
    targets: tuple[str, ...],
    broker: str = "activemq",
    instances: int = 1,
    points: tuple[str, ...] = (),
    pace: Pace = Pace(),
) -> Schedule:
    """Draw a schedule over ``length_s`` seconds from ``kinds`` with ``seed``.

    Kinds are drawn in rounds, as from a shuffled deck: every kind the flow can take comes once
    before any comes twice (a restart waits out ``pace.restart_every_s`` in a mix, and the rest go
    round meanwhile), so a short soak tests as many kinds as its windows allow, not a random few.

    ``targets``: the proxies network faults may open on (the flow's broker and Postgres);
    ``broker``: the service a "broker" kill restarts; ``instances``: the processes a "kill" may
    pick; ``points``: the crash points a "crash" or "freeze" may arm (none: both are skipped).
    """
    check_seconds("soak length_s", length_s, 0, 7 * 24 * 3600)
    rng = random.Random(seed)
    usable = [k for k in kinds if k not in ARMED or points]
    inside = [p for p in points if p in FREEZE_POINTS] or list(points)
    calm = [k for k in usable if k not in RESTARTS]  # what a restart too soon after the last is redrawn from
    entries: list[Timed] = []
    t = pace.first_s
    last_restart = -pace.restart_every_s
    deck = list(usable)  # the kinds not drawn yet this round: each kind comes once before any comes twice
    while usable and t < length_s:
        kind = rng.choice(usable)
        if kind not in deck:
            kind = rng.choice(deck)
        if kind in RESTARTS and calm and t - last_restart < pace.restart_every_s:
            waiting = [k for k in deck if k in calm]
            if not waiting:  # only restarts are left this round, and none may come yet: a new round of the rest
                deck += calm
                waiting = calm
            kind = rng.choice(waiting)
        elif kind in RESTARTS:
            last_restart = t
        deck.remove(kind)
        deck = deck or list(usable)
        hold = round(pace.hold_s * rng.uniform(0.5, 1.5), 1)
        at = round(t, 1)
        if kind == "kill":
            entries.append(Timed(at, Kill(rng.randrange(instances))))
        elif kind == "freeze":
            hold = max(hold, PAUSE_MIN_S)
            crash = Crash(rng.choice(inside), action="freeze")
            entries.append(Timed(at, ArmAhead(crash, ahead=rng.randrange(1, 20))))
            entries.append(Timed(round(at + hold, 1), Thaw()))
            t += hold
        elif kind == "pause":
            hold = max(hold, PAUSE_MIN_S)
            entries.append(Timed(at, Freeze(rng.randrange(instances))))
            entries.append(Timed(round(at + hold, 1), Heal()))
            t += hold
        elif kind == "crash":
            entries.append(Timed(at, ArmAhead(Crash(rng.choice(points)), ahead=rng.randrange(1, 20))))
        else:
            entries.append(Timed(at, Open(*_fault(kind, rng, targets, broker))))
            network = [k for k in usable if k in NETWORK and k != kind]
            if kind in NETWORK and network and rng.random() < pace.compound:
                entries.append(Timed(round(at + hold / 2, 1), Open(*_fault(rng.choice(network), rng, targets, broker))))
            entries.append(Timed(round(at + hold, 1), Heal()))
            t += hold
        t += pace.rest_s * rng.uniform(0.5, 1.5)
    return Schedule(tuple(kinds), seed, tuple(entries))


def kind_of(step: Step | ArmAhead) -> str | None:
    """Return the nemesis kind a schedule's step opens, or None for a heal or a thaw."""
    if isinstance(step, ArmAhead):
        return "freeze" if step.crash.action == "freeze" else "crash"
    if isinstance(step, Kill):
        return "kill"
    if isinstance(step, Freeze):
        return "pause"
    if isinstance(step, Open):
        if isinstance(step.fault, KillBroker):
            return "postgres" if step.fault.service == PG else "broker"
        return _NETWORK_KIND.get(type(step.fault))
    return None


def undrawn(schedule: Schedule, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Return the ``kinds`` that ``schedule`` never draws, in their order."""
    drawn = {kind_of(t.step) for t in schedule.entries}
    return tuple(k for k in kinds if k not in drawn)


def every_kind_at(schedule: Schedule, kinds: tuple[str, ...]) -> float | None:
    """Return the second by which ``schedule`` has drawn each of ``kinds``, or None if it never does."""
    left = set(kinds)
    for timed in schedule.entries:
        left.discard(kind_of(timed.step) or "")
        if not left:
            return timed.at_s
    return None


def foreign(
    schedule: Schedule, *, targets: tuple[str, ...], broker: str, instances: int, points: tuple[str, ...]
) -> list[str]:
    """Return the steps of ``schedule`` a flow with these services, instances and points cannot take.

    A schedule written by a soak of another flow may open a fault on a proxy this one never
    passes through, or kill a broker it does not use: the window would test nothing, yet count.
    """
    found = []
    for timed in schedule.entries:
        step, at = timed.step, f"at {timed.at_s:g}s"
        if isinstance(step, Open) and step.target is not None and step.target not in targets:
            found.append(f"{type(step.fault).__name__} on {step.target} {at}")
        elif isinstance(step, Open) and isinstance(step.fault, KillBroker) and step.fault.service not in (broker, PG):
            found.append(f"kill -9 of {step.fault.service} {at}")
        elif isinstance(step, Kill | Freeze) and step.instance >= instances:
            found.append(f"{type(step).__name__.lower()} of instance {step.instance} {at} (this soak has {instances})")
        elif isinstance(step, ArmAhead) and step.crash.point not in points:
            found.append(f"{step.crash.action} at {step.crash.point} {at}")
    return found


def _fault(kind: str, rng: random.Random, targets: tuple[str, ...], broker: str) -> tuple[object, str | None]:
    """Return (fault, target) of a window of ``kind``."""
    match kind:
        case "latency":
            return Latency(ms=rng.choice((50, 100, 200)), jitter_ms=25), rng.choice(targets)
        case "reset":  # a share of the connections: one worker's cut, its neighbour's kept
            return ResetPeer(timeout_ms=rng.choice((0, 100)), toxicity=0.5), rng.choice(targets)
        case "partition":
            return Partition(), rng.choice(targets)
        case "timeout":
            return Timeout(ms=rng.choice((500, 2000))), rng.choice(targets)
        case "broker":
            return KillBroker(broker), None
        case "postgres":
            return KillBroker(PG), None
    raise ConfigError(f"nemesis kind {kind!r} has no fault", hint=f"use one of {', '.join(KINDS)}")
