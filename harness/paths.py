"""Where the harness keeps things: the cache (installed tools) and the reports root (runs, stacks).

Standard library only, importing nothing of ours: the bootstrap reads ``cache_root`` from here
before the project's virtualenv exists.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root", "reports_root", "runs_root", "stacks_root"]


def cache_root() -> Path:
    """Return the cache directory: ``$TXCHAOS_CACHE`` or ``~/.cache/txchaos``."""
    return Path(os.environ.get("TXCHAOS_CACHE") or Path.home() / ".cache" / "txchaos")


def reports_root() -> Path:
    """Return ``$TXCHAOS_REPORTS`` or ``./reports`` of the working directory."""
    return Path(os.environ.get("TXCHAOS_REPORTS") or Path.cwd() / "reports").resolve()


def runs_root() -> Path:
    return reports_root() / "runs"


def stacks_root() -> Path:
    return reports_root() / "stacks"
