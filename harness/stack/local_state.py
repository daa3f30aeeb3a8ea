"""What a local stack leaves behind it: spawn recipes, tagged processes, log folders, detached stacks.

A stack's processes are recorded under a tag in the process registry (``harness.stack.procs``);
a broker fault finds, stops and respawns a service by that tag and its recipe, and ``txchaos down``
stops a stack an earlier process left running. Only ``logs/`` outlives a stopped stack: a killed run
never copied its slice of the service logs into its run folder, so they are the only trace of what
the servers saw. The newest ``KEEP_LOGS`` log folders of stopped stacks are kept; each start
removes older ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.paths import stacks_root
from harness.stack.procs import (
    Owner,
    _has_tag,
    _registry,
    claimed_tags,
    kill_group,
    kill_group_wait,
    read_records,
    reap_orphans,
)

KEEP_LOGS = 10  # log folders of stopped stacks kept; a start removes older ones
STACK_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")


@dataclass(frozen=True)
class ServiceRecipe:
    """How a service was spawned, kept in ``<state_dir>/services/<name>.json`` so a fault can respawn it.

    The environment is left out on purpose: it may hold secrets, and a respawn inherits the
    respawning process's environment like the first spawn did.
    """

    service: str
    argv: list[str]
    user: str | None
    log_path: str
    tag: str
    detached: bool
    cwd: str | None = None  # defaulted: recipes written before it existed still load
    # The process that started the stack (None: detached): a copy another process restarts is its
    # too, so it outlives that process (a soak in a child of the benchmark) and dies with the stack.
    owner_pid: int | None = None
    owner_start: int | None = None

    def owner(self) -> Owner | None:
        """Return the stack's owner, or None for a detached stack (or a recipe older than the field)."""
        return None if self.owner_pid is None else Owner(self.owner_pid, self.owner_start)

    @staticmethod
    def path(state_dir: str | Path, service: str) -> Path:
        return Path(state_dir) / "services" / f"{service}.json"

    def save(self, state_dir: str | Path) -> None:
        path = self.path(state_dir, self.service)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        tmp.replace(path)  # a reader never sees half a recipe

    @classmethod
    def load(cls, state_dir: str | Path, service: str) -> ServiceRecipe:
        path = cls.path(state_dir, service)
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"no spawn recipe for {service!r} at {path}",
                hint="broker faults need a local stack started by this version of txchaos (`txchaos up` again)",
            ) from exc


def tagged_pids(tag: str) -> list[int]:
    """Return the live pids the process registry records under ``tag`` (a restarted service too)."""
    found = []
    for path, rec in read_records(_registry()):
        if rec.get("tag") != tag:
            continue
        pid = int(rec["pid"])
        # A zombie has no environ left, so it counts as gone, as does a reused pid.
        if _has_tag(pid, tag):
            found.append(pid)
        else:
            path.unlink(missing_ok=True)  # a record of a process that is gone
    return found


def stop_tagged(tag: str, *, sig: int = signal.SIGKILL, timeout: float = 10.0) -> list[int]:
    """Stop every live process group recorded under ``tag``; returns their pids."""
    pids = tagged_pids(tag)
    for pid in pids:
        kill_group(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _has_tag(pid, tag):
            time.sleep(0.05)
        kill_group(pid, signal.SIGKILL)
        kill_group_wait(pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if this process spawned it (a broker-fault restart)
    tagged_pids(tag)  # drops the records of the processes just stopped
    return pids


def prune_stack_logs(keep: int = KEEP_LOGS) -> list[Path]:
    """Remove the folders of stopped local stacks but the newest ``keep``; returns what was removed.

    A folder whose stack still holds a claim or a process record (running, or detached by
    ``txchaos up``) is never touched.
    """
    root = stacks_root()
    if not root.is_dir():
        return []
    tags = claimed_tags()
    for record in _registry().glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            tags.append(str(json.loads(record.read_text())["tag"]))
    live = {tag.split("/")[1] for tag in tags if tag.startswith("stack/")}
    stopped = sorted(p for p in root.iterdir() if p.is_dir() and STACK_ID.match(p.name) and p.name not in live)
    doomed = stopped[: max(0, len(stopped) - keep)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def stop_detached(stack_id: str) -> list[str]:
    """Stop a stack started by ``txchaos up`` in an earlier process; returns what was stopped.

    Its processes are reaped first, then every path it claimed (its logs/ stays).
    """
    reaped = reap_orphans(include_detached_tag=f"stack/{stack_id}/")
    return [r for r in reaped if not r.startswith("path ")]
