"""``harness.procfs``: one process's /proc stat, read the same way by every module that needs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import procfs


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    line = "42 (odd ) name (x) T 7 1 1 0 -1 4194560 10 0 0 0 300 200 0 0 20 0 1 0 123456 1000 50\n"
    stat = procfs.parse(line)
    assert stat == procfs.ProcStat(name="odd ) name (x", state="T", ppid=7, cpu_ticks=500, start_ticks=123456)


def test_a_torn_line_is_refused_and_a_torn_file_reads_as_gone(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a /proc"):
        procfs.parse("42 (python) S 1 1")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (python) S 1 1")
    assert procfs.read(42, tmp_path) is None
    assert procfs.read(43, tmp_path) is None  # no such process


def test_a_real_child_is_read_while_it_runs_stops_and_after_it_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stat = procfs.read(child.pid)
        assert stat is not None
        assert (stat.ppid, stat.name) == (os.getpid(), Path(sys.executable).name[:15])
        assert stat.start_ticks > 0
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while (now := procfs.read(child.pid)) is not None and now.state != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert now is not None
        assert now.state == "T"
        assert now.start_ticks == stat.start_ticks  # the same process
        assert procfs.state(child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert procfs.read(child.pid) is None
    assert procfs.state(child.pid) is None
