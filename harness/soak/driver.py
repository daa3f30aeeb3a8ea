"""Drive a soak: submit for its length at its pace, apply the nemesis as it falls due, judge once.

``run_soak`` opens one ``RunSession`` of the scenario's flow (any flow ``txchaos run`` runs), so
the run is an ordinary run folder: a ledger, ``steps.jsonl`` (every submission, fault and kill as
applied, a crash's resolved operation included), a verdict. Each tick (``Soak.tick_s``) it applies
the schedule's steps that are due, submits what the pace allows (the rate's share, or up to the
closed loop's window of operations in flight) and reports progress. At the end, or on Ctrl-C /
SIGTERM, it heals what is open, thaws what is frozen, lets the flow quiesce and closes the books:
an interrupted soak still says what it judged, and its folder verifies again to the same verdict.

>>> result = run_soak(Soak(spec, duration_s=60, workers=2), endpoints, progress=print)
>>> result.verdict.found(), result.stats.ops_per_s
"""

from __future__ import annotations

import json
import math
import resource
import shlex
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness import paths
from harness.errors import ConfigError
from harness.faults import KillBroker
from harness.heap import loaded_frozen
from harness.protocols import by_name, proxies
from harness.run.core.outcome import RunResult
from harness.run.core.session import RunSession
from harness.run.spec.scenario import ScenarioSpec
from harness.run.spec.steps import Freeze, Heal, Kill, Open, Step, Submit, Thaw, describe
from harness.soak.compacting import LiveCompaction
from harness.soak.nemesis import (
    ARMED,
    DEFAULT,
    NONE,
    SCHEDULE_FILE,
    ArmAhead,
    Schedule,
    Timed,
    every_kind_at,
    foreign,
    kind_of,
    plan,
    undrawn,
)
from harness.soak.room import Room, check_room
from harness.soak.spec import PACED_RATE, Soak
from harness.soak.witnesses import nemesis_kills, witness_sample
from harness.stack.base import Endpoints

