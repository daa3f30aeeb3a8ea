"""The worker pool's restart backoff: at once after a crash, slower for a process that keeps ending."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run.processes.supervisor import BACKOFF_MAX_S, OUTAGE_BACKOFF_MAX_S, QUICK_EXIT_S, WorkerPool


def _pool(tmp_path: Path) -> WorkerPool:
    return WorkerPool([], tmp_path, ledger=None, restart_delay=0.01)  # type: ignore[arg-type]


def test_a_process_that_ran_a_while_is_started_again_at_once(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    pool._born["w0"] = 100.0
    assert pool.backoff("w0", 100.0 + QUICK_EXIT_S + 5) == pytest.approx(0.01)  # a crash point, a nemesis kill
    pool._born["w0"] = 200.0
    assert pool.backoff("w0", 200.0 + QUICK_EXIT_S + 1) == pytest.approx(0.01)


def test_quick_exits_in_a_row_double_the_wait_up_to_the_cap_and_a_long_life_resets_it(tmp_path: Path) -> None:
    """A worker that cannot reach a killed broker ends right after each start: 1, 2, 4... times the delay."""
    pool = _pool(tmp_path)
    waits = []
    now = 0.0
    for _ in range(10):
        pool._born["w0"] = now
        now += 0.05  # ended 50 ms after its start
        waits.append(pool.backoff("w0", now))
        now += waits[-1]
    assert waits[:5] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16])
    assert waits[-1] == BACKOFF_MAX_S
    assert max(waits) == BACKOFF_MAX_S
    pool._born["w0"] = now
    assert pool.backoff("w0", now + QUICK_EXIT_S + 0.1) == pytest.approx(0.01)  # it served: back to at once


def test_a_process_that_never_got_ready_backs_off_longer(tmp_path: Path) -> None:
    """A worker that cannot even subscribe (its broker killed) waits up to a second: a five-second
    outage then forks it about eleven times, not twenty-five, and the heal starts it at once anyway."""
    pool = _pool(tmp_path)
    waits = []
    now = 0.0
    for _ in range(12):
        pool._born["w0"] = now
        now += 0.05
        waits.append(pool.backoff("w0", now, ready=False))
        now += waits[-1]
    assert waits[:5] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16])
    assert max(waits) == waits[-1] == OUTAGE_BACKOFF_MAX_S > BACKOFF_MAX_S
    pool._born["w0"] = now
    # once it served, a quick exit (a crash point met right after it subscribed) keeps the short cap
    assert pool.backoff("w0", now + 0.05, ready=True) == BACKOFF_MAX_S


def test_each_process_has_its_own_streak(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    for name in ("w0", "w0", "w0", "w1"):
        pool._born[name] = 0.0
        wait = pool.backoff(name, 0.1)
    assert wait == pytest.approx(0.01)  # w1's first quick exit
    assert pool._streak == {"w0": 3, "w1": 1}


def test_a_heal_starts_every_waiting_process_at_once_and_forgets_the_streaks(tmp_path: Path) -> None:
    """Backoff is for the outage; once the fault is healed, a worker must not wait out a second more."""
    pool = _pool(tmp_path)
    pool._streak = {"w0": 7}
    pool._due = {"w0": 1e12, "w1": 1e12}
    started: list[str] = []
    pool._start = lambda spec: started.append(spec.name)  # type: ignore[method-assign]
    pool.specs = [_Named("w0"), _Named("w1")]

    def one_round() -> None:  # the monitor's loop, once, then told to stop
        pool._stopping.wait = lambda _s: pool._stopping.set()  # type: ignore[method-assign]
        pool._rounds()

    pool.expedite()
    one_round()
    assert started == ["w0", "w1"]
    assert pool._streak == {}
    assert pool._due == {}


class _Named:
    def __init__(self, name: str) -> None:
        self.name, self.stage = name, "s"
