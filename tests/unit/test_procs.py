"""Nothing the harness starts outlives it: PDEATHSIG on owner death, and reaping of leaked records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.stack import procs


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.start_time(pid) is None:
            return True
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path / "cache"))


def test_child_dies_with_a_sigkilled_owner(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from pathlib import Path
            from harness.stack.procs import spawn
            log = Path({str(tmp_path)!r}) / "s.log"
            p = spawn(["sleep", "300"], name="sleeper", tag="test/pdeathsig", log_path=log)
            print(p.pid, flush=True)
            time.sleep(300)
        """),
        ],
        stdout=subprocess.PIPE,
        env=dict(os.environ),
    )
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    assert procs.start_time(child) is not None
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    assert _gone(child), "the server child outlived its SIGKILLed owner"


def test_reap_orphans_kills_leaked_tagged_process(tmp_path: Path) -> None:
    env = dict(os.environ, **{procs.TAG_VAR: "test/leak"})
    leaked = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    registry = Path(os.environ["TXCHAOS_CACHE"]) / "procs"
    registry.mkdir(parents=True)
    (registry / f"leak-{leaked.pid}.json").write_text(
        json.dumps(
            {"pid": leaked.pid, "tag": "test/leak", "name": "sleep", "owner_pid": dead_owner.pid, "owner_start": 1}
        )
    )
    # A record of a live owner is left alone.
    (registry / "mine.json").write_text(
        json.dumps(
            {
                "pid": leaked.pid,
                "tag": "test/other",
                "name": "x",
                "owner_pid": os.getpid(),
                "owner_start": procs.start_time(os.getpid()),
            }
        )
    )
    reaped = procs.reap_orphans()
    leaked.wait(5)
    assert leaked.returncode == -signal.SIGKILL
    assert any("test/leak" in r for r in reaped)
    assert (registry / "mine.json").exists()


def test_reap_ignores_reused_pid_without_tag(tmp_path: Path) -> None:
    innocent = subprocess.Popen(["sleep", "300"], start_new_session=True)  # no tag in its environment
    try:
        registry = Path(os.environ["TXCHAOS_CACHE"]) / "procs"
        registry.mkdir(parents=True)
        (registry / "old.json").write_text(
            json.dumps(
                {"pid": innocent.pid, "tag": "test/old", "name": "x", "owner_pid": 999_999_999, "owner_start": 1}
            )
        )
        assert procs.reap_orphans() == []
        assert innocent.poll() is None
    finally:
        innocent.kill()
        innocent.wait()
