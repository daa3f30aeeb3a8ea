"""A soak's disk room: refused before any service starts when it cannot fit, stopped in time when
the disk fills while it runs, with its books closed and the reason said."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import ConfigError
from harness.run.spec.files import resolve
from harness.soak import Schedule, Soak
from harness.soak.room import BYTES_PER_OP, CLOSE_SHARE, RESERVE_BYTES, Room, check_room, estimated_ops
from tests.unit.test_soak_spec import SCENARIOS, _Session

REPO = Path(__file__).resolve().parents[2]
GB = 10**9


def _soak(**kw: Any) -> Soak:
    (spec,) = resolve("onepc_crash_gap:check-then-skip", 0, SCENARIOS)
    return Soak(spec, **kw)


def test_a_soak_that_cannot_fit_is_refused_naming_its_size_the_free_space_and_what_fits(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        check_room(_soak(ops=1_000_000), tmp_path, free=lambda _: 2 * GB)
    text = str(caught.value) + " " + (caught.value.hint or "")
    assert "soak of 1,000,000 operations needs about 5.1 GB" in text, text
    assert f"{tmp_path} has 2.0 GB free" in text, text
    fits = (2 * GB - RESERVE_BYTES) // int(BYTES_PER_OP * (1 + CLOSE_SHARE))
    assert f"about {fits:,} operations fit" in text, text
    assert "TXCHAOS_REPORTS" in text, text
    check_room(_soak(ops=fits), tmp_path, free=lambda _: 2 * GB)  # what it says fits does


def test_the_operations_known_before_a_soak_runs() -> None:
    assert estimated_ops(_soak(ops=500)) == 500
    assert estimated_ops(_soak(duration_s=60, rate=100)) == 6_001
    assert estimated_ops(_soak(duration_s=60)) is None  # closed loop: the room is watched while it runs


def test_a_closed_loop_for_a_time_is_not_refused_but_watched(tmp_path: Path) -> None:
    check_room(_soak(duration_s=3600), tmp_path, free=lambda _: 0)
    with pytest.raises(ConfigError):
        check_room(_soak(duration_s=3600, rate=1000), tmp_path, free=lambda _: GB)


def test_the_room_the_close_needs_grows_with_the_segments_written(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    room = Room(ledger, free=lambda _: RESERVE_BYTES + 10_000_000)
    assert room.needed() == RESERVE_BYTES  # no ledger yet
    assert room.short() is None
    (ledger / "segments").mkdir(parents=True)
    with (ledger / "segments" / "driver-1.jsonl").open("wb") as fh:
        fh.truncate(100_000_000)  # 100 MB written: the close wants 15 MB of it more
    assert room.needed() == RESERVE_BYTES + int(100_000_000 * CLOSE_SHARE)
    short = room.short()
    assert short is not None
    assert f"under {ledger} has 547 MB free, less than the 552 MB" in short, short


def test_the_free_space_of_a_folder_yet_to_be_made_is_its_disks() -> None:
    from harness.soak.room import free_bytes

    assert free_bytes(Path("/nonexistent/runs/x")) == shutil.disk_usage("/").free


def test_a_disk_filling_stops_the_soak_which_closes_its_books_and_says_why(tmp_path: Path) -> None:
    from harness.soak.driver import _Driver

    session = _Session(tmp_path)
    free = [10 * GB]
    lines: list[str] = []
    room = Room(tmp_path / "ledger", free=lambda _: free[0])
    driver = _Driver(
        _soak(ops=1000, rate=100, tick_s=0.01), session, Schedule(("latency",), 0, ()), lines.append, room=room
    )  # type: ignore[arg-type]
    clock = [0.0]
    driver.elapsed = lambda: clock[0]  # type: ignore[method-assign]
    for t in (0.0, 1.0, 2.0):
        clock[0] = t
        driver.tick()
    submitted = len(session.ops)
    assert submitted > 0
    assert not driver.stopped
    free[0] = RESERVE_BYTES - 1  # something else filled the disk
    clock[0] = 4.0
    driver.tick()
    assert len(session.ops) == submitted, "nothing more is submitted once the disk is short"
    assert driver.stopped.startswith(f"the disk under {tmp_path / 'ledger'} has 537 MB free")
    assert lines[-1] == f"{driver.stopped}; healing, quiescence, closing the books"
    assert not driver.submitting()
    assert not driver.draining()
    assert driver.run() is True  # the loop ends at once: the soak heals and closes as on Ctrl-C
    assert session.folder.doubts == []
    assert driver.error == ""
    driver._pace.close()


def test_the_command_refuses_a_soak_too_large_for_the_disk_before_any_service_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.cli import main

    class _Usage:
        free = GB

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path / "reports"))
    monkeypatch.setenv("TXCHAOS_ENDPOINTS", str(REPO / "no-such-endpoints.json"))  # never reached
    monkeypatch.setattr("harness.soak.room.shutil.disk_usage", lambda _: _Usage())
    assert main(["soak", "onepc_crash_gap:check-then-skip", "--ops", "1000000"]) == 2
    err = capsys.readouterr().err
    assert "soak of 1,000,000 operations needs about 5.1 GB" in err, err
    assert not (tmp_path / "reports").exists(), "nothing was written"
