"""A soak's spec and nemesis: validated before any service starts, seeded, replayable as data."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from harness.errors import ConfigError
from harness.faults import KillBroker
from harness.run.spec.files import resolve
from harness.run.spec.steps import Freeze, Heal, Kill, Open, Thaw
from harness.soak import DEFAULT, Pace, Schedule, Soak, parse_duration, plan
from harness.soak.driver import nemesis_note, schedule_of, soak_spec
from harness.soak.nemesis import ArmAhead, Timed, every_kind_at, kind_of, parse_kinds, undrawn

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
TARGETS = ("activemq_stomp", "postgres")
DEFAULT_PACE = Pace()


def racy() -> Soak:
    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    return Soak(spec, duration_s=300, workers=3, seed=4)


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    one = plan(DEFAULT, seed=1, length_s=120, targets=TARGETS, instances=2, points=("before_db_commit",))
    assert one == plan(DEFAULT, seed=1, length_s=120, targets=TARGETS, instances=2, points=("before_db_commit",))
    assert one != plan(DEFAULT, seed=2, length_s=120, targets=TARGETS, instances=2, points=("before_db_commit",))


@pytest.mark.parametrize("seed", range(12))
def test_each_kind_comes_once_before_any_comes_twice(seed: int) -> None:
    points = ("before_db_commit",)
    free = Pace(compound=0, restart_every_s=0)  # every window one kind, restarts at the schedule's pace
    schedule = plan(DEFAULT, seed=seed, length_s=600, targets=TARGETS, instances=2, points=points, pace=free)
    drawn = [k for k in (kind_of(t.step) for t in schedule.entries) if k is not None]
    rounds = [drawn[i : i + len(DEFAULT)] for i in range(0, len(drawn) - len(DEFAULT), len(DEFAULT))]
    assert len(rounds) >= 3
    assert all(sorted(r) == sorted(DEFAULT) for r in rounds), rounds
    # In the default pace a restart waits its 2 minutes; the other kinds go round meanwhile.
    paced = plan(DEFAULT, seed=seed, length_s=120, targets=TARGETS, instances=2, points=points, pace=Pace(compound=0))
    calm = [k for k in (kind_of(t.step) for t in paced.entries) if k is not None and k not in ("broker", "postgres")]
    assert all(len(set(calm[i : i + 7])) == len(calm[i : i + 7]) for i in range(0, len(calm), 7)), calm


def test_a_short_soak_is_told_which_kinds_its_schedule_leaves_out_and_how_long_draws_them_all() -> None:
    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    short = Soak(spec, duration_s=30, workers=2, seed=0)
    schedule = schedule_of(short, soak_spec(short))
    left_out = undrawn(schedule, DEFAULT)
    note = nemesis_note(short, soak_spec(short), schedule)
    assert left_out
    assert note is not None
    assert note.startswith(f"this schedule does not draw {', '.join(left_out)}; with seed 0 every kind comes by ")
    enough = re.search(r"--duration (\d+)s", note)
    assert enough is not None, note
    long = Soak(spec, duration_s=float(enough.group(1)), workers=2, seed=0)
    drawn = schedule_of(long, soak_spec(long))
    assert undrawn(drawn, DEFAULT) == ()
    assert every_kind_at(drawn, DEFAULT) is not None
    assert nemesis_note(long, soak_spec(long), drawn) is None
    # a service's mix has no crash or freeze to miss; a given schedule is the user's own
    services = SCENARIOS.parent / "examples" / "services" / "services_scenario.py"
    (service,) = resolve(f"{services}:go-fixed", 0)
    mixed = Soak(service, duration_s=30, workers=2, seed=0)
    said = nemesis_note(mixed, soak_spec(mixed), schedule_of(mixed, soak_spec(mixed)))
    assert said is not None
    assert "crash" not in said, said
    assert "freeze" not in said, said
    given = Soak(spec, duration_s=30, workers=2, seed=0, nemesis=schedule)
    assert nemesis_note(given, soak_spec(given), schedule) is None


def test_a_schedule_round_trips_through_its_file(tmp_path: Path) -> None:
    schedule = plan(DEFAULT, seed=9, length_s=200, targets=TARGETS, instances=3, points=("before_db_commit",))
    kinds = {type(t.step) for t in schedule.entries}
    assert {Open, Heal, Kill, Freeze, Thaw, ArmAhead} <= kinds  # every kind the default mix draws
    again = Schedule.from_records(json.loads(schedule.write(tmp_path).read_text()))
    assert again == schedule


def test_windows_are_healed_in_order_and_rest_between() -> None:
    schedule = plan(("latency", "partition"), seed=3, length_s=300, targets=TARGETS, pace=Pace(compound=0))
    opens = [t.at_s for t in schedule.entries if isinstance(t.step, Open)]
    heals = [t.at_s for t in schedule.entries if isinstance(t.step, Heal)]
    assert len(opens) == len(heals) > 10
    # Each window heals before the next opens (no compound windows asked for).
    assert all(o < h < n for o, h, n in zip(opens, heals, opens[1:], strict=False))
    assert opens[0] >= Pace().first_s


def test_a_freeze_is_thawed_after_at_least_the_heartbeat_timeout() -> None:
    schedule = plan(("freeze",), seed=5, length_s=60, targets=TARGETS, points=("before_db_commit", "after_db_commit"))
    arms = [t for t in schedule.entries if isinstance(t.step, ArmAhead)]
    thaws = [t for t in schedule.entries if isinstance(t.step, Thaw)]
    assert len(arms) == len(thaws) > 3
    assert all(a.step.crash.point == "before_db_commit" and a.step.crash.action == "freeze" for a in arms)  # type: ignore[union-attr]
    assert all(t.at_s - a.at_s >= 3.5 for a, t in zip(arms, thaws, strict=True))


def test_without_crash_points_crash_and_freeze_are_skipped() -> None:
    schedule = plan(("crash", "freeze"), seed=1, length_s=60, targets=TARGETS)
    assert schedule.entries == ()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("250ms", 0.25), ("7d", 604800.0)],
)
def test_durations_read_as_people_write_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "-5m", "0s", "5w"])
def test_a_bad_duration_is_refused_with_the_fix(text: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("e.g. 90s, 10m, 1h or 7d")):
        parse_duration(text)


def test_nemesis_kinds_parse_and_a_bad_one_is_named() -> None:
    assert parse_kinds("default") == DEFAULT
    assert parse_kinds("none") == ()
    assert parse_kinds("latency, kill") == ("latency", "kill")
    with pytest.raises(ConfigError, match="no fault kind named 'earthquake'"):
        parse_kinds("latency,earthquake")
    with pytest.raises(ConfigError, match="names no fault kind"):
        parse_kinds(" , ")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ops": 10, "duration_s": 5.0}, "ops=10 and duration_s=5.0"),
        ({"ops": 0}, "soak ops=0"),
        ({"workers": 0}, "soak workers=0"),
        ({"rate": -1.0}, "soak rate"),
        ({"nemesis": "latency"}, "soak nemesis='latency'"),
        ({"nemesis": ("latency", "flood")}, "flood"),
        ({"expect": {"lost"}}, "soak expect"),
        ({"rate": 5.0, "window": 10}, "soak window=10 with rate=5"),
    ],
)
def test_a_bad_soak_is_refused_naming_the_value(fields: dict[str, object], named: str) -> None:
    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    with pytest.raises(ConfigError, match=re.escape(named)):
        Soak(spec, **fields)  # type: ignore[arg-type]


def test_a_bad_rate_is_refused_in_its_own_unit() -> None:
    # The range check is shared with durations; a rate's hint said "seconds" until 2026-11-29.
    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    with pytest.raises(ConfigError) as refused:
        Soak(spec, rate=0.0)
    assert refused.value.hint == "soak rate must be > 0 and <= 1,000,000 ops/s"
    with pytest.raises(ConfigError, match="not a finite number of ops/s"):
        Soak(spec, rate=float("inf"))


def test_the_soak_runs_its_scenario_with_its_seed_and_workers_and_no_scripted_faults() -> None:
    soak = racy()
    spec = soak_spec(soak)
    assert (spec.seed, spec.workers, spec.crashes, spec.faults) == (4, 3, (), ())
    assert spec.timeout_s == soak.quiesce_s
    schedule = schedule_of(soak, spec)
    assert schedule == schedule_of(soak, spec)  # seeded
    kills = [t.step for t in schedule.entries if isinstance(t.step, Kill)]
    assert kills
    assert all(0 <= k.instance < 3 for k in kills)
    opens = [t.step for t in schedule.entries if isinstance(t.step, Open)]
    assert {o.target for o in opens if not isinstance(o.fault, KillBroker)} <= {"activemq_stomp", "postgres"}
    restarted = {o.fault.service for o in opens if isinstance(o.fault, KillBroker)}
    assert restarted
    assert restarted <= {"activemq", "postgres"}


def test_a_schedule_replayed_on_another_flow_is_refused_naming_what_it_lacks() -> None:
    # Drawn for the ActiveMQ stage with 3 workers, saved and loaded as `--nemesis FILE` would.
    drawn = schedule_of(racy(), soak_spec(racy()))
    saved = Schedule.from_records(json.loads(json.dumps(drawn.to_records())))
    (own,) = resolve("onepc_crash_gap:check-then-skip", 4, SCENARIOS)
    replay = Soak(own, workers=3, seed=4, nemesis=saved)
    assert schedule_of(replay, soak_spec(replay)) == saved  # on the flow that wrote it: taken as it is
    # On Kafka, its ActiveMQ windows would open on a proxy the flow never uses and count as tested.
    (kafka,) = resolve("kafka_consumer:inbox-offset", 4, SCENARIOS)
    elsewhere = Soak(kafka, workers=3, seed=4, nemesis=saved)
    with pytest.raises(ConfigError, match=r"kafka_consumer:inbox-offset does not have: .*activemq") as refused:
        schedule_of(elsewhere, soak_spec(elsewhere))
    assert "--nemesis default" in str(refused.value.hint)
    # With fewer workers, a kill of an instance the soak does not have.
    fewer = Soak(own, workers=1, seed=4, nemesis=saved)
    with pytest.raises(ConfigError, match=r"of instance [12] at .* \(this soak has 1\)"):
        schedule_of(fewer, soak_spec(fewer))


def test_a_nemesis_that_would_test_nothing_is_refused() -> None:
    services = SCENARIOS.parent / "examples" / "services" / "services_scenario.py"
    (service,) = resolve(f"{services}:go-fixed", 0)
    asked = Soak(service, duration_s=60, nemesis=("crash", "kill"))
    with pytest.raises(ConfigError, match="has no crash point a soak arms, so crash would never happen"):
        schedule_of(asked, soak_spec(asked))
    mixed = Soak(service, duration_s=60)  # the default mix takes what a service has: no crash, no freeze
    kinds = {type(t.step).__name__ for t in schedule_of(mixed, soak_spec(mixed)).entries}
    assert kinds
    assert "ArmAhead" not in kinds, kinds
    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    short = Soak(spec, duration_s=2)  # over before the first window falls due
    with pytest.raises(ConfigError, match="the nemesis draws no fault in 2s"):
        schedule_of(short, soak_spec(short))
    assert schedule_of(Soak(spec, duration_s=2, nemesis=()), soak_spec(short)).entries == ()


def test_the_default_mix_restarts_the_broker_and_the_database_spaced_and_alone_at_pace() -> None:
    def restarts(kinds: tuple[str, ...], pace: Pace = DEFAULT_PACE) -> list[tuple[float, str]]:
        points = ("before_db_commit",)
        schedule = plan(kinds, seed=7, length_s=1200, targets=TARGETS, instances=2, points=points, pace=pace)
        return [
            (t.at_s, t.step.fault.service)
            for t in schedule.entries
            if isinstance(t.step, Open) and isinstance(t.step.fault, KillBroker)
        ]

    mixed = restarts(DEFAULT)
    assert {service for _, service in mixed} == {"activemq", "postgres"}
    assert len(mixed) >= 5  # 20 minutes: most 2-minute spans get one
    assert all(b - a >= Pace().restart_every_s for (a, _), (b, _) in itertools.pairwise(mixed))
    alone = restarts(("broker",))
    assert len(alone) > 2 * len(mixed)  # named alone, restarts come at the schedule's own pace
    assert len(restarts(DEFAULT, Pace(restart_every_s=30))) > len(mixed)


def test_the_closed_loop_window_and_the_length() -> None:
    soak = racy()
    assert soak.in_flight == 200
    assert soak.length_s == 300
    assert Soak(soak.scenario, ops=50_000, rate=500).length_s == 100
    assert Soak(soak.scenario, workers=8).in_flight == 400
    assert isinstance(Timed(1.0, Heal()).step, Heal)


class _Folder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.doubts: list[str] = []

    def doubt(self, why: str) -> None:
        self.doubts.append(why)


class _Session:
    """Only what the driver asks of a session: its operations, how many are out, the steps applied."""

    def __init__(self, path: Path) -> None:
        from harness.run.spec.ops import OpIds

        self.folder = _Folder(path)
        self.ops = OpIds("v-s0-op")
        self.out = 0
        self.applied: list[object] = []
        self.restarts = 0

    def out_count(self) -> int:
        return self.out

    def duplicate_effects(self) -> list[str]:
        return []

    def apply(self, step: object) -> None:
        from harness.run.spec.steps import Submit

        self.applied.append(step)
        if isinstance(step, Submit):
            for _ in range(step.count):
                self.ops.append(self.ops.next_id())


def test_the_nemesis_goes_on_while_the_flow_drains_but_arms_nothing_it_could_not_reach(tmp_path: Path) -> None:
    from harness.run.spec.scenario import Crash
    from harness.soak.driver import _Driver

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    soak = Soak(spec, ops=10, window=10, quiesce_s=30)
    arm = ArmAhead(Crash("after_db_commit"), ahead=2)
    schedule = Schedule(("latency", "crash"), 0, (Timed(0, arm), Timed(0.5, Open(*_latency())), Timed(0.5, arm)))
    session = _Session(tmp_path)
    driver = _Driver(soak, session, schedule, progress=lambda _: None)  # type: ignore[arg-type]
    driver.first = driver.last = 0.0
    driver.elapsed = lambda: 0.0  # type: ignore[method-assign]
    driver.tick()  # submits all ten and applies the arm due at 0, on an operation yet to come
    assert len(session.ops) == 10
    assert not driver.submitting()
    assert (driver.arms, driver.skipped) == (1, 0)
    driver.last = time.monotonic()
    assert driver.draining()  # none out yet: the schedule goes on
    driver.elapsed = lambda: 1.0  # type: ignore[method-assign]
    driver.tick()
    assert driver.windows == 1  # the latency window opened while the flow drains
    assert driver.skipped == 1  # the second arm: no operation left to come
    session.out = 4
    assert driver.draining()  # operations still coming out
    driver.last = driver._out_moved = time.monotonic() - 25
    assert not driver.draining()  # nothing more out for 25 s: lost or stuck, for the books to say
    session.out = 10
    assert not driver.draining()
    driver._pace.close()


def test_the_driver_counts_the_windows_the_ledger_holds_and_a_freeze_at_a_point_as_an_arm(tmp_path: Path) -> None:
    # The ledger has a window per Open and per Freeze step; a freeze at a crash point is that
    # crash's firing. A million-op soak counted 568 windows against its ledger's 486 (the freezes
    # armed at points), so its stats could not be checked against its verdict.
    from harness.run.spec.scenario import Crash
    from harness.soak.driver import _Driver

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    freeze_arm = ArmAhead(Crash("after_db_commit", action="freeze"), ahead=2)
    entries = (Timed(0, freeze_arm), Timed(0, Open(*_latency())), Timed(0, Heal()), Timed(0, Freeze(0)))
    schedule = Schedule(("latency", "crash", "pause"), 0, entries)
    assert schedule.windows == 2
    session = _Session(tmp_path)
    driver = _Driver(Soak(spec, ops=10, window=10), session, schedule, progress=lambda _: None)  # type: ignore[arg-type]
    driver.elapsed = lambda: 1.0  # type: ignore[method-assign]
    driver.tick()  # everything is due
    assert (driver.windows, driver.arms) == (2, 1)
    # named as the nemesis kinds are: the SIGSTOP of an instance is a "pause"
    assert driver.open_faults == ["freeze at after_db_commit", "pause instance 0"]
    driver._pace.close()


def test_a_kill_of_the_flows_broker_waits_for_operations_in_flight(tmp_path: Path) -> None:
    """A paced soak is idle between operations; nothing submits while its broker is down. Killed
    then, the window held no operation and the run ended unfired (exit 6): `--rate 100 --duration
    20s --workers 2` did that on 2026-11-29. The kill now comes right after a submission."""
    from harness.run.spec.steps import Submit
    from harness.soak.driver import _Driver

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    kill = Open(KillBroker("activemq"), None)
    pg_kill = Open(KillBroker("postgres"), None)
    schedule = Schedule(("broker", "postgres"), 0, (Timed(1.0, kill), Timed(4.0, Heal()), Timed(5.0, pg_kill)))
    session = _Session(tmp_path)
    driver = _Driver(Soak(spec, duration_s=60, rate=10), session, schedule, progress=lambda _: None)  # type: ignore[arg-type]
    driver.first = driver.last = time.monotonic()
    clock = [0.0]
    driver.elapsed = lambda: clock[0]  # type: ignore[method-assign]
    driver.tick()  # the first operation goes out; nothing is due
    assert [type(s) for s in session.applied] == [Submit]
    session.apply(Submit(10))  # 10 ops/s: up to the 11th at 1.0 s went out, and all came out
    session.out = 11
    clock[0] = 1.05  # the kill is due, and no operation is
    driver.tick()
    assert kill not in session.applied  # held: its window would test nothing
    assert driver.late_s == 0.0
    clock[0] = 1.25  # the 13th operation is due: submitted, then the kill while it is in flight
    driver.tick()
    assert session.applied[-2:] == [Submit(2), kill]
    assert driver.broker_down
    assert driver.late_s == pytest.approx(0.2, abs=0.05)  # held 1.05 -> 1.25 s: the heal moves with it
    clock[0] = 4.1
    driver.tick()
    assert Heal() not in session.applied  # due at 4.0 + 0.2
    clock[0] = 4.3
    driver.tick()
    assert Heal() in session.applied
    # Postgres killed while nothing is in flight is not held: the driver goes on submitting into it.
    session.out = len(session.ops)
    driver._recovering = None
    clock[0] = 5.3
    driver.tick()
    assert session.applied[-1] == pg_kill or session.applied[-2] == pg_kill
    driver._pace.close()


def test_a_flow_that_cannot_count_its_outputs_has_its_broker_killed_right_after_a_submission(tmp_path: Path) -> None:
    # A saga's session says None for what came out: in flight is known only right after a submission.
    from harness.run.spec.steps import Submit
    from harness.soak.driver import _Driver

    class _Uncounted(_Session):
        def out_count(self) -> None:  # type: ignore[override]
            return None

    (spec,) = resolve("kafka_saga:fixed", 0, SCENARIOS)
    kill = Open(KillBroker("kafka"), None)
    session = _Uncounted(tmp_path)
    driver = _Driver(
        Soak(spec, duration_s=60, rate=10), session, Schedule(("broker",), 0, (Timed(1.0, kill),)), lambda _: None
    )  # type: ignore[arg-type]
    driver.first = driver.last = time.monotonic()
    session.apply(Submit(11))  # up to 1.0 s at 10 ops/s
    driver.elapsed = lambda: 1.05  # type: ignore[method-assign]
    driver.tick()
    assert kill not in session.applied
    driver.elapsed = lambda: 1.25  # type: ignore[method-assign]
    driver.tick()
    assert session.applied[-2:] == [Submit(2), kill]
    driver._pace.close()


def _latency() -> tuple[object, str]:
    from harness.faults import Latency

    return Latency(ms=50), "postgres"


def test_progress_lines_come_at_their_own_pace_and_the_pace_log_each_second(tmp_path: Path) -> None:
    """A log (CI) gets a line every ``every_s``; the plots' pace log still gets one a second."""
    from harness.soak.driver import PACE_LOG, _Driver

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    lines: list[str] = []
    session = _Session(tmp_path)
    driver = _Driver(Soak(spec, ops=10), session, Schedule(("latency",), 0, ()), lines.append, every_s=10.0)  # type: ignore[arg-type]
    for now in range(25):
        session.out = 300 * now  # 300 a second come out
        driver.report(float(now))
    session.out = 7_500
    driver.report(25.0, force=True)  # the last one, as the soak ends
    driver._pace.close()
    assert [line.split()[0] for line in lines] == ["0s", "10s", "20s", "25s"]
    # each line's rate is of what came out since the line before, not of what was submitted
    rates = [line.strip().split("  ")[2] for line in lines]
    assert rates == ["0 out (0 ops/s)", "3,000 out (300 ops/s)", "6,000 out (300 ops/s)", "7,500 out (300 ops/s)"]
    assert len((tmp_path / PACE_LOG).read_text().splitlines()) == 26


