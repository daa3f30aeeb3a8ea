"""The docker stack's Compose project as the docker CLI sees it: can it run here, its containers, their reaping.

Every container carries ``txchaos.stack`` and ``txchaos.owner`` (the owning pid, or ``detached``
for ``txchaos up``); ``reap`` removes what an owner that is gone (a SIGKILLed runner) left. A
broker fault kills one service's container and starts it again (``kill_service``,
``start_service``). Only the ``docker`` CLI is used (no SDK, no testcontainers reaper).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness import resources
from harness.errors import StackError
from harness.stack.docker_images import IMAGES, has_image

# Must equal the compose file's top-level ``name:`` (checked by compose_topology_errors).
COMPOSE_PROJECT = "txchaos"
COMPOSE_FILE = resources.compose_file()
STACK_LABEL = "txchaos.stack"
OWNER_LABEL = "txchaos.owner"
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
DETACHED = "detached"
LOG_TAIL_LINES = 40


def docker(*args: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; a missing CLI or a hung daemon is a StackError naming the command."""
    try:
        return subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False, input=stdin
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(
            f"`docker {' '.join(args[:3])}` failed: {exc}", hint="check that the Docker daemon answers"
        ) from exc


def docker_available(timeout_s: float = 2.0) -> bool:
    """Return True only if a Docker daemon answers within about ``timeout_s``; never raise."""
    try:
        proc = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=timeout_s + 3,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def compose_v2() -> str | None:
    """Return the Compose v2 plugin's version, or None when ``docker compose`` does not answer."""
    try:
        proc = subprocess.run(
            ["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # Only the v2 plugin answers `docker compose` (v1 is the separate `docker-compose` program).
    return (proc.stdout or "").strip().removeprefix("v") if proc.returncode == 0 else None


def docker_unusable(compose_file: Path | None = None, timeout_s: float = 2.0) -> str | None:
    """Return why the docker provider cannot run the stack here, or None when it can; never raise.

    ``auto`` takes docker only on None: a daemon answers, Compose v2 is there, the compose file
    ships, every image is on the daemon (building them takes minutes, so it is never implicit), and
    no other live session's docker stack holds the fixed ports.
    """
    compose = compose_file or COMPOSE_FILE
    if not compose.is_file():
        return f"no compose file at {compose}"
    if not docker_available(timeout_s):
        return "no Docker daemon answers"
    if compose_v2() is None:
        return "`docker compose` (Compose v2) is not available"
    missing = _missing_images(timeout_s)
    if missing:
        return (
            f"image(s) {', '.join(missing)} not on the daemon (none is pulled: `txchaos install --docker` builds them)"
        )
    # The ports are fixed: while another session's stack runs, a second one cannot.
    busy = [c for c in containers() if c.running and not owner_gone(c.owner)]
    if busy:
        return f"the docker stack is in use by {who(busy[0].owner)}"
    return None


def _missing_images(timeout_s: float) -> list[str]:
    """Return the stack's images the daemon does not hold (all of them when it cannot say)."""
    try:
        return [ref for ref in IMAGES.values() if not has_image(ref)]
    except StackError:
        return list(IMAGES.values())


# -- containers, and reaping ---------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """A container of a txchaos docker stack, as ``docker ps`` lists it."""

    id: str
    service: str
    owner: str
    running: bool


def containers(project: str = COMPOSE_PROJECT, *, service: str | None = None) -> list[Container]:
    """Return the containers of ``project`` (one ``service`` of it), running or not."""
    filters = ["--filter", f"label={PROJECT_LABEL}={project}"]
    if service:
        filters += ["--filter", f"label={SERVICE_LABEL}={service}"]
    fmt = f'{{{{.ID}}}} {{{{.Label "{SERVICE_LABEL}"}}}} {{{{.Label "{OWNER_LABEL}"}}}} {{{{.State}}}}'
    proc = docker("ps", "-a", "--no-trunc", *filters, "--format", fmt)
    out = []
    for line in (proc.stdout or "").splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append(Container(parts[0], parts[1], parts[2], parts[3] == "running"))
    return out


def owner_gone(owner: str) -> bool:
    if owner == DETACHED:
        return False
    return not (owner.isdigit() and _alive(int(owner)))


def who(owner: str) -> str:
    return "`txchaos up`" if owner == DETACHED else f"process {owner}"


def _labelled(kind: str) -> list[str]:
    """Return the ids of the networks or volumes (``kind``) a txchaos stack made."""
    ids: list[str] = []
    for label in (STACK_LABEL, f"{PROJECT_LABEL}={COMPOSE_PROJECT}"):
        ids += (docker(kind, "ls", "-q", "--filter", f"label={label}").stdout or "").split()
    return sorted(set(ids))


def reap(*, everything: bool = False) -> list[str]:
    """Remove the stack containers whose owner is gone (all of them with ``everything``); return what went.

    Networks and volumes of the stack are removed once no container of it is left.
    """
    gone: list[str] = []
    stale = [c for c in containers() if everything or owner_gone(c.owner)]
    if stale:
        docker("rm", "--force", "--volumes", *(c.id for c in stale), timeout=120)
        gone += [f"container {c.service} {c.id[:12]} (owner {c.owner})" for c in stale]
    if not containers():
        for kind in ("network", "volume"):
            ids = _labelled(kind)
            if ids:
                docker(kind, "rm", *ids)
                gone += [f"{kind} {i[:12]}" for i in ids]
    return gone


# -- broker faults: kill -9 and restart with data kept ---------------------------------------------


def service_running(service: str, project: str = COMPOSE_PROJECT) -> bool:
    """Return True when the container of ``service`` runs (it may not answer yet)."""
    return any(c.running for c in containers(project, service=service))


def kill_service(service: str, project: str = COMPOSE_PROJECT) -> list[int]:
    """SIGKILL the container of ``service`` (its data stays in the container); return the host pids killed."""
    pids = []
    for c in containers(project, service=service):
        if c.running:
            pid = docker("inspect", "--format", "{{.State.Pid}}", c.id).stdout.strip()
            docker("kill", "--signal", "KILL", c.id)
            docker("wait", c.id, timeout=30)
            pids.append(int(pid) if pid.isdigit() else 0)
    return pids


def start_service(service: str, project: str = COMPOSE_PROJECT) -> None:
    """Start the stopped container of ``service`` again: same data, same ports."""
    stopped = [c for c in containers(project, service=service) if not c.running]
    if not stopped:
        raise StackError(f"no stopped {service} container in docker stack {project!r}", hint="kill it first")
    proc = docker("start", stopped[0].id)
    if proc.returncode != 0:
        raise StackError(f"docker start of {service} failed", hint="read `docker logs` of it", log_tail=proc.stderr)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
