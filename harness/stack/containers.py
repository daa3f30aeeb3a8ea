"""A service under test as a Docker container: the ``docker run`` command, its process, its removal.

The container runs on the host's network, so it reaches the trap relays on 127.0.0.1 exactly as a
process would; ``docker run`` stays attached, so the container's output is the instance's log and
its end is the instance's end. Every container carries the label ``txchaos.run=<run id>``: what a
run started is removed when it ends (``remove_run``), and ``reap_run`` finds what a killed run
left. The container's init process, seen from the host, is what a trap kills or freezes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable

from harness.errors import ConfigError
from harness.stack.procs import start_time

RUN_LABEL = "txchaos.run"
OWNER_LABEL = "txchaos.service-owner"  # "<pid>:<start time>" of the harness process that ran it


def image_present(image: str) -> bool:
    """Return whether ``image`` is in the local Docker engine (refusing when no engine answers)."""
    try:
        proc = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise ConfigError("a service image needs the docker command", hint="run `txchaos install --docker`") from exc
    if proc.returncode != 0 and "Cannot connect" in proc.stderr:
        raise ConfigError(
            f"no Docker engine answers: {proc.stderr.strip()[:200]}", hint="run `txchaos install --docker`"
        )
    return proc.returncode == 0


def run_argv(image: str, args: tuple[str, ...], env: Iterable[str], *, name: str, run_id: str) -> tuple[str, ...]:
    """Return the ``docker run`` command of one container of ``image``, on the host's network.

    ``env`` names the variables the container gets; their values come from the environment of
    ``docker run`` itself, so no value (a password) shows in the process list.
    """
    flags = [f"--env={k}" for k in env]
    owner = f"{os.getpid()}:{start_time(os.getpid())}"
    return (
        "docker", "run", "--rm", "--network=host", f"--name={name}", f"--label={RUN_LABEL}={run_id}",
        f"--label={OWNER_LABEL}={owner}", *flags, image, *args,
    )  # fmt: skip


def init_pid(name: str) -> int | None:
    """Return the host pid of container ``name``'s init process (None: not running)."""
    proc = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True, timeout=30
    )
    pid = int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0
    return pid or None


def reap_orphans() -> list[str]:
    """Remove every service container whose harness process is gone (SIGKILLed mid-run); return their ids.

    ``docker run`` dies with the harness, its container does not: the next run with an image finds it here.
    """
    fmt = f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}'
    found = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}", "--format", fmt],
        capture_output=True,
        text=True,
        timeout=30,
    )
    stale = []
    for line in found.stdout.splitlines():
        cid, _, owner = line.partition(" ")
        pid, _, started = owner.partition(":")
        if not (pid.isdigit() and str(start_time(int(pid))) == started):
            stale.append(cid)
    if stale:
        subprocess.run(["docker", "rm", "-f", *stale], capture_output=True, text=True, timeout=60)
    return stale


def remove_run(run_id: str) -> list[str]:
    """Remove (force) every container of run ``run_id``; return their ids."""
    found = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label={RUN_LABEL}={run_id}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    ids = found.stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, text=True, timeout=60)
    return ids