def test_a_driver_stopped_by_an_error_says_so_and_leaves_the_closing_to_the_soak(tmp_path: Path) -> None:
    """A failed step ends the loop like Ctrl-C (heal, close the books), and the folder doubts the verdict."""
    from harness.errors import HarnessError
    from harness.soak.driver import DRIVER_ERROR, _Driver

    class _Failing(_Session):
        def apply(self, step: object) -> None:
            if len(self.applied) == 2:
                raise HarnessError("no RECEIPT for COMMIT in 10.0s", hint="is the broker up?")
            super().apply(step)

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    session = _Failing(tmp_path)
    lines: list[str] = []
    driver = _Driver(Soak(spec, ops=1000, rate=100, tick_s=0.01), session, Schedule(("latency",), 0, ()), lines.append)  # type: ignore[arg-type]
    assert driver.run() is True
    assert len(session.applied) == 2
    assert driver.error.startswith("the soak's driver stopped on HarnessError: no RECEIPT for COMMIT in 10.0s")
    assert "is the broker up?" in driver.error  # the error's remedy travels with it
    assert session.folder.doubts == [
        f"{driver.error} ({DRIVER_ERROR}); operations it submitted may not all have reached the flow"
    ]
    assert "Traceback" in (tmp_path / DRIVER_ERROR).read_text()
    assert lines[-1].startswith(driver.error)
    driver._pace.close()


