"""What a worker process is told to do, passed as a JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkerSpec:
    """One worker: which stage handler to run, from which queue to which, inside which run.

    ``kind="stage"`` runs ``handler`` per message in the 1PC stage runtime; ``kind="process"``
    calls ``handler(ProcessContext)`` once, for helpers of a pattern that are not stages (an
    outbox relay, an HTTP service the stage calls); ``kind="kafka"`` runs ``handler`` per record
    in the Kafka stage runtime, where the queues are topics (``harness.worker.kafka_stage``).
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

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, path: Path) -> WorkerSpec:
        return cls(**json.loads(path.read_text()))
