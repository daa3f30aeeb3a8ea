"""Spawn, stop and reap the OS processes the harness starts (servers and workers).

Every process runs in its own process group so a stop takes its children with it. Two
mechanisms make sure nothing outlives the harness:

- a *session-owned* process gets ``PR_SET_PDEATHSIG=SIGKILL``: when the harness process dies,
  even by SIGKILL, the kernel kills the child at once;
- every process is recorded in ``<cache>/procs/``; the next harness start reaps any record
  whose owner is gone (checked by pid *and* start time, so a reused pid is not mistaken) and
  whose process still carries the harness's tag in its environment.

The files and folders a stack creates (a Postgres data folder of about 41 MB, broker data) are
recorded the same way, in ``<cache>/procs/paths/``, *before* they are created: the reaper that
kills a dead owner's processes also removes its paths, so a SIGKILLed run leaks nothing past
the next start.

A *detached* process (``txchaos up``) has no owner: only ``txchaos down`` stops it.

The process that spawns a child reaps it the moment it ends, whoever ended it (a broker fault
sent from another process): a zombie keeps its pid, and Postgres refuses to start again on a
data folder whose ``postmaster.pid`` names a pid that still answers.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness import procfs
from harness.errors import HarnessError
from harness.paths import cache_root

TAG_VAR = "TXCHAOS_PROC_TAG"
_PR_SET_PDEATHSIG = 1


def _registry() -> Path:
    path = cache_root() / "procs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _paths_registry() -> Path:
    path = _registry() / "paths"
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_time(pid: int) -> int | None:
    """Return the kernel start time (clock ticks) of ``pid``, or None when it is gone."""
    stat = procfs.read(pid)
    return None if stat is None else stat.start_ticks


def _has_tag(pid: int, tag: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{TAG_VAR}={tag}".encode() in env.split(b"\0")


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ProcessHandle(Protocol):
    """What the harness needs of a started process: ``subprocess.Popen``, or a forked worker's handle."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Managed:
    """A process the harness started, with its log file and registry record."""

    name: str
    popen: ProcessHandle
    log_path: Path
    record: Path
    tag: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def spawn(
    argv: Sequence[str],
    *,
    name: str,
    tag: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
    detached: bool = False,
    stdin_pipe: bool = False,
    stdout_pipe: bool = False,
    owner: Owner | None = None,
) -> Managed:
    """Start ``argv`` in a new process group with output to ``log_path``, and record it.

    Call it from a thread that outlives the child (the main thread): PDEATHSIG fires when the
    spawning *thread* exits. ``owner``: the process the child belongs to when that is not this
    one (a service a soak's child process restarts belongs to the stack's owner): the child then
    outlives this process, and the reaper kills it once its owner is gone (no PDEATHSIG).
    ``stdin_pipe`` / ``stdout_pipe`` give the child pipes on stdin / stdout (``popen.stdin`` /
    ``popen.stdout``; stderr still goes to the log). A ``user`` child
    runs with that account's uid *and* gid and no other group (see ``account``).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ if env is None else env)
    full_env[TAG_VAR] = tag
    mine = not detached and (owner is None or owner.pid == os.getpid())
    preexec: Callable[[], None] | None = _die_with_parent if mine else None
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else log,
            stderr=log if stdout_pipe else subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            **account(user),
            start_new_session=True,
            preexec_fn=preexec,
        )
    threading.Thread(target=_reap, args=(popen,), name=f"reap-{name}-{popen.pid}", daemon=True).start()
    record = write_record(popen.pid, name=name, tag=tag, argv0=argv[0], detached=detached, owner=owner)
    return Managed(name=name, popen=popen, log_path=log_path, record=record, tag=tag)


def _reap(popen: subprocess.Popen[bytes]) -> None:
    """Wait for ``popen`` so it never lingers as a zombie; ``poll`` and ``wait`` elsewhere still
    see its exit code (``Popen`` hands it over under its own lock)."""
    with contextlib.suppress(Exception):
        popen.wait()


@dataclass(frozen=True)
class Owner:
    """The process a spawned process belongs to: the reaper kills what it leaves once it is gone.

    ``start`` is its kernel start time, so a reused pid is not mistaken for it.
    """

    pid: int
    start: int | None

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), start_time(os.getpid()))


def account(user: str | None) -> dict[str, Any]:
    """Return the ``subprocess`` keywords that run a child as ``user`` alone: uid, gid, no other group.

    ``user=`` alone changes only the uid: a child of root would keep gid 0 and the root group,
    and could then read and write whatever the root group can.

    >>> account(None)
    {}
    """
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def write_record(
    pid: int, *, name: str, tag: str, argv0: str, detached: bool = False, owner: Owner | None = None
) -> Path:
    """Record ``pid`` (which carries ``tag`` in its environment) so a later start reaps it if leaked
    (once ``owner``, this process by default, is gone; never when ``detached``)."""
    who = None if detached else owner or Owner.me()
    record = _registry() / f"{tag.replace('/', '_')}-{pid}.json"
    record.write_text(
        json.dumps(
            {
                "pid": pid,
                "tag": tag,
                "name": name,
                "owner_pid": who.pid if who else None,
                "owner_start": who.start if who else None,
                "argv0": argv0,
            }
        )
    )
    return record


def claim_paths(tag: str, paths: Sequence[Path], *, detached: bool = False) -> Path:
    """Record ``paths`` as created under ``tag``: removed by ``release_paths`` or, once the owner is gone, the reaper.

    Call it *before* creating them, so a SIGKILL between the two leaks nothing. Claiming again
    under the same tag adds to the record.
    """
    owner = None if detached else os.getpid()
    record = _paths_registry() / f"{tag.replace('/', '_')}.json"
    known: list[str] = []
    with contextlib.suppress(OSError, ValueError):
        known = list(json.loads(record.read_text())["paths"])
    wanted = known + [str(p) for p in paths if str(p) not in known]
    tmp = record.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {"tag": tag, "owner_pid": owner, "owner_start": start_time(owner) if owner else None, "paths": wanted}
        )
    )
    tmp.replace(record)  # a reaper never reads half a record
    return record


def claimed_tags() -> list[str]:
    """Return the tags that hold a claim on paths now (their owner runs, or was detached)."""
    tags = []
    for record in sorted(_paths_registry().glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            tags.append(str(json.loads(record.read_text())["tag"]))
    return tags


def read_records(folder: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yield each JSON record in ``folder`` with its content, by name; one that cannot be read is passed over."""
    for record in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        yield record, rec