def test_a_slow_heal_pushes_the_rest_of_the_schedule_back_by_its_time(tmp_path: Path) -> None:
    # a heal that restarts a killed broker takes seconds: the rest after it must still be a rest,
    # or restarts follow each other back to back and the flow never runs between them
    from harness.soak.driver import _Driver

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    clock = [0.15]

    class _SlowHeal(_Session):
        def apply(self, step: object) -> None:
            super().apply(step)
            if isinstance(step, Heal):
                time.sleep(0.2)
                clock[0] += 0.2

    session = _SlowHeal(tmp_path)
    schedule = Schedule(
        ("latency",), 0, (Timed(0, Open(*_latency())), Timed(0.1, Heal()), Timed(0.2, Open(*_latency())))
    )
    driver = _Driver(Soak(spec, ops=10), session, schedule, progress=lambda _: None)  # type: ignore[arg-type]
    driver.elapsed = lambda: clock[0]  # type: ignore[method-assign]
    driver.tick()  # opens, heals (0.2 s): the next window, due 0.1 s after the heal, waits
    assert driver.windows == 1
    assert driver.late_s >= 0.2
    clock[0] = 0.3 + driver.late_s  # planned 0.2, pushed back by the heal's time
    driver.tick()
    assert driver.windows == 2
    driver._pace.close()


