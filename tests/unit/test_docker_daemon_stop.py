"""Stopping the dockerd txchaos started: an exited daemon counts as stopped at once, zombie or not."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from harness.stack import docker_engine


def test_an_exited_child_is_ended_though_nobody_reaped_it() -> None:
    child = subprocess.Popen(["sleep", "0"])
    time.sleep(0.3)  # exited, not reaped: a zombie that a signal 0 still reaches
    assert docker_engine._ended(child.pid)


def test_a_running_process_is_not_ended_until_it_exits() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not docker_engine._ended(child.pid)
    finally:
        child.terminate()
    started = time.monotonic()
    while not docker_engine._ended(child.pid):
        assert time.monotonic() - started < 5, "a terminated child never counted as ended"
        time.sleep(0.05)


def test_stop_daemon_returns_as_soon_as_the_daemon_exits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_engine, "engine_dir", lambda: tmp_path)
    daemon = subprocess.Popen(["sleep", "30"])  # stands in for dockerd: exits on SIGTERM
    (tmp_path / "dockerd.pid").write_text(str(daemon.pid))
    started = time.monotonic()
    assert docker_engine.stop_daemon(timeout_s=20) is True
    assert time.monotonic() - started < 3, "stop_daemon waited for a process that had already exited"
