"""Entry point of a worker process.

``python -m harness.worker SPEC.json`` runs a worker at once; ``python -m harness.worker --zygote``
imports the runtime once, then forks a worker per ``SPEC.json<TAB>LOG`` line on stdin (see
``harness.worker.zygote`` and ``harness.run.processes.standby``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.clients import db
from harness.worker.base import WorkerRuntime
from harness.worker.kafka_stage import KafkaStageWorker
from harness.worker.process import ProcessWorker
from harness.worker.spec import WorkerSpec
from harness.worker.stage import StageWorker
from harness.worker.zygote import serve

# ``WorkerSpec.kind`` -> its runtime: a new transport's stage worker is one more entry.
RUNTIMES: dict[str, type[WorkerRuntime]] = {"stage": StageWorker, "kafka": KafkaStageWorker, "process": ProcessWorker}


def run_spec(spec_path: Path) -> None:
    """Run the worker ``spec_path`` describes until it stops (or is killed)."""
    spec = WorkerSpec.load(spec_path)
    spec.use_driver_path()
    RUNTIMES.get(spec.kind, StageWorker)(spec).run()


def warm_up() -> None:
    """Load, once before the forks, what every worker loads when it creates its first engine.

    The Postgres dialect and driver are imported on the first ``create_engine`` (~85 ms): done
    here, no forked worker pays it. No connection is opened: a forked child must not share one.
    """
    db.engine("postgresql+psycopg://warm@127.0.0.1/warm").dispose()


def main(argv: list[str]) -> int:
    if argv == ["--zygote"]:
        warm_up()
        return serve(run_spec)
    if len(argv) != 1:
        sys.stderr.write("usage: python -m harness.worker SPEC.json | --zygote\n")
        return 2
    run_spec(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