def test_a_batching_flow_gets_a_window_of_four_full_batches_per_partition_or_worker() -> None:
    (spec,) = resolve("kafka_consumer:inbox-offset-batch", 0, SCENARIOS)
    assert Soak(spec, workers=1).in_flight == 200  # batches of 5 on one partition: the floor
    wide = spec.with_options({"batch_size": 500, "partitions": 3})
    assert Soak(wide, workers=1).in_flight == 6000
    assert Soak(wide, workers=5).in_flight == 4 * 500 * 5
    assert Soak(wide, workers=1, window=1000).in_flight == 1000


def test_after_a_restart_the_schedule_waits_for_the_flow_to_move_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kafka's group settles for seconds after a broker restart, longer than a rest: with restarts
    # named alone the next kill came before anything was out, and a 90 s soak moved 880 operations
    from harness.run.spec.steps import Submit
    from harness.soak import driver as driver_mod
    from harness.soak.driver import _Driver

    (spec,) = resolve("kafka_consumer:inbox-offset", 0, SCENARIOS)
    kill = Open(KillBroker("kafka"), None)
    entries = (Timed(0, kill), Timed(0, Heal()), Timed(0, Open(*_latency())), Timed(0, Heal()), Timed(0, kill))
    session = _Session(tmp_path)
    driver = _Driver(Soak(spec, ops=10, window=10), session, Schedule(("broker",), 0, entries), lambda _: None)  # type: ignore[arg-type]
    driver.elapsed = lambda: 1.0  # type: ignore[method-assign]
    session.apply(Submit(10))  # ten in the flow
    driver.tick()  # the kill and its heal: nothing out since, so the latency window waits
    assert driver.windows == 1
    assert "schedule waits for the flow" in _line(driver)
    driver.tick()
    assert driver.windows == 1
    session.out = 2  # a few outputs read late from before the kill: not a flow that runs again
    driver.tick()
    assert driver.windows == 1
    session.out = 5  # half of the ten in flight at the heal: the schedule goes on, pushed back by the wait
    driver.tick()
    assert driver.windows == 3  # a heal that restarted nothing does not wait: the next kill follows
    assert len(driver.recover_waits) == 1
    assert driver.late_s >= driver.recover_waits[0]
    monkeypatch.setattr(driver_mod, "RECOVER_S", 0.05)
    driver.due.append(Timed(0, Open(*_latency())))
    driver.tick()  # the second kill's heal is due at once (end of schedule: a final heal)
    driver.apply(Heal())
    assert not driver.recovered()
    time.sleep(0.06)
    assert driver.recovered()  # no output for RECOVER_S: the schedule goes on, and the wait is kept
    assert driver.recover_waits[-1] >= 0.05
    driver.apply(Open(KillBroker("kafka"), None))
    driver.apply(Heal())  # the schedule's last step: nothing due after it
    session.out = 7  # half of the five still in flight
    driver.tick()  # the wait still ends when the flow moves, and is counted
    assert len(driver.recover_waits) == 3
    assert "schedule waits" not in _line(driver)
    driver._pace.close()


