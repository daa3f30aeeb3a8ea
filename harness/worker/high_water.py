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
        self._paths: dict[TP, str] = {}

    def _path(self, tp: TP) -> str:
        path = self._paths.get(tp)
        if path is None:
            path = self._paths[tp] = str(self.folder / f"{tp[0]}.{tp[1]}")
        return path

    def mark(self, tp: TP, highest: int) -> int:
        """Record ``highest`` as handed out; return the previous mark (-1: none).

        A mark is replaced whole (written aside, then renamed over), so a worker killed while it
        writes leaves the old one. Plain descriptors, not ``Path.read_text``: a batch marks each of
        its partitions, and the text layer's set-up was most of a mark's cost.
        """
        path = self._path(tp)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            before = -1
        else:
            try:
                text = os.read(fd, 64)
            finally:
                os.close(fd)
            try:
                before = int(text)
            except ValueError:
                before = -1
        if highest > before:
            tmp = f"{path}.{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, str(highest).encode())
            finally:
                os.close(fd)
            os.replace(tmp, path)
        return before