def release_paths(tag_prefix: str) -> list[str]:
    """Remove every path claimed under a tag starting with ``tag_prefix``, and the claims; returns the paths."""
    removed = []
    for record, rec in read_records(_paths_registry()):
        if str(rec.get("tag", "")).startswith(tag_prefix):
            removed += _remove_claimed(record, rec)
    return removed


def _remove_claimed(record: Path, rec: dict[str, object]) -> list[str]:
    paths = rec.get("paths")
    removed = []
    for raw in paths if isinstance(paths, list) else []:
        path = Path(str(raw))
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path))
    record.unlink(missing_ok=True)
    return removed


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(proc: Managed, *, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
    """Stop ``proc``'s process group: ``sig``, then SIGKILL after ``timeout``; returns its exit code."""
    if proc.alive():
        kill_group(proc.pid, sig)
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)
    # Children of the group (postgres backends) may linger a moment after the leader exits.
    kill_group(proc.pid, signal.SIGKILL)
    proc.record.unlink(missing_ok=True)
    return proc.popen.returncode


def _owner_alive(rec: dict[str, object]) -> bool:
    owner = rec.get("owner_pid")
    if owner is None:
        return True  # detached: owned by the user until `txchaos down`
    assert isinstance(owner, int)
    return start_time(owner) == rec.get("owner_start")


def reap_orphans(*, include_detached_tag: str | None = None) -> list[str]:
    """Kill every recorded process whose owner is gone, then remove its claimed paths; returns what was reaped.

    ``include_detached_tag`` also reaps detached processes and paths whose tag starts with it
    (``txchaos down`` of a stack whose CLI process is long gone).
    """
    reaped = []
    for path in sorted(_registry().glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        pid, tag = int(rec["pid"]), str(rec["tag"])
        wanted = include_detached_tag is not None and tag.startswith(include_detached_tag)
        if _owner_alive(rec) and not wanted:
            continue
        if _has_tag(pid, tag):
            kill_group(pid, signal.SIGKILL)
            kill_group_wait(pid)
            reaped.append(f"{rec.get('name')} pid {pid} ({tag})")
        path.unlink(missing_ok=True)
    # Paths after processes: a live server could still be writing into its folder.
    for record in sorted(_paths_registry().glob("*.json")):
        try:
            claim = json.loads(record.read_text())
        except (OSError, ValueError):
            continue  # being written (a .tmp is never globbed), or damaged: never guess what to delete
        wanted = include_detached_tag is not None and str(claim.get("tag", "")).startswith(include_detached_tag)
        if wanted or not _owner_alive(claim):
            reaped += [f"path {p}" for p in _remove_claimed(record, claim)]
    return reaped


def kill_group_wait(pid: int, timeout: float = 5.0) -> None:
    """Wait until ``pid`` is gone (it is not our child when reaped from an earlier run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procfs.state(pid) in (None, "Z"):
            return
        time.sleep(0.05)


# Listening ports are drawn below the kernel's ephemeral range: a port the kernel handed out to
# ``bind(0)`` and then freed can be taken by any outgoing connection (a worker's, a proxy's) before
# the server that was meant to listen on it binds, and the server then fails to start.
LISTEN_PORTS_FLOOR = 10_000
_handed_out: set[int] = set()  # never hand a port out twice in one process


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """Return the kernel's range of ports for outgoing connections (Linux's default without /proc)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct TCP ports free on loopback now, none of them one the kernel could give
    an outgoing connection in the meantime (drawn at random below its ephemeral range, so two
    processes starting stacks at once rarely draw the same)."""
    import random
    import socket

    low, high = ephemeral_range()
    if low - LISTEN_PORTS_FLOOR >= 1000:
        lo, hi = LISTEN_PORTS_FLOOR, low - 1
    elif 65535 - high >= 1000:
        lo, hi = high + 1, 65535
    else:  # the whole port space is ephemeral: no port is safe from the race, draw from all of it
        lo, hi = 1024, 65535
    draw = random.SystemRandom()
    ports: list[int] = []
    for _ in range(50 * n + 100):
        if len(ports) == n:
            return ports
        port = draw.randint(lo, hi)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        ports.append(port)
    raise HarnessError(
        f"found only {len(ports)} of {n} free loopback ports in {lo}-{hi}",
        hint="free some listening ports (ss -ltn shows them), or widen the range below net.ipv4.ip_local_port_range",
    )