SUMMARY = "soak.json"
PACE_LOG = "soak-progress.jsonl"
DRIVER_ERROR = "driver-error.txt"  # the traceback of what stopped the driver, when something did
STALL_S = 20.0  # draining ends when nothing more came out for this long
# After a heal that restarted a broker or the database, the schedule holds until the flow moves
# again, at most this long: a Kafka consumer group settles for seconds after a restart, longer
# than a rest, and restarts named alone then followed each other with nothing out in between.
RECOVER_S = 60.0
EVERY_KIND_WITHIN_S = 3600.0  # how far ahead a note looks for the time a seed has drawn every kind
ROOM_EVERY_S = 2.0  # between looks at the disk's free space (a statvfs and a stat per segment)
# The protocol whose proxy a flow's broker faults open on, by transport.
# A built-in flow's transport -> the protocol of its broker (DTM for the HTTP flow: its coordinator).
_BROKER_PROTOCOL = {"activemq": "stomp", "kafka": "kafka", "http": "dtm"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SoakStats:
    """What a soak did and what it cost: counts, seconds, throughput end to end, the driver's peak RSS."""

    submitted: int
    windows: int
    kills: int
    crashes_armed: int
    arms_skipped: int  # crashes and freezes that fell due after the last submission (not armed)
    submit_s: float  # first submission to last
    close_s: float  # quiescence, the books and the verdict
    wall_s: float  # first submission to verdict: what ops_per_s divides by
    driver_peak_rss_mb: float  # the whole command: the closing compaction and verdict included
    driving_rss_mb: float  # the most the driver held while it submitted and the nemesis ran
    interrupted: bool  # by Ctrl-C, SIGTERM, the disk's room (``stopped``) or an error (``error``)
    error: str = ""  # what stopped the driver early: the verdict is incomplete and says so
    # why the soak stopped submitting before its length with its books sound (the disk filling):
    # the verdict covers what ran
    stopped: str = ""
    # per heal of a broker or database kill, the seconds until the flow moved again (``RECOVER_S``
    # when it did not): the schedule waited that long before its next step
    recover_s: tuple[float, ...] = ()
    # the nemesis kinds the driver opened or armed, in the order it first did (None: not told)
    kinds_opened: tuple[str, ...] | None = None
    # after the last submission: the backlog coming out with the nemesis still on (``draining``),
    # then the final heal and thaw (a broker killed at the end comes back in seconds)
    drain_s: float = 0.0
    heal_s: float = 0.0
    # how often the supervisor started a worker process of the flow again (after a kill, a crash
    # point, or a worker that could not reach a killed broker or database), the close included
    worker_restarts: int = 0

    @property
    def unrecovered(self) -> int:
        """How many restarts the flow did not come back from within ``RECOVER_S``."""
        return sum(1 for s in self.recover_s if s >= RECOVER_S)

    @property
    def ops_per_s(self) -> float:
        return self.submitted / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class SoakResult(RunResult):
    """A judged soak: a run (folder, verdict, spec) with its soak, its schedule and its stats."""

    soak: Soak
    schedule: Schedule
    stats: SoakStats

    @property
    def nemesis_note(self) -> str | None:
        """Return which kinds the soak asked for and never opened or armed (``nemesis_note``), if any:
        an ``--ops`` soak's schedule is drawn for a slow flow, and a fast one ends before much of it."""
        ran = None if self.stats.kinds_opened is None else (self.stats.kinds_opened, self.stats.submit_s)
        return nemesis_note(self.soak, self.spec, self.schedule, ran=ran)


def soak_spec(soak: Soak) -> ScenarioSpec:
    """Return the scenario as the soak runs it: its seed and workers, no scripted crash or window."""
    base = soak.scenario
    if soak.partitions is not None and soak.partitions != getattr(base.settings, "partitions", None):
        base = base.with_options({"partitions": soak.partitions})  # one per worker at least
    fields: dict[str, Any] = {"seed": soak.seed, "crashes": (), "faults": (), "poison": frozenset()}
    fields["messages"] = min(soak.ops or 1_000_000, 1_000_000)
    fields["timeout_s"] = soak.quiesce_s
    if soak.expect is not None:
        fields["expect"] = soak.expect
    if base.service is not None:
        fields["service"] = replace(base.service, instances=soak.workers)
    elif "workers" in base.flow.accepts:
        fields["workers"] = soak.workers
    return replace(base, **fields)


def _protocols_of(spec: ScenarioSpec) -> tuple[str, ...]:
    """Return the protocols ``spec``'s flow speaks, its broker's first and Postgres last: the ones a
    service's placeholders name (a JMS service speaks OpenWire, not STOMP), else its transport's."""
    transport = spec.flow.transport.removeprefix("service_")
    spoken = spec.service.protocols() if spec.service is not None else frozenset()
    brokers: list[str] = [p for p in ("stomp", "openwire", "kafka", "dtm") if p in spoken]
    return (*(brokers or [_BROKER_PROTOCOL.get(transport, "stomp")]), "postgres")


def _broker_of(spec: ScenarioSpec) -> str:
    """Return the service a "broker" kill of ``spec``'s flow stops: the one behind its broker's protocol."""
    return by_name(_protocols_of(spec)[0]).service


def _points_of(spec: ScenarioSpec) -> tuple[str, ...]:
    """Return the crash points a soak may arm on ``spec``'s flow (a service's are wire traps: none)."""
    if spec.service is not None:
        return ()
    return tuple(p for p in spec.flow.points if p.startswith(("after_db", "before_", "after_broker")))


def _shape(spec: ScenarioSpec) -> dict[str, Any]:
    """Return what a schedule may aim at on ``spec``'s flow, as ``plan`` and ``foreign`` take it: the
    proxies it passes through, its broker, its instances and the crash points a soak arms."""
    return {
        "targets": proxies(*_protocols_of(spec)),
        "broker": _broker_of(spec),
        "instances": spec.service.instances if spec.service is not None else max(1, spec.workers),
        "points": _points_of(spec),
    }


def schedule_of(soak: Soak, spec: ScenarioSpec) -> Schedule:
    """Return the soak's schedule: the one it was given (refused when it names what this flow does
    not have), or one drawn from its kinds and seed."""
    if not isinstance(soak.nemesis, Schedule) and not soak.nemesis:
        return NONE
    if isinstance(soak.nemesis, Schedule):
        found = foreign(soak.nemesis, **_shape(spec))
        if found:
            more = f" and {len(found) - 3} more" if len(found) > 3 else ""
            raise ConfigError(
                f"the nemesis schedule names what {spec.label} does not have: {'; '.join(found[:3])}{more}",
                hint="replay a nemesis.json on the scenario whose soak wrote it (its soak.json names it), "
                "or draw one for this flow: --nemesis default or a list of kinds",
            )
        return soak.nemesis
    armed = [k for k in soak.nemesis if k in ARMED]
    if armed and not _points_of(spec) and soak.nemesis != DEFAULT:  # the default mix takes what the flow has
        raise ConfigError(
            f"--nemesis {','.join(soak.nemesis)}: {spec.label} has no crash point a soak arms, "
            f"so {' and '.join(armed)} would never happen",
            hint="a service's crash points are its wire traps, which a soak does not arm: use kill and pause "
            "on its instances, with latency, reset, partition, timeout, broker or postgres",
        )
    # By operations as fast as the flow goes, the run may take longer than estimated: draw enough to
    # keep the nemesis busy. By time, or by operations at a rate, the length is known.
    length = soak.length_s if soak.duration_s is not None or soak.pace_rate else soak.length_s * 4
    schedule = _drawn(soak, spec, length)
    if not schedule.entries:  # judged clean, it would say the flow held under faults that never came
        raise ConfigError(
            f"the nemesis draws no fault in {length:g}s: the first falls due {soak.pace.first_s:g}s in",
            hint="lengthen the soak (--duration, --ops), or run it with --nemesis none for the clean path",
        )
    return schedule


def _scheduled(soak: Soak, schedule: Schedule) -> str:
    """Return how many fault windows ``schedule`` holds, in words; for a closed loop bounded by
    operations, over how long: it meets only those due before its last submission."""
    said = f"{schedule.windows} fault window(s) scheduled"
    if soak.ops is None or soak.pace_rate is not None or not schedule.entries:
        return said
    span = max(t.at_s for t in schedule.entries)
    return f"{said} over {span:.0f}s (as fast as the flow goes, it meets those due before its last operation)"


def _drawn(soak: Soak, spec: ScenarioSpec, length_s: float) -> Schedule:
    """Return the schedule ``soak``'s kinds and seed draw over ``length_s`` on ``spec``'s flow."""
    assert not isinstance(soak.nemesis, Schedule)
    return plan(soak.nemesis, seed=soak.seed, length_s=length_s, pace=soak.pace, **_shape(spec))


def nemesis_note(
    soak: Soak, spec: ScenarioSpec, schedule: Schedule, *, ran: tuple[tuple[str, ...], float] | None = None
) -> str | None:
    """Return, for a drawn schedule that leaves out kinds the flow could take, which ones, and how
    long a soak of this seed must run to draw them all (None when it draws every kind).

    ``ran`` (the kinds the soak opened or armed, and the seconds it submitted for) makes it the
    note of what the soak did rather than of what its schedule holds.
    """
    if isinstance(soak.nemesis, Schedule) or not schedule.entries:
        return None
    takes = tuple(k for k in schedule.kinds if k not in ARMED or _points_of(spec))
    if ran is None:
        missing = undrawn(schedule, takes)
        said = f"this schedule does not draw {', '.join(missing)}"
    else:
        missing = tuple(k for k in takes if k not in ran[0])
        said = f"this soak opened no {', '.join(missing)} in its {ran[1]:.0f}s of submitting"
    if not missing:
        return None
    by = every_kind_at(_drawn(soak, spec, EVERY_KIND_WITHIN_S), takes)
    if by is None:
        return said
    enough = math.ceil(by + soak.pace.hold_s * 1.5)  # the last window held to its end
    return f"{said}; with seed {soak.seed} every kind comes by {by:g}s (--duration {enough}s)"


class _Driver:
    """One soak's loop over an open session."""

    def __init__(
        self,
        soak: Soak,
        session: RunSession,
        schedule: Schedule,
        progress: Progress,
        every_s: float = 1.0,
        room: Room | None = None,
    ) -> None:
        self.soak, self.session, self.progress = soak, session, progress
        self.room = room or Room(Path(session.folder.path) / "ledger")
        self._next_room = 0.0
        self.stopped = ""  # why submitting ended early with the books sound (``Room.short``)
        self.every_s = every_s  # between progress lines (the pace log gets one a second whatever this is)
        self._next_line = 0.0
        self._line_at = (0.0, 0)  # (seconds, count out) at the last progress line: its rate out
        self.due: list[Timed] = list(schedule.entries)
        self.open_faults: list[str] = []
        self.kills = self.arms = self.windows = 0
        self.first = self.last = 0.0
        self.anomalies_seen = 0
        self._next_report = 0.0
        self._next_anomaly_check = 0.0
        self._pace = (Path(session.folder.path) / PACE_LOG).open("a")
        self.rss_mb = 0.0  # the largest resident size seen at a report, while driving
        self.skipped = 0  # arms due after the last submission, not applied
        self.opened: list[str] = []  # the nemesis kinds applied, in the order they first were
        self._out_seen, self._out_moved = -1, 0.0  # the last count out and when it last moved
        # The broker the driver submits to: while a kill -9 of it is open, submitting waits (the
        # driver could only block on a dead broker, and the heal that restarts it is this loop's).
        self._broker = _broker_of(soak.scenario)
        self.broker_down = False
        self.error = ""  # what stopped the driver before its length, when an error did
        self.late_s = 0.0  # how far applying steps has pushed the rest of the schedule back
        self._restart_open = False  # a broker or database kill is among the open windows
        self._held_since: float | None = None  # when a kill of the flow's broker began to wait for flight
        self._submitted_now = False  # this tick submitted: operations are in flight
        # (count out at the heal, how many more out make it recovered, when it healed, how many
        # operations had been submitted by then)
        self._recovering: tuple[int, int, float, int] | None = None
        self.recover_waits: list[float] = []  # seconds each restart's heal waited for the flow

    def elapsed(self) -> float:
        return time.monotonic() - self.first

    def submitting(self) -> bool:
        if self.stopped:
            return False
        soak, n = self.soak, len(self.session.ops)
        if soak.ops is not None:
            return n < soak.ops
        return self.elapsed() < (soak.duration_s or soak.length_s)

    def draining(self) -> bool:
        """Whether submitting is over but operations are still coming out of the flow: the nemesis
        goes on, or a backlog submitted in seconds would be processed with no fault at all.

        Bounded: ``quiesce_s`` after the last submission, and ``STALL_S`` without one more out
        (an operation lost or stuck never comes out; the books say so, not a longer nemesis).
        """
        out, now = self.session.out_count(), time.monotonic()
        if self.stopped or out is None or out >= len(self.session.ops):
            return False
        if out != self._out_seen:
            self._out_seen, self._out_moved = out, now
        return now - self.last < self.soak.quiesce_s and now - max(self._out_moved, self.last) < STALL_S

    def target(self) -> int:
        """How many operations should be out of the driver by now."""
        soak, session = self.soak, self.session
        limit = soak.ops if soak.ops is not None else 10**12
        out = session.out_count()
        if soak.rate is not None or out is None:
            rate = soak.pace_rate or PACED_RATE  # a flow that counts nothing out: paced
            return min(limit, int(rate * self.elapsed()) + 1)
        return min(limit, out + soak.in_flight)

    def apply(self, step: Step | ArmAhead) -> None:
        session = self.session
        if isinstance(step, ArmAhead) and not self.submitting():
            # An arm names an operation yet to be submitted; none will be now, and one already in
            # the flow may be past its point: the arm could never fire, and the run would prove
            # less than it says. Crashes and freezes are drawn while operations are submitted.
            self.skipped += 1
            return
        kind = kind_of(step)
        if kind is not None and kind not in self.opened:
            self.opened.append(kind)
        if isinstance(step, ArmAhead):
            # A freeze at a crash point is an arm: the worker stops itself when it gets there, and
            # the ledger has it as that crash's firing, not as a fault window. ``windows`` counts
            # what the ledger holds as windows, so the two can be checked against each other.
            if step.crash.action == "freeze":
                self.open_faults.append(f"freeze at {step.crash.point}")
            step = step.resolve(len(session.ops))
            self.arms += 1
        elif isinstance(step, Open | Freeze):
            # the nemesis kind's name: a Freeze step is a "pause" (SIGSTOP), not the "freeze" kind's arm
            said = f"pause instance {step.instance}" if isinstance(step, Freeze) else describe(step)
            self.open_faults.append(said.removeprefix("open "))
            self.windows += 1
            if isinstance(step, Open) and isinstance(step.fault, KillBroker):
                self._restart_open = True
                self.broker_down = self.broker_down or self._restarts_flow_broker(step)
        elif isinstance(step, Heal):
            self.open_faults = [f for f in self.open_faults if f.startswith("freeze at")]
            self.broker_down = False
        elif isinstance(step, Thaw):
            self.open_faults = [f for f in self.open_faults if not f.startswith("freeze at")]
        elif isinstance(step, Kill):
            self.kills += 1
        session.apply(step)
        if isinstance(step, Heal) and self._restart_open:  # restarted and answering: now the flow
            self._restart_open = False
            out = session.out_count()
            if out is not None:  # a flow that cannot say what came out is not waited for
                # Recovered once half of what was in flight came out (at most half a window): a
                # few outputs read late from before the kill are not a group that serves again.
                needed = max(1, min(len(session.ops) - out, self.soak.in_flight) // 2)
                self._recovering = (out, needed, time.monotonic(), len(session.ops))

    def recovered(self) -> bool:
        """Whether the flow runs again after a restart's heal (or there is none to wait for).

        While the soak submits: more came out than had been submitted at the heal, so an operation
        submitted since went through. A closed loop often has almost nothing in flight at a kill;
        the few outputs then read late from before it made "half of what was in flight" at once,
        and the next restart came while the group was still rejoining, with nothing out between.
        Once it no longer submits: half of what was in flight at the heal came out, or everything.

        Until it does, the rest of the schedule waits and is pushed back by the wait: the rest
        after a restart is a rest for a running flow, not for one still reconnecting.
        """
        if self._recovering is None:
            return True
        base, needed, healed, submitted = self._recovering
        out, waited = self.session.out_count(), time.monotonic() - healed
        if self.submitting():
            moved = out is None or out > submitted
        else:
            moved = out is None or out - base >= needed or out >= len(self.session.ops)
        if not moved and waited < RECOVER_S:
            return False
        self._recovering = None
        self.late_s += waited
        self.recover_waits.append(waited)  # as counted into late_s; cut to the millisecond in the stats
        return True

    def tick(self) -> None:
        now = self.elapsed()
        if now >= self._next_room:
            self._next_room = now + ROOM_EVERY_S
            short = self.room.short()
            if short is not None:
                self.stopped = short
                self.progress(f"{short}; healing, quiescence, closing the books")
                return
        self._submitted_now = False
        self._apply_due()
        want = self.target() - len(self.session.ops)
        if want > 0 and self.submitting() and not self.broker_down:
            self.apply(Submit(min(want, 20_000)))
            self.last = time.monotonic()
            self._submitted_now = True
            if self._held_since is not None:  # a kill of the flow's broker held for operations in flight: they are now
                self._apply_due()
        self.report(self.elapsed())

    def _apply_due(self) -> None:
        """Apply the steps due by now, in order."""
        now = self.elapsed()
        # asked every time, due steps or not: a wait ends (and is counted) when the flow moves
        while self.recovered() and self.due and self.due[0].at_s + self.late_s <= now:
            if self._holds_for_flight(self.due[0].step):
                # Nothing submits while the flow's broker is down, so its window tests only what
                # was in flight at the kill. A paced soak is often idle between operations: killed
                # then, the window holds no operation and the run ends unfired (exit 6). The kill
                # waits for the next submission, and the rest of the schedule with it.
                self._held_since = now if self._held_since is None else self._held_since
                return
            if self._held_since is not None:  # the held kill: its heal moves with it, the window keeps its length
                self.late_s += now - self._held_since
                self._held_since = None
            before = time.monotonic()
            self.apply(self.due.pop(0).step)
            # A step that takes its time (a heal restarting a killed broker: seconds) delays what
            # follows by as much: the rest after a window is the schedule's, not eaten by the heal,
            # or restarts come back to back and the flow never runs between them.
            self.late_s += time.monotonic() - before
            now = self.elapsed()

    def _restarts_flow_broker(self, step: Step | ArmAhead) -> bool:
        """Whether ``step`` kills the broker the driver submits to (a heal restarts it)."""
        return isinstance(step, Open) and isinstance(step.fault, KillBroker) and step.fault.service == self._broker

    def _holds_for_flight(self, step: Step | ArmAhead) -> bool:
        """Whether ``step`` kills the flow's broker while no operation is in flight, and one will be.

        A flow that cannot count what came out (a saga) has operations in flight right after a
        submission: its kill waits for one.
        """
        if not self._restarts_flow_broker(step) or not self.submitting():
            return False
        out = self.session.out_count()
        return not self._submitted_now if out is None else out >= len(self.session.ops)

    def report(self, now: float, *, force: bool = False) -> None:
        if now < self._next_report and not force:
            return
        self._next_report = now + 1.0
        session = self.session
        self.rss_mb = max(self.rss_mb, resident_mb())
        if now >= self._next_anomaly_check:  # a GROUP BY over the effect table: not every second
            self._next_anomaly_check = now + 10.0
            try:
                self.anomalies_seen = len(session.duplicate_effects())
            except Exception:  # the database behind a fault: keep the last count, ask again later
                self._next_anomaly_check = now + 1.0
        out = session.out_count()
        line = {
            "t": round(now, 2),
            "submitted": len(session.ops),
            "out": out,
            "open": list(self.open_faults),
            "restarts": session.restarts,
            "duplicates": self.anomalies_seen,
            "rss_mb": round(self.rss_mb, 1),
        }
        self._pace.write(json.dumps(line) + "\n")
        self._pace.flush()
        if now < self._next_line and not force:
            return
        self._next_line = now + self.every_s
        faults = ", ".join(self.open_faults) or "none"
        if self._recovering is not None:
            healed = time.monotonic() - self._recovering[2]
            faults += f" (a broker or database came back {healed:.0f}s ago: the schedule waits for the flow)"
        self.progress(
            f"{now:6.0f}s  {len(session.ops):,} submitted  {self._out_rate(now, out)}  "
            f"faults open: {faults}  worker restarts {session.restarts}  "
            f"duplicate effects so far {self.anomalies_seen}"
        )

    def _out_rate(self, now: float, out: int | None) -> str:
        """Return the progress line's count out and how fast it moved since the line before (the
        flow's pace now, not the submissions': a closed loop submits most of a run in its first seconds)."""
        if out is None:
            return "- out"
        then, before = self._line_at
        self._line_at = (now, out)
        rate = (out - before) / (now - then) if now - then >= 0.5 else 0.0
        return f"{out:,} out ({rate:,.0f} ops/s)"

    def run(self) -> bool:
        """Submit and apply the schedule until the soak's length; return True when interrupted."""
        self.first = self.last = time.monotonic()
        try:
            while self.submitting() or self.draining():
                started = time.monotonic()
                self.tick()
                time.sleep(max(0.0, self.soak.tick_s - (time.monotonic() - started)))
        except KeyboardInterrupt:
            self.progress("interrupted: healing, quiescence, closing the books")
            return True
        except Exception as exc:  # whatever stopped the driver: the faults are healed, the books closed
            # An hour of soak is not thrown away for one failed step, and not judged as if it had
            # run as scheduled either: the folder records why, so its verdict is incomplete (exit 4)
            # now and whenever it is verified again, and the traceback is kept beside it.
            self.error = f"the soak's driver stopped on {type(exc).__name__}: {exc}"
            trace = "".join(traceback.format_exception(exc))
            (Path(self.session.folder.path) / DRIVER_ERROR).write_text(trace)
            self.session.folder.doubt(
                f"{self.error} ({DRIVER_ERROR}); operations it submitted may not all have reached the flow"
            )
            self.progress(f"{self.error}: healing, quiescence, closing the books")
            return True
        return bool(self.stopped)

    def finish(self) -> None:
        """The final heal and thaw (recorded as steps), before quiescence."""
        self.report(self.elapsed(), force=True)
        self._pace.close()
        self.session.apply(Heal())
        self.session.apply(Thaw())
        self.open_faults.clear()


def run_soak(
    soak: Soak,
    endpoints: Endpoints,
    *,
    runs_root: Path | None = None,
    progress: Progress = print,
    progress_every_s: float = 1.0,
) -> SoakResult:
    """Run ``soak`` on ``endpoints`` and return its judged result (one run folder, one verdict);
    ``progress`` gets a line at most every ``progress_every_s`` while it runs, and each phase's."""
    spec = soak_spec(soak)
    schedule = schedule_of(soak, spec)
    check_room(soak, runs_root or paths.runs_root())
    session = RunSession(spec, endpoints, runs_root=runs_root, progress=lambda _: None, bypass_faults=True)
    schedule.write(session.folder.path)
    progress(f"{soak.label}: {_scheduled(soak, schedule)}; run folder {session.folder.path}")
    driver = _Driver(soak, session, schedule, progress, progress_every_s)
    # The run opens its ledger; compacting it starts as it is written, so the close reads only tails.
    # What the process loaded is left out of the collector's passes while the soak runs: each pass
    # over it paused the driver, its sink included, for 90-100 ms (``harness.heap``).
    with loaded_frozen(), session, LiveCompaction(session.folder.path / "ledger") as live:
        interrupted = driver.run()
        healing = time.monotonic()
        driver.finish()
        closing = time.monotonic()
        progress(f"{len(session.ops):,} submitted; quiescence and verification (at most {soak.quiesce_s:g}s)")
        result = session.close(progress=progress, compaction=live.compaction)
    ended = time.monotonic()
    stats = SoakStats(
        submitted=len(session.ops),
        windows=driver.windows,
        kills=driver.kills,
        crashes_armed=driver.arms,
        arms_skipped=driver.skipped,
        kinds_opened=tuple(driver.opened),
        submit_s=round(driver.last - driver.first, 3),
        close_s=round(ended - closing, 3),
        drain_s=round(max(0.0, healing - driver.last), 3),
        heal_s=round(closing - healing, 3),
        wall_s=round(ended - driver.first, 3),
        driver_peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        driving_rss_mb=round(driver.rss_mb, 1),
        interrupted=interrupted,
        error=driver.error,
        stopped=driver.stopped,
        # cut down, not rounded: a wait under RECOVER_S stays under it (not counted unrecovered)
        recover_s=tuple(math.floor(w * 1000) / 1000 for w in driver.recover_waits),
        worker_restarts=session.restarts,
    )
    soaked = SoakResult(result.run_dir, result.verdict, result.spec, soak, schedule, stats)
    write_summary(soaked)
    return soaked


def resident_mb() -> float:
    """Return this process's resident set size now, in MB (Linux)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * resource.getpagesize() / 1e6


def again_command(run_dir: Path, scenario: str | None = None, options: list[str] | None = None) -> str:
    """Return the ``txchaos soak`` command that runs the soak of ``run_dir`` again, from its ``soak.json``:
    its scenario (``scenario``: as the user named it), bound, workers, pace, options (``options``: the
    ``--option`` values as given; else every option it ran with), seed and schedule."""
    ran = json.loads((run_dir / SUMMARY).read_text())
    words = ["txchaos", "soak", scenario or ran["scenario"]]
    if ran.get("ops"):
        words += ["--ops", str(ran["ops"])]
    elif ran.get("duration_s"):
        words += ["--duration", f"{ran['duration_s']:g}s"]
    words += ["--workers", str(ran["workers"])]
    if ran.get("rate"):
        words += ["--rate", f"{ran['rate']:g}"]
    if options is None:
        options = [
            f"{k}={v if isinstance(v, str) and not _reads_as_json(v) else json.dumps(v)}"
            for k, v in ran.get("options", {}).items()
        ]
    for option in options:
        words += ["--option", option]
    words += ["--seed", str(ran["seed"]), "--nemesis", str(run_dir / SCHEDULE_FILE)]
    return shlex.join(words)


def _reads_as_json(text: str) -> bool:
    """Whether ``--option KEY=text`` would be read as a JSON value rather than as the text itself."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def write_summary(result: SoakResult) -> Path:
    """Write ``soak.json``: the soak's parameters, stats, counts per class and a witness sample."""
    soak, verdict = result.soak, result.verdict
    record = {
        "label": soak.label,
        "scenario": soak.scenario.label,
        "ops": soak.ops,
        "duration_s": soak.duration_s,
        "workers": soak.workers,
        "rate": soak.rate,
        "seed": soak.seed,
        "options": dict(soak.scenario.options),
        "nemesis": list(result.schedule.kinds),
        "nemesis_note": result.nemesis_note,  # kinds asked for that the soak never opened
        "stats": {**asdict(result.stats), "ops_per_s": round(result.stats.ops_per_s, 1)},
        "outcome": verdict.outcome,
        "counts": verdict.found(),
        "witnesses": witness_sample(verdict, nemesis_kills(result.run_dir)),
    }
    path = result.run_dir / SUMMARY
    path.write_text(json.dumps(record, indent=1, default=str))
    return path
