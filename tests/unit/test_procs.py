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

from harness import procfs
from harness.errors import HarnessError
from harness.stack import procs


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procfs.state(pid) in (None, "Z"):
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


def _dead_owner() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def _claim(registry: Path, tag: str, paths: list[Path], owner: int, owner_start: int | None) -> None:
    (registry / "paths").mkdir(parents=True, exist_ok=True)
    record = {"tag": tag, "owner_pid": owner, "owner_start": owner_start, "paths": [str(p) for p in paths]}
    (registry / "paths" / f"{tag.replace('/', '_')}.json").write_text(json.dumps(record))


def test_reap_removes_the_paths_of_a_dead_owner_and_keeps_a_live_ones(tmp_path: Path) -> None:
    registry = Path(os.environ["TXCHAOS_CACHE"]) / "procs"
    dead_dir, dead_file, live_dir = tmp_path / "pg-dead", tmp_path / "endpoints.json", tmp_path / "pg-live"
    for folder in (dead_dir, live_dir):
        (folder / "base").mkdir(parents=True)
        (folder / "base" / "1").write_bytes(b"x" * 1024)
    dead_file.write_text("{}")
    _claim(registry, "stack/dead/files", [dead_dir, dead_file], _dead_owner(), 1)
    _claim(registry, "stack/live/files", [live_dir], os.getpid(), procs.start_time(os.getpid()))

    reaped = procs.reap_orphans()

    assert not dead_dir.exists()
    assert not dead_file.exists()
    assert f"path {dead_dir}" in reaped
    assert live_dir.exists(), "a running owner's folder was removed"
    assert procs.claimed_tags() == ["stack/live/files"]


def test_claim_then_release_removes_everything_claimed(tmp_path: Path) -> None:
    made = [tmp_path / "a", tmp_path / "b.json"]
    procs.claim_paths("stack/s1/files", made[:1])
    procs.claim_paths("stack/s1/files", made[1:])  # a second claim adds to the first
    made[0].mkdir()
    made[1].write_text("{}")
    assert sorted(procs.release_paths("stack/s1/")) == sorted(str(p) for p in made)
    assert not any(p.exists() for p in made)
    assert procs.claimed_tags() == []


def test_detached_claim_survives_reaping_until_down(tmp_path: Path) -> None:
    folder = tmp_path / "kept"
    folder.mkdir()
    procs.claim_paths("stack/up1/files", [folder], detached=True)
    procs.reap_orphans()
    assert folder.exists(), "a `txchaos up` stack lost its folder to another run's start"
    procs.reap_orphans(include_detached_tag="stack/up1/")
    assert not folder.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing account needs root")
def test_a_server_spawned_as_another_user_keeps_no_root_group(tmp_path: Path) -> None:
    import pwd

    user = next((u for u in ("postgres", "nobody") if u in {e.pw_name for e in pwd.getpwall()}), None)
    if user is None:
        pytest.skip("no postgres or nobody account")
    log = tmp_path / "s.log"
    log.touch()
    os.chmod(tmp_path, 0o755)
    managed = procs.spawn(["sleep", "30"], name="sleeper", tag="test/account", log_path=log, user=user)
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{managed.pid}/status").read_text().splitlines() if ":" in line
        )
        entry = pwd.getpwnam(user)
        assert status["Uid"].split()[0] == str(entry.pw_uid)
        assert status["Gid"].split() == [str(entry.pw_gid)] * 4, status["Gid"]
        assert "0" not in status["Groups"].split(), f"the server kept the root group: {status['Groups']}"
    finally:
        procs.stop(managed, timeout=2)


def test_a_start_keeps_the_newest_logs_of_stopped_stacks_and_every_live_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.stack import local_state as local

    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path / "reports"))
    stacks = tmp_path / "reports" / "stacks"
    names = [f"20260101-0000{i:02d}-abcd" for i in range(local.KEEP_LOGS + 3)]
    for name in names:
        (stacks / name / "logs").mkdir(parents=True)
    (stacks / "docker-project").mkdir()  # not a local stack: never touched
    procs.claim_paths(f"stack/{names[0]}/files", [stacks / names[0] / "kafka"])  # the oldest still runs

    removed = local.prune_stack_logs()

    assert sorted(p.name for p in removed) == names[1:3]
    assert sorted(p.name for p in stacks.iterdir()) == sorted([names[0], *names[3:], "docker-project"])


def test_a_child_killed_by_another_process_leaves_no_zombie(tmp_path: Path) -> None:
    # A broker fault sent from a soak's child process kills a server this process spawned; nobody
    # here polls it. A zombie keeps its pid, and Postgres will not start while its postmaster.pid
    # names a pid that answers.
    proc = procs.spawn(["sleep", "300"], name="sleeper", tag="test/reaped", log_path=tmp_path / "s.log")
    subprocess.run(["kill", "-9", str(proc.pid)], check=True)
    deadline = time.monotonic() + 5
    while procs.start_time(proc.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs.start_time(proc.pid) is None, "the killed child stayed a zombie"
    # The reaper hands the exit code over under Popen's lock a moment after the pid is gone: wait
    # for it (poll() could still say "running" in that moment on a busy machine).
    assert proc.popen.wait(timeout=5) == -signal.SIGKILL
    assert not proc.alive()


def test_a_copy_spawned_for_another_owner_outlives_its_spawner_and_names_that_owner(tmp_path: Path) -> None:
    # A soak in a child of the benchmark restarts a server of the benchmark's stack: the copy must
    # live on after the soak's process ends, and belong to the stack's owner (this process).
    me = procs.Owner.me()
    spawner = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            from pathlib import Path
            from harness.stack.procs import Owner, spawn
            p = spawn(["sleep", "300"], name="copy", tag="test/owned", log_path=Path({str(tmp_path)!r}) / "c.log",
                      owner=Owner({me.pid}, {me.start}))
            print(p.pid, flush=True)
        """),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    copy = int(spawner.stdout.split()[0])
    try:
        time.sleep(0.3)  # PDEATHSIG, had it been set, fires as the spawner exits
        assert procs.start_time(copy) is not None, "the copy died with the process that spawned it"
        (record,) = (Path(os.environ["TXCHAOS_CACHE"]) / "procs").glob("test_owned-*.json")
        assert json.loads(record.read_text())["owner_pid"] == me.pid
        assert procs.reap_orphans() == []  # its owner lives
    finally:
        procs.kill_group(copy, signal.SIGKILL)


def test_free_ports_are_distinct_bindable_and_below_the_kernels_ephemeral_range() -> None:
    # a port bind(0) handed out and freed can go to any outgoing connection before the server
    # meant to listen on it binds: listening ports come from below the ephemeral range
    import socket

    from harness.stack.procs import LISTEN_PORTS_FLOOR, ephemeral_range, free_ports

    low, _ = ephemeral_range()
    ports = free_ports(20) + free_ports(20)
    assert len(set(ports)) == 40  # never the same port twice in one process
    assert all(LISTEN_PORTS_FLOOR <= p < low for p in ports), ports
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_the_ephemeral_range_is_read_from_the_kernel_or_linuxs_default(tmp_path: Path) -> None:
    from harness.stack.procs import ephemeral_range

    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_range(tmp_path / "range") == (40000, 50000)
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)


def test_no_free_port_left_is_one_error_naming_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "_handed_out", set(range(1024, 65536)))
    with pytest.raises(HarnessError, match=r"found only 0 of 2 free loopback ports in \d+-\d+") as info:
        procs.free_ports(2)
    assert "ss -ltn" in str(info.value.hint)
