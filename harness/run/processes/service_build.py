"""Build a service under test once per version of its source, into the txchaos cache.

A service's ``build`` command writes into ``{build}``: a cache folder named after the hash of
every file under ``source`` (dependency and output folders left out), so a changed source builds
again and an unchanged one is reused at once. The build runs with the cache's Go module and build
folders and npm's own cache; its output goes to ``build.log`` beside the folder. A failed build
leaves no folder behind and says what failed, with the log's tail, before any service starts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.errors import ConfigError
from harness.paths import cache_root
from harness.run.spec.service import Service, source_files
from harness.stack.go_builds import go_env


def source_hash(root: Path) -> str:
    """Return a short hash of every file's path and content under ``root``."""
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_dir(service: Service) -> Path | None:
    """Return where ``service``'s build goes (None: the service has no source)."""
    source = service.source_dir
    if source is None:
        return None
    # Keyed by the source, not the service: the variants of one program share one build.
    return cache_root() / "services" / f"{source.name}-{source_hash(source)}"


def ensure_built(service: Service, say: Callable[[str], None] | None = None) -> Path | None:
    """Build ``service`` into its cache folder unless that version is built; return the folder."""
    dest = build_dir(service)
    source = service.source_dir
    if dest is None or source is None or not service.build:
        return dest
    if (dest / ".complete").exists():
        return dest
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    values = {"build": str(partial), "source": str(source), "python": sys.executable}
    argv = [service.render(a, values) for a in service.build]
    log = dest.with_name(f"{dest.name}.build.log")
    (say or _stderr)(f"building service {service.name} once ({' '.join(argv)}; log {log})...")
    started = time.monotonic()
    with log.open("wb") as out:
        code = subprocess.run(argv, cwd=source, env=go_env(), stdout=out, stderr=subprocess.STDOUT, check=False)
    if code.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-12:])
        raise ConfigError(
            f"building service {service.name} failed (exit {code.returncode}): {' '.join(argv)}\n{tail}",
            hint=f"fix the build in {source}; the whole log is {log}",
        )
    (partial / ".complete").write_text(f"{time.monotonic() - started:.1f}s\n")
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def _stderr(text: str) -> None:
    sys.stderr.write(f"txchaos: {text}\n")  # a build takes minutes once: say so where a user looks
    sys.stderr.flush()