def test_while_the_soak_submits_a_restart_waits_for_an_operation_submitted_after_its_heal(tmp_path: Path) -> None:
    # A closed loop had all but five operations out when the broker was killed; those five, read
    # late after the heal, were "half of what was in flight", and the next restart came while the
    # group was still rejoining, with nothing out between the two (seen on a faster machine)
    from harness.run.spec.steps import Submit
    from harness.soak.driver import _Driver

    (spec,) = resolve("kafka_consumer:inbox-offset", 0, SCENARIOS)
    kill = Open(KillBroker("kafka"), None)
    entries = (Timed(0, kill), Timed(0, Heal()), Timed(0, Open(*_latency())))
    session = _Session(tmp_path)
    driver = _Driver(Soak(spec, ops=1000, window=10), session, Schedule(("broker",), 0, entries), lambda _: None)  # type: ignore[arg-type]
    driver.elapsed = lambda: 1.0  # type: ignore[method-assign]
    session.apply(Submit(10))
    session.out = 5  # five of the ten still in flight at the kill
    driver.tick()  # the kill and its heal: the latency window waits for the flow
    assert driver.windows == 1
    submitted_at_heal = 10
    session.out = submitted_at_heal  # the five read late: everything submitted before the heal is out
    driver.tick()
    assert driver.windows == 1, "outputs from before the heal are not a group that serves again"
    assert len(session.ops) > submitted_at_heal  # the loop went on submitting
    session.out = submitted_at_heal + 1  # one submitted since the heal came out
    driver.tick()
    assert driver.windows == 2
    assert len(driver.recover_waits) == 1
    driver._pace.close()


