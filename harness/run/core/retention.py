"""Old run folders removed on request (``txchaos prune``); the harness never removes one by itself.

A soak of a million operations leaves a 3 GB folder and a test suite hundreds of small ones, so a
team's ``reports/runs/`` grows until the disk is full. ``plan`` picks the folders a user asked to
remove: run folders only (named by a run id, with a manifest or a ledger), older than a given age
and/or beyond the newest ``keep``, and never one still in use (a process compacting its ledger, or
anything in it written in the last ``BUSY_S`` seconds). ``remove`` deletes what was picked.

>>> picked = plan(runs_root(), older_than_s=7 * 86400, keep=None)
>>> remove(picked.remove)
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.ledger.reader import compacting

__all__ = ["BUSY_S", "Plan", "RunDir", "plan", "remove"]

BUSY_S = 600.0  # a folder with a file written this recently may belong to a run still going
_RUN_ID = re.compile(r"^(\d{8}-\d{6})-.+")


@dataclass(frozen=True)
class RunDir:
    """One run folder: its path, when its run began (from its id) and its size in bytes."""

    path: Path
    started: float  # seconds since the epoch
    size: int
    busy: str = ""  # why a prune keeps it although the rules picked it (in use), in words


@dataclass(frozen=True)
class Plan:
    """What a prune removes and what it keeps because it is in use."""

    remove: tuple[RunDir, ...]
    busy: tuple[RunDir, ...]
    kept: int  # run folders left (busy ones included)


def _started(name: str) -> float | None:
    match = _RUN_ID.match(name)
    if match is None:
        return None
    try:
        return time.mktime(time.strptime(match.group(1), "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


def _busy(folder: Path, files: list[Path], now: float) -> str:
    """Return why ``folder`` is in use (empty when it is not)."""
    if compacting(folder / "ledger"):
        return "a soak is compacting its ledger"
    newest = max((p.stat().st_mtime for p in files), default=0.0)
    if now - newest < BUSY_S:
        return (
            f"written {max(0.0, now - newest) / 60:.0f}m ago; a folder written in the last "
            f"{BUSY_S / 60:.0f}m may belong to a run still going"
        )
    return ""


def run_dirs(root: Path) -> list[RunDir]:
    """Return the run folders directly under ``root``, oldest first (other entries are left alone)."""
    found: list[RunDir] = []
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        started = _started(entry.name)
        if started is None or entry.is_symlink() or not entry.is_dir():
            continue
        if not ((entry / "manifest.json").is_file() or (entry / "ledger").is_dir()):
            continue
        found.append(RunDir(entry, started, 0))
    return sorted(found, key=lambda r: (r.started, r.path.name))


def plan(root: Path, *, older_than_s: float | None, keep: int | None, now: float | None = None) -> Plan:
    """Return the run folders under ``root`` to remove: begun more than ``older_than_s`` ago and/or
    not among the newest ``keep`` (both given: both must hold), and never one in use."""
    if older_than_s is None and keep is None:
        raise ConfigError("prune needs a rule", hint="pass --older-than 7d, --keep 20, or both")
    if keep is not None and keep < 0:
        raise ConfigError(f"--keep {keep} is negative", hint="pass how many of the newest run folders to keep, e.g. 20")
    if older_than_s is not None and older_than_s < 0:
        raise ConfigError(f"--older-than {older_than_s:g}s is negative", hint="pass an age such as 7d or 12h")
    now = time.time() if now is None else now
    dirs = run_dirs(root)
    newest = {r.path for r in dirs[max(0, len(dirs) - keep) :]} if keep else set()
    remove: list[RunDir] = []
    busy: list[RunDir] = []
    for r in dirs:
        if r.path in newest or (older_than_s is not None and now - r.started <= older_than_s):
            continue
        files = _files(r.path)
        sized = RunDir(r.path, r.started, sum(p.stat().st_size for p in files), _busy(r.path, files, now))
        (busy if sized.busy else remove).append(sized)
    return Plan(tuple(remove), tuple(busy), len(dirs) - len(remove))


def remove(dirs: tuple[RunDir, ...]) -> int:
    """Delete ``dirs``; return the bytes freed."""
    freed = 0
    for r in dirs:
        shutil.rmtree(r.path)
        freed += r.size
    return freed
