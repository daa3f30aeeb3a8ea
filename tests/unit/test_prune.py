"""``txchaos prune``: old run folders go on request, by age and/or count; nothing else under the
runs folder, and no folder still in use, is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import ConfigError
from harness.ledger.reader import SPILL_PREFIX
from harness.run.core.retention import BUSY_S, plan

DAY = 86400.0


def _run(root: Path, days_ago: float, name: str = "onepc-naive-s0-ab12", *, size: int = 1000) -> Path:
    """A run folder begun ``days_ago`` days ago, its files written then."""
    started = time.time() - days_ago * DAY
    folder = root / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}-{name}"
    (folder / "ledger" / "segments").mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    (folder / "ledger" / "segments" / "driver-1.jsonl").write_bytes(b"x" * size)
    for f in folder.rglob("*"):
        os.utime(f, (started, started))
    return folder


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path))
    root = tmp_path / "runs"
    root.mkdir()
    return root


def test_older_than_removes_only_the_old_run_folders_and_says_what_it_freed(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = [_run(runs, 10, "a-s0-0001", size=2_000_000), _run(runs, 8, "b-s0-0002", size=1_000_000)]
    young = _run(runs, 2, "c-s0-0003")
    (runs / "notes.txt").write_text("mine")  # not a run folder
    (runs / "20250101-000000-not-a-run").mkdir()  # named like one, but no manifest and no ledger
    elsewhere = _run(runs.parent / "elsewhere", 30, "theirs-s0-0004")
    (runs / "20250101-000000-link-s0-0005").symlink_to(elsewhere)  # a link: neither it nor its target goes
    assert main(["prune", "--older-than", "7d"]) == 0
    out = capsys.readouterr().out
    assert [p.exists() for p in old] == [False, False]
    assert young.is_dir()
    assert (runs / "notes.txt").read_text() == "mine"
    assert (runs / "20250101-000000-not-a-run").is_dir()
    assert (runs / "20250101-000000-link-s0-0005").is_symlink()
    assert (elsewhere / "manifest.json").is_file()
    assert "removed 2 run folder(s), 0.00 GB freed; 1 stay" in out, out
    assert f"removing {old[0].name}  (2.0 MB, 10.0d old)" in out, out


def test_keep_leaves_the_newest_and_both_rules_must_hold(runs: Path) -> None:
    folders = [_run(runs, d, f"r{d}-s0-000{d}") for d in (9, 8, 3, 2, 1)]
    picked = plan(runs, older_than_s=None, keep=2)
    assert [r.path for r in picked.remove] == folders[:3]
    assert picked.kept == 2
    both = plan(runs, older_than_s=5 * DAY, keep=4)  # older than 5 days and beyond the newest 4
    assert [r.path for r in both.remove] == folders[:1]
    assert plan(runs, older_than_s=None, keep=10).remove == ()
    assert len(plan(runs, older_than_s=None, keep=0).remove) == 5


def test_dry_run_lists_and_removes_nothing(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _run(runs, 10)
    assert main(["prune", "--keep", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert old.is_dir()
    assert f"would remove {old.name}" in out, out
    assert "1 run folder(s), 0.00 GB, would go; 0 would stay" in out, out


def test_a_folder_in_use_stays(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = _run(runs, 10, "written-s0-0001")
    (written / "ledger" / "segments" / "driver-1.jsonl").write_bytes(b"more")  # written just now
    compacting = _run(runs, 10, "compacting-s0-0002")
    spill = compacting / "ledger" / f"{SPILL_PREFIX}{os.getpid()}"  # this process: alive
    spill.mkdir()
    os.utime(spill, (time.time() - 2 * BUSY_S,) * 2)
    dead = _run(runs, 10, "dead-s0-0003")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (dead / "ledger" / f"{SPILL_PREFIX}{gone.stdout.strip()}").mkdir()  # its process has ended
    os.utime(dead / "ledger", (time.time() - 2 * BUSY_S,) * 2)
    assert main(["prune", "--older-than", "1d"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert written.is_dir()
    assert compacting.is_dir()
    assert not dead.exists()
    assert f"kept {written.name}: in use (written 0m ago; a folder written in the last 10m may belong to" in out, out
    assert f"kept {compacting.name}: in use (a soak is compacting its ledger)" in out, out


@pytest.mark.parametrize(
    ("args", "named", "fix"),
    [
        ([], "prune needs a rule", "--older-than 7d"),
        (["--older-than", "soon"], "'soon'", "7d"),
        (["--keep", "-1"], "--keep -1", "newest"),
    ],
)
def test_a_bad_rule_is_refused_naming_it(
    runs: Path, args: list[str], named: str, fix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = _run(runs, 10)
    assert main(["prune", *args]) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert fix in err, err
    assert kept.is_dir()


def test_plan_refuses_a_negative_age(runs: Path) -> None:
    with pytest.raises(ConfigError, match="negative"):
        plan(runs, older_than_s=-1, keep=None)