def _line(driver: object) -> str:
    lines: list[str] = []
    driver.progress = lines.append  # type: ignore[attr-defined]
    driver.report(1.0, force=True)  # type: ignore[attr-defined]
    return lines[-1]


def test_a_restarts_wait_for_the_flow_starts_once_the_heal_has_restarted_it(tmp_path: Path) -> None:
    # the heal's own seconds already push the schedule back: counted again as a wait, they would
    # push it twice, and the summary would blame the flow for the broker's start
    from harness.run.spec.steps import Submit
    from harness.soak.driver import _Driver

    (spec,) = resolve("kafka_consumer:inbox-offset", 0, SCENARIOS)

    class _SlowRestart(_Session):
        def apply(self, step: object) -> None:
            super().apply(step)
            if isinstance(step, Heal):
                time.sleep(0.2)

    session = _SlowRestart(tmp_path)
    entries = (Timed(0, Open(KillBroker("kafka"), None)), Timed(0, Heal()))
    driver = _Driver(Soak(spec, ops=10, window=10), session, Schedule(("broker",), 0, entries), lambda _: None)  # type: ignore[arg-type]
    driver.elapsed = lambda: 1.0  # type: ignore[method-assign]
    session.apply(Submit(10))
    driver.tick()
    session.out = 5
    driver.tick()
    assert driver.recover_waits[0] < 0.2
    assert driver.late_s >= 0.2  # the heal's time, once
    driver._pace.close()


def test_a_live_compaction_takes_while_the_ledger_grows_and_the_close_finishes_it(tmp_path: Path) -> None:
    import shutil

    import pyarrow.parquet as pq

    from harness.ledger.reader import PARQUET_NAME, compact
    from harness.ledger.schema import Kind
    from harness.ledger.writer import LedgerWriter
    from harness.soak.compacting import LiveCompaction

    ledger = tmp_path / "run" / "ledger"
    with LedgerWriter(ledger, "driver") as w, LiveCompaction(ledger, every_s=0.01) as live:
        for i in range(3000):
            w.emit(Kind.SUBMIT, op=f"op-{i}", dest="orders")
            if i % 500 == 0:
                time.sleep(0.05)  # the thread takes what is written so far
        assert live.compaction.events > 0  # taken while the ledger grew
        assert live.error is None
        once = tmp_path / "once" / "ledger"
        shutil.copytree(ledger / "segments", once / "segments")
        out = live.compaction.finish()
    assert pq.read_table(out).to_pylist() == pq.read_table(compact(once)).to_pylist()
    assert not list(ledger.glob(f"{PARQUET_NAME}.spill*"))


