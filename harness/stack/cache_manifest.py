"""The cache's integrity manifest: the size and sha256 of every installed file, per component.

A file gone from the cache (a jar deleted by a cleaner, a truncated binary) used to surface as a
Java "Transport scheme NOT recognized" in a broker log. The manifest (``<cache>/manifest.json``)
names the damaged file: ``verify_cache`` checks presence and sizes before every stack start (or
every hash with ``full``), and ``intact`` removes a damaged component so that only it is
reinstalled. Standard library only: the bootstrap runs before the project's virtualenv exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from harness.paths import cache_root
from harness.stack.install_shell import INSTALL, BootstrapError, say

MANIFEST_VERSION = 1

# What a stack start needs (Allure only makes reports: `txchaos install` checks it, a start does not).
REQUIRED = ("activemq jars", "kafka jars", "toxiproxy", "dtm")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files_of(target: Path) -> list[Path]:
    if target.is_file():
        return [target]
    return sorted(p for p in target.rglob("*") if p.is_file() and not p.is_symlink())


@contextlib.contextmanager
def _manifest_lock() -> Iterator[None]:
    """Hold the cache's manifest lock: parallel sessions may record components at the same time."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".manifest.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_manifest() -> dict[str, dict[str, object]] | None:
    """Return the manifest's components (name -> {"root", "files"}), or None when there is no manifest."""
    path = cache_root() / "manifest.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        components: dict[str, dict[str, object]] = data["components"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # unreadable: every component counts as unrecorded, so `txchaos install` records it again
    return components


def record(component: str, target: Path) -> None:
    """Record the size and sha256 of every file of ``target`` (a folder or a file under the cache)."""
    root = cache_root()
    files = {str(p.relative_to(root)): [p.stat().st_size, _sha256(p)] for p in _files_of(target)}
    with _manifest_lock():
        components = read_manifest() or {}
        components[component] = {"root": str(target.relative_to(root)), "files": files}
        path = root / "manifest.json"
        partial = path.with_name(f"manifest.json.{os.getpid()}")
        partial.write_text(json.dumps({"version": MANIFEST_VERSION, "components": components}, indent=1))
        partial.replace(path)


def damage(entry: dict[str, object], *, full: bool) -> str | None:
    """Return what is wrong with a recorded component ("<file> missing" / "<file> changed"), or None.

    Without ``full`` only presence and sizes are checked (a stat per file, about a millisecond);
    ``full`` hashes every file again.
    """
    root = cache_root()
    files = entry.get("files")
    if not isinstance(files, dict) or not files:
        return f"{entry.get('root', '?')} has no recorded files"
    for rel, (size, digest) in files.items():
        path = root / rel
        if not path.is_file():
            return f"{rel} missing"
        if path.stat().st_size != size or (full and _sha256(path) != digest):
            return f"{rel} changed"
    return None


def _damaged(problem: str) -> BootstrapError:
    return BootstrapError(f"the txchaos cache at {cache_root()} is damaged ({problem}): run {INSTALL} to reinstall")


def verify_cache(*, full: bool = False, components: tuple[str, ...] = REQUIRED) -> None:
    """Raise BootstrapError naming the first missing or changed file of ``components``."""
    recorded = read_manifest()
    if recorded is None:
        raise BootstrapError(
            f"the txchaos cache at {cache_root()} has no manifest.json (installed by an older txchaos): "
            f"run {INSTALL} to check and record it"
        )
    for component in components:
        entry = recorded.get(component)
        problem = f"{component} not recorded" if entry is None else damage(entry, full=full)
        if problem:
            raise _damaged(problem)


def intact(component: str, target: Path, done: Path, *, verify: bool) -> bool:
    """Return True when ``target`` is installed (``done`` exists) and matches the manifest.

    An install that predates the manifest is recorded as it is. A damaged one is removed, so the
    caller installs it again: only that component, the rest of the cache stays.
    """
    if not done.exists():
        return False
    entry = (read_manifest() or {}).get(component)
    if entry is None or entry.get("root") != str(target.relative_to(cache_root())):
        say(f"recording the checksums of the installed {component}...")
        record(component, target)
        return True
    problem = damage(entry, full=verify)
    if problem is None:
        return True
    say(f"{component} damaged in the cache ({problem}): reinstalling only that")
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    return False
