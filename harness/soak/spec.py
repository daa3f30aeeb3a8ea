"""``Soak``: what a soak run is, validated before any service starts.

A soak drives one scenario variant (any flow ``txchaos run`` runs) for ``ops`` operations or
``duration_s`` seconds with ``workers`` processes (a service's instances), at ``rate`` operations
a second (open loop) or as fast as the flow goes (closed loop: at most ``window`` operations in
flight), under a nemesis schedule, and judges one ledger at the end.

>>> Soak(spec, ops=100_000, workers=4, nemesis=("latency", "kill"))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.errors import ConfigError
from harness.run.spec.checks import check_int, check_seconds
from harness.run.spec.scenario import ScenarioSpec
from harness.soak.nemesis import DEFAULT, KINDS, Pace, Schedule

MAX_OPS = 10_000_000
PACED_RATE = 20.0  # ops/s of a soak with no rate whose flow cannot count what came out (no closed loop)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Return the seconds ``text`` says: ``90``, ``90s``, ``10m``, ``1.5h``, ``7d``."""
    match = _DURATION.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"duration {text!r} is not a length of time", hint="write e.g. 90s, 10m, 1h or 7d")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


@dataclass(frozen=True)
class Soak:
    """One soak of ``scenario`` (a ``ScenarioSpec``: its crashes and fault windows are not used).

    Exactly one of ``ops`` and ``duration_s`` bounds it (neither: 60 seconds). ``nemesis``: the
    kinds a seeded schedule draws from (``harness.soak.nemesis.KINDS``; ``()`` for the clean path)
    or a ready ``Schedule`` (a folder's ``nemesis.json``, to run one again).
    """

    scenario: ScenarioSpec
    ops: int | None = None
    duration_s: float | None = None
    workers: int = 2
    rate: float | None = None
    seed: int = 0
    nemesis: tuple[str, ...] | Schedule = DEFAULT
    pace: Pace = Pace()  # noqa: RUF009  (a frozen value)
    window: int = 0  # closed loop: operations in flight at most (0: ``in_flight``'s default)
    quiesce_s: float = 120.0  # after the last submission and the final heal: how long the flow may take
    tick_s: float = 0.25  # how often the driver submits, applies what is due and reports
    expect: frozenset[str] | None = None  # the classes the soak should find (None: the scenario's own)

    def __post_init__(self) -> None:
        if not isinstance(self.scenario, ScenarioSpec):
            raise ConfigError(f"soak of {self.scenario!r}", hint="pass a ScenarioSpec (harness.ScenarioSpec)")
        if self.ops is not None and self.duration_s is not None:
            raise ConfigError(
                f"soak ops={self.ops} and duration_s={self.duration_s}", hint="bound a soak by one of them"
            )
        if self.ops is not None:
            check_int("soak ops", self.ops, 1, MAX_OPS)
        if self.duration_s is not None:
            check_seconds("soak duration_s", self.duration_s, 0, 7 * 24 * 3600, above_low=True)
        check_int("soak workers", self.workers, 1, 16)
        if self.rate is not None:
            check_seconds("soak rate", self.rate, 0, 1_000_000, above_low=True, unit="ops/s")
        check_int("soak seed", self.seed, 0, 2**63 - 1)
        check_int("soak window", self.window, 0, MAX_OPS)
        if self.window and self.rate is not None:
            raise ConfigError(
                f"soak window={self.window} with rate={self.rate:g}",
                hint="the window bounds the closed loop only: drop the window, or the rate for a closed loop",
            )
        if self.window and self.paced:
            raise ConfigError(
                f"soak window={self.window} of {self.scenario.label}",
                hint=f"its flow cannot count what came out while it runs, so its soak is paced ({PACED_RATE:g} "
                "ops/s, or the rate you give), not a closed loop: drop the window",
            )
        check_seconds("soak quiesce_s", self.quiesce_s, 1, 24 * 3600)
        check_seconds("soak tick_s", self.tick_s, 0.01, 10)
        if self.expect is not None and not isinstance(self.expect, frozenset):
            raise ConfigError(f"soak expect={self.expect!r}", hint='a frozenset, e.g. frozenset({"duplicate-effect"})')
        if not isinstance(self.nemesis, Schedule):
            unknown = [k for k in self.nemesis if k not in KINDS]
            if unknown or isinstance(self.nemesis, str):
                raise ConfigError(
                    f"soak nemesis={self.nemesis!r}", hint=f"a tuple of {', '.join(KINDS)} (or () for none)"
                )

    @property
    def paced(self) -> bool:
        """Whether the soak runs at ``PACED_RATE`` for want of a closed loop (no rate given, and its
        flow cannot count the operations out while it runs: a DTM transfer)."""
        return self.rate is None and not self.scenario.flow.counts_out

    @property
    def pace_rate(self) -> float | None:
        """The operations a second the soak submits (None: a closed loop, as fast as the flow goes)."""
        return PACED_RATE if self.paced else self.rate

    @property
    def length_s(self) -> float:
        """The seconds the schedule covers: the duration, else an estimate from the rate (or 60 s)."""
        if self.duration_s is not None:
            return self.duration_s
        if self.ops is not None and self.pace_rate is not None:
            return self.ops / self.pace_rate
        return 60.0 if self.ops is None else max(60.0, self.ops / 100)

    @property
    def in_flight(self) -> int:
        """The closed loop's window: operations submitted and not yet out, at most.

        50 per worker (at least 200), and for a flow that consumes in batches (its options' typed
        ``batch_size``) four full batches per partition (or worker, when there are more): a window
        smaller than a batch would have every poll come back part full. A 200,000-op soak of the
        Kafka batch consumer (batch 500, 3 partitions) ran at 6,775-6,906 ops/s with this window
        (6,000), at 7,157-7,396 with no bound, at 6,741 with half of it.
        """
        batch = getattr(self.scenario.settings, "batch_size", 0)
        lanes = self.partitions or self.workers
        return self.window or max(200, 50 * self.workers, 4 * batch * lanes)

    @property
    def partitions(self) -> int | None:
        """The partitions of the flow's input topic in this soak (None: a flow without them): the
        scenario's, raised to one per worker. ``kafka_consumer:inbox-offset`` reads one partition, so
        with two workers one would stand by, and every kill or pause aimed at it would test nothing."""
        given = getattr(self.scenario.settings, "partitions", None)
        if not isinstance(given, int) or self.scenario.service is not None:
            return None
        return max(given, self.workers)

    @property
    def label(self) -> str:
        bound = f"{self.ops:,} ops" if self.ops is not None else f"{self.length_s:g}s"
        pace = f"{self.rate:g} ops/s" if self.rate else "closed loop"
        if self.paced:
            pace = f"{PACED_RATE:g} ops/s: its flow counts no output while it runs"
        workers = f"{self.workers} worker" + ("s" if self.workers != 1 else "")
        if self.partitions is not None:
            workers += f" on {self.partitions} partition" + ("s" if self.partitions != 1 else "")
        return f"soak {self.scenario.label} ({bound}, {workers}, {pace})"