def test_a_live_compaction_waits_between_takes_while_the_run_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer that never stops must not keep the thread taking its few new events back to back
    # (it did: 150 takes in this second, not 10).
    from harness.ledger.reader import Compaction
    from harness.ledger.schema import Kind
    from harness.ledger.writer import LedgerWriter
    from harness.soak.compacting import LiveCompaction

    takes: list[int] = []
    original = Compaction.take

    def counted(self: Compaction, **kwargs: Any) -> int:
        takes.append(1)
        return original(self, **kwargs)

    monkeypatch.setattr(Compaction, "take", counted)
    ledger = tmp_path / "run" / "ledger"
    with LedgerWriter(ledger, "driver") as w, LiveCompaction(ledger, every_s=0.1) as live:
        deadline = time.monotonic() + 1.0
        i = 0
        while time.monotonic() < deadline:
            w.emit(Kind.SUBMIT, op=f"op-{i}", dest="orders")
            i += 1
            time.sleep(0.0005)
        assert live.compaction.events > 0
    assert 3 <= len(takes) <= 15, f"{len(takes)} takes in 1 s at one every 0.1 s"


def test_a_live_compaction_closed_without_a_verdict_leaves_no_spill(tmp_path: Path) -> None:
    from harness.ledger.reader import PARQUET_NAME
    from harness.ledger.schema import Kind
    from harness.ledger.writer import LedgerWriter
    from harness.soak.compacting import LiveCompaction

    ledger = tmp_path / "run" / "ledger"
    with LedgerWriter(ledger, "driver") as w, LiveCompaction(ledger, every_s=0.01) as live:
        w.emit(Kind.SUBMIT, op="op-1", dest="orders")
        time.sleep(0.1)
        assert list(ledger.glob(f"{PARQUET_NAME}.spill*"))
    assert live.compaction.take() == 0
    assert not list(ledger.glob(f"{PARQUET_NAME}.spill*"))
    assert not (ledger / PARQUET_NAME).exists()


