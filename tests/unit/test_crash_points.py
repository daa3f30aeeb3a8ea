"""A crash point really SIGKILLs the worker process, once per arm, after recording the crash."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.ledger.reader import read_segments
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.worker.crash import CrashArm, CrashPoints, ForcedRedelivery, fired_arms, write_arms

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from harness.ledger.writer import LedgerWriter
    from harness.ledger.schema import Kind
    from harness.worker.crash import CrashPoints
    run = Path(sys.argv[1])
    ledger = LedgerWriter(run / "ledger", "worker-0")
    points = CrashPoints(run, "worker-0", ledger)

    def loop():
        for i in range(5):
            op = f"op{i}"
            ledger.emit(Kind.DELIVER, op=op)
            points.reach("after_db_commit", op=op)
            ledger.emit(Kind.BROKER_COMMIT, op=op)

    if sys.argv[2:] == ["batch"]:
        with ledger.batch():
            loop()
    else:
        loop()
    """
)


def run_child(run: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-c", CHILD, str(run), *args]
    return subprocess.run(argv, capture_output=True, timeout=60, check=False)


def test_armed_point_kills_the_process_once(tmp_path: Path) -> None:
    write_arms(tmp_path, [CrashArm(id="arm-0", point="after_db_commit", op="op2")])
    first = run_child(tmp_path)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()
    assert fired_arms(tmp_path) == {"arm-0"}
    rows = read_segments(tmp_path / "ledger").to_pylist()
    kinds = [(r["kind"], r["op"]) for r in rows]
    # Everything up to the crash is in the ledger; nothing after it.
    assert kinds[-1] == ("crash", "op2")
    assert ("broker_commit", "op1") in kinds
    assert ("broker_commit", "op2") not in kinds
    # The restarted process passes the same point without dying: the arm fired already.
    second = run_child(tmp_path)
    assert second.returncode == 0, second.stderr.decode()


def test_a_kill_inside_a_ledger_batch_writes_what_the_batch_held_first(tmp_path: Path) -> None:
    # a worker holds a batch's events (a Kafka handler's effects) in memory: the crash point must
    # write them, its own crash event last, before the SIGKILL, or the ledger loses them all
    write_arms(tmp_path, [CrashArm(id="arm-0", point="after_db_commit", op="op2")])
    proc = run_child(tmp_path, "batch")
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    kinds = [(r["kind"], r["op"]) for r in read_segments(tmp_path / "ledger").to_pylist()]
    assert kinds == [
        ("deliver", "op0"),
        ("broker_commit", "op0"),
        ("deliver", "op1"),
        ("broker_commit", "op1"),
        ("deliver", "op2"),
        ("crash", "op2"),
    ]


def test_nth_hit_and_worker_filter(tmp_path: Path) -> None:
    write_arms(
        tmp_path,
        [
            CrashArm(id="other", point="after_db_commit", worker="worker-9"),
            CrashArm(id="third", point="after_db_commit", nth=3),
        ],
    )
    result = run_child(tmp_path)
    assert result.returncode == -signal.SIGKILL
    assert fired_arms(tmp_path) == {"third"}
    crash = [r for r in read_segments(tmp_path / "ledger").to_pylist() if r["kind"] == "crash"]
    assert [c["op"] for c in crash] == ["op2"]  # the 3rd hit is the 3rd operation


def test_arms_rewritten_within_one_clock_tick_are_seen(tmp_path: Path) -> None:
    """A worker must see new arms even when both writes share an mtime (coarse timestamps)."""
    import os

    write_arms(tmp_path, [])
    points = CrashPoints(tmp_path, "worker-0", LedgerWriter(tmp_path / "ledger", "w"))
    points.reach("before_db_commit", op="op0")  # caches the empty arm list
    before = (tmp_path / "arms.json").stat()
    write_arms(tmp_path, [CrashArm(id="a", point="after_db_commit", op="op9")])
    os.utime(tmp_path / "arms.json", ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime as before
    assert [a.id for a in points._load()] == ["a"]


def test_redelivery_arm_raises_instead_of_killing(tmp_path: Path) -> None:
    ledger = LedgerWriter(tmp_path / "ledger", "worker-0")
    points = CrashPoints(tmp_path, "worker-0", ledger)
    write_arms(tmp_path, [CrashArm(id="arm-0", point="before_db_commit", op="op1", action="abort_unsubscribe")])
    points.reach("before_db_commit", op="op0")
    with pytest.raises(ForcedRedelivery) as forced:
        points.reach("before_db_commit", op="op1")
    assert (forced.value.action, forced.value.point) == ("abort_unsubscribe", "before_db_commit")
    points.reach("before_db_commit", op="op1")  # fired once: the redelivered message passes
    events = [e for e in read_segments(tmp_path / "ledger").to_pylist() if e["kind"] == Kind.FORCED_REDELIVERY]
    assert [(e["op"], e["point"]) for e in events] == [("op1", "before_db_commit")]


def test_unknown_action_is_refused() -> None:
    with pytest.raises(ConfigError, match="'explode'"):
        CrashArm(id="a", point="after_db_commit", action="explode")
