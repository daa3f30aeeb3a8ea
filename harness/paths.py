"""Where the harness keeps things: the cache (installed tools) and the reports root (runs, stacks)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.stack.bootstrap import cache_root

__all__ = ["cache_root", "reports_root", "runs_root", "stacks_root"]


def reports_root() -> Path:
    """Return ``$TXCHAOS_REPORTS`` or ``./reports`` of the working directory."""
    return Path(os.environ.get("TXCHAOS_REPORTS") or Path.cwd() / "reports").resolve()


def runs_root() -> Path:
    return reports_root() / "runs"


def stacks_root() -> Path:
    return reports_root() / "stacks"