def test_a_kafka_soak_gives_each_worker_a_partition() -> None:
    # kafka_consumer:inbox-offset reads one partition: a 20 s soak of 4 workers under kill,pause came
    # out CLEAN with every window counted while only worker-0 consumed; the pauses and the kill hit
    # standbys. A soak raises the partitions to one per worker, and says so in its label.
    (spec,) = resolve("kafka_consumer:inbox-offset", 0, SCENARIOS)
    wide = Soak(spec, duration_s=20, workers=4, nemesis=("kill", "pause"))
    assert soak_spec(wide).settings.partitions == 4  # type: ignore[attr-defined]
    assert "(20s, 4 workers on 4 partitions, closed loop)" in wide.label
    batch = Soak(spec.with_options({"partitions": 3, "batch_size": 500}), ops=1000, workers=1)
    assert soak_spec(batch).settings.partitions == 3  # type: ignore[attr-defined]  # more partitions than workers: kept
    assert "1 worker on 3 partitions" in batch.label
    assert batch.in_flight == 4 * 500 * 3
    services = SCENARIOS.parent / "examples" / "services" / "services_scenario.py"
    (service,) = resolve(f"{services}:go-fixed", 0)
    assert Soak(service, workers=3).partitions is None  # a service's topics are its own
    (stage,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    assert Soak(stage, workers=3).partitions is None
    assert "(60s, 3 workers, closed loop)" in Soak(stage, workers=3).label


def test_a_soak_of_operations_at_a_rate_draws_its_schedule_over_the_seconds_it_submits() -> None:
    # --ops 4000 --rate 200 submits for 20 s; its schedule was drawn over 80 s (the estimate for a
    # closed loop by operations): "13 fault window(s) scheduled" for a run that met 2 of them.
    (spec,) = resolve("onepc_crash_gap:check-then-skip-locked", 0, SCENARIOS)
    paced = Soak(spec, ops=4000, rate=200, workers=3)
    schedule = schedule_of(paced, soak_spec(paced))
    assert max(t.at_s for t in schedule.entries) < 20 + 1.5 * DEFAULT_PACE.hold_s
    closed = Soak(spec, ops=4000, workers=3)  # as fast as the flow goes: enough for a slow flow
    assert max(t.at_s for t in schedule_of(closed, soak_spec(closed)).entries) > 60


def test_the_soaks_summary_keeps_the_kinds_its_schedule_never_drew(tmp_path: Path) -> None:
    # A pytest user gets no console line before the soak starts: soak.json and the plugin's summary say it.
    from harness.soak.driver import SUMMARY, SoakResult, SoakStats, write_summary
    from harness.verify.verdict import Verdict

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    stats = SoakStats(1, 1, 0, 0, 0, 1.0, 1.0, 2.0, 1.0, 1.0, False)

    def summary(soak: Soak) -> dict[str, Any]:
        ran = soak_spec(soak)
        result = SoakResult(tmp_path, Verdict({}, (), {}, "in-process"), ran, soak, schedule_of(soak, ran), stats)
        write_summary(result)
        return dict(json.loads((tmp_path / SUMMARY).read_text()))

    short = summary(Soak(spec, duration_s=30, workers=2, seed=0))
    assert short["nemesis_note"].startswith("this schedule does not draw partition, freeze, broker;"), short
    assert summary(Soak(spec, duration_s=30, workers=2, seed=0, nemesis=("kill",)))["nemesis_note"] is None


def test_after_the_soak_the_note_says_which_kinds_it_opened_not_which_its_schedule_holds(tmp_path: Path) -> None:
    # An --ops soak's schedule is drawn for a slow flow (four times the estimate): a fast flow ends
    # before most of it, and the note of the schedule would say every kind came.
    from harness.soak.driver import SUMMARY, SoakResult, SoakStats, write_summary
    from harness.verify.verdict import Verdict

    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    soak = Soak(spec, ops=200_000, workers=2, seed=0)
    ran = soak_spec(soak)
    schedule = schedule_of(soak, ran)
    assert nemesis_note(soak, ran, schedule) is None  # the schedule draws every kind

    def note(opened: tuple[str, ...] | None) -> object:
        stats = SoakStats(200_000, 1, 0, 0, 0, 41.6, 7.0, 49.0, 1.0, 1.0, False, kinds_opened=opened)
        write_summary(SoakResult(tmp_path, Verdict({}, (), {}, "in-process"), ran, soak, schedule, stats))
        return json.loads((tmp_path / SUMMARY).read_text())["nemesis_note"]

    said = note(("latency", "reset", "kill"))
    assert isinstance(said, str)
    assert said.startswith("this soak opened no partition, pause, freeze, crash, broker, postgres in its 42s"), said
    assert re.search(r"every kind comes by [\d.]+s \(--duration \d+s\)", said), said
    assert note(DEFAULT) is None  # it opened every kind
    assert note(None) is None  # a result that does not tell: the schedule's note


def test_the_summary_line_accounts_for_the_drain_and_the_final_heal() -> None:
    # A 25 s soak whose broker kill was open at its end said "29.0s end to end (submitting 20.3s,
    # closing 0.9s)": the drain and the broker's restart at the final heal were nowhere.
    from harness.cli.soak import _phases
    from harness.soak.driver import SoakStats

    stats = SoakStats(2620, 3, 0, 0, 0, 20.3, 0.9, 29.0, 1.0, 1.0, False, drain_s=2.1, heal_s=5.7)
    assert _phases(stats) == "submitting 20.3s, draining 2.1s, final heal 5.7s, closing 0.9s"
    quick = SoakStats(2000, 0, 0, 0, 0, 5.8, 0.9, 7.4, 1.0, 1.0, False, drain_s=0.04, heal_s=0.01)
    assert _phases(quick) == "submitting 5.8s, closing 0.9s"  # nothing to account for


def test_a_flow_that_counts_no_output_is_paced_and_its_label_says_so() -> None:
    # A DTM soak with no rate runs at 20 ops/s (nothing counts a transfer out while it runs); its
    # label said "closed loop", and a window given for it was ignored.
    (dtm,) = resolve("dtm_transfer:after-commit", 0, SCENARIOS)
    soak = Soak(dtm, duration_s=40, workers=2)
    assert soak.paced
    assert soak.pace_rate == 20.0
    assert (
        soak.label
        == "soak dtm_transfer:after-commit (40s, 2 workers, 20 ops/s: its flow counts no output while it runs)"
    )
    assert Soak(dtm, ops=800).length_s == 40.0  # its schedule covers the 40 s it submits
    with pytest.raises(ConfigError, match="soak window=50 of dtm_transfer:after-commit"):
        Soak(dtm, window=50)
    assert not Soak(dtm, rate=5.0).paced  # a rate given is the pace
    for closed in ("kafka_consumer:inbox-offset", "kafka_saga:fixed"):  # a saga counts the sagas final
        (spec,) = resolve(closed, 0, SCENARIOS)
        assert not Soak(spec).paced
        assert Soak(spec).pace_rate is None


def test_the_start_line_of_a_soak_by_operations_says_how_long_its_schedule_runs() -> None:
    # "--ops 10" printed "34 fault window(s) scheduled" for a run over in a second.
    from harness.soak.driver import _scheduled

    (spec,) = resolve("onepc_crash_gap:naive", 0, SCENARIOS)
    by_ops = Soak(spec, ops=10, workers=2)
    said = _scheduled(by_ops, schedule_of(by_ops, soak_spec(by_ops)))
    assert re.fullmatch(
        r"\d+ fault window\(s\) scheduled over \d+s \(as fast as the flow goes, it meets those due before its "
        r"last operation\)",
        said,
    ), said
    by_time = Soak(spec, duration_s=60, workers=2)
    assert re.fullmatch(
        r"\d+ fault window\(s\) scheduled", _scheduled(by_time, schedule_of(by_time, soak_spec(by_time)))
    )
