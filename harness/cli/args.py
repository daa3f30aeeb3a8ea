"""The help of the arguments more than one command takes (``run``, ``soak``)."""

from __future__ import annotations

SCENARIO_HELP = (
    "NAME[:VARIANT] from scenarios/ (e.g. onepc_crash_gap:naive; a bad name lists them), or a scenario file's path"
)
SEED_HELP = "seeds every random choice; the same seed replays the same run (default 0)"
