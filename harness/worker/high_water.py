"""Redelivery detection for Kafka, which has no delivery count: a mark per partition, shared by a run's workers."""

from __future__ import annotations

import os
from pathlib import Path

from harness.clients.kafka import TP


class HighWater:
    """The highest offset handed out per partition in this run, shared by the run's workers.

    Kafka has no delivery count: a record at or below a partition's mark was handed out before
    (to this process or a crashed one), so it is a redelivery.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, tp: TP) -> Path:
        return self.folder / f"{tp[0]}.{tp[1]}"

    def mark(self, tp: TP, highest: int) -> int:
        """Record ``highest`` as handed out; return the previous mark (-1: none)."""
        path = self._path(tp)
        try:
            before = int(path.read_text())
        except (OSError, ValueError):
            before = -1
        if highest > before:
            tmp = path.with_name(f"{path.name}.{os.getpid()}")
            tmp.write_text(str(highest))
            tmp.replace(path)
        return before
