"""What a worker process is told to do, passed as a JSON file."""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def driver_path() -> list[str]:
    """Return this process's ``sys.path`` with every entry absolute ('' is the working directory).

    Made in the driver, it carries what pytest added (the rootdir, the ``pythonpath`` ini, the
    test folders) to a worker, which may be forked from a server started elsewhere.
    """
    return [os.path.abspath(p or os.curdir) for p in sys.path]


@dataclass(frozen=True)
class WorkerSpec:
    """One worker: which stage handler to run, from which queue to which, inside which run.

    ``kind="stage"`` runs ``handler`` per message in the 1PC stage runtime; ``kind="process"``
    calls ``handler(ProcessContext)`` once, for helpers of a pattern that are not stages (an
    outbox relay, an HTTP service the stage calls); ``kind="kafka"`` runs ``handler`` per record
    in the Kafka stage runtime, where the queues are topics (``harness.worker.kafka_stage``).
    ``sys_path`` is the driver's import path at the time the spec was made: the worker imports
    ``handler`` with it, as the test did.
    """

    name: str
    run_dir: str
    endpoints_path: str
    handler: str  # "module:function", the stage handler
    stage: str
    input_queue: str
    output_queue: str | None
    options: dict[str, Any] = field(default_factory=dict)
    kind: str = "stage"
    sys_path: list[str] = field(default_factory=driver_path)

    def use_driver_path(self) -> None:
        """Put the driver's import path first in this process's, so ``handler`` imports as it did there."""
        sys.path[:] = [*self.sys_path, *(p for p in sys.path if p not in self.sys_path)]
        importlib.invalidate_caches()  # a folder listed before the user's module was written

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, path: Path) -> WorkerSpec:
        return cls(**json.loads(path.read_text()))
