"""The worker fork server: forks on request, reports each worker's end, and takes its workers with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A server whose "worker" does what its spec file says: exit N, kill itself, or sleep.
SERVER = """
import gc, os, signal, sys, time
from pathlib import Path
from harness.worker.zygote import serve

def run(spec: Path) -> None:
    what, _, arg = spec.read_text().partition(" ")
    print(f"worker {os.getpid()} says {what}", flush=True)
    if what == "gc":
        print(f"frozen {gc.get_freeze_count()} threshold {gc.get_threshold()[0]}", flush=True)
    if what == "exit":
        sys.exit(int(arg))
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(arg))

sys.exit(serve(run))
"""


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait(10)


def _ask(server: subprocess.Popen[bytes], tmp_path: Path, name: str, what: str) -> int:
    spec = tmp_path / f"{name}.spec"
    spec.write_text(what)
    assert server.stdin is not None
    assert server.stdout is not None
    server.stdin.write(f"{spec}\t{tmp_path / name}.log\n".encode())
    server.stdin.flush()
    word, pid = server.stdout.readline().decode().split()
    assert word == "pid"
    return int(pid)


def _report(server: subprocess.Popen[bytes]) -> list[str]:
    assert server.stdout is not None
    return server.stdout.readline().decode().split()


def test_each_end_is_reported_with_its_returncode(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    pid = _ask(server, tmp_path, "a", "exit 3")
    assert _report(server) == ["exit", str(pid), "3"]
    pid = _ask(server, tmp_path, "b", "kill")
    assert _report(server) == ["exit", str(pid), "-9"]  # as subprocess reports a SIGKILL
    assert (tmp_path / "b.log").read_text() == f"worker {pid} says kill\n"


def test_a_worker_runs_in_its_own_process_group(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    pid = _ask(server, tmp_path, "c", "sleep 30")
    assert os.getpgid(pid) == pid != os.getpgid(server.pid)
    os.killpg(pid, 9)
    assert _report(server) == ["exit", str(pid), "-9"]


def test_workers_die_with_the_server(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    pid = _ask(server, tmp_path, "d", "sleep 30")
    server.kill()  # as when the harness above it is SIGKILLed
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.02)
    assert not Path(f"/proc/{pid}").exists()


def test_eof_stops_the_server(server: subprocess.Popen[bytes]) -> None:
    assert server.stdin is not None
    server.stdin.close()
    assert server.wait(10) == 0


def test_a_worker_starts_with_the_servers_imports_frozen_out_of_collections(
    server: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    from harness.worker.zygote import GEN0_THRESHOLD

    pid = _ask(server, tmp_path, "g", "gc 0")
    assert _report(server) == ["exit", str(pid), "0"]
    said, frozen = (tmp_path / "g.log").read_text().splitlines()
    assert said == f"worker {pid} says gc"
    words = frozen.split()
    assert words[0] == "frozen"
    assert int(words[1]) > 1_000  # the interpreter's and the harness's own objects
    assert words[2:] == ["threshold", str(GEN0_THRESHOLD)]
