"""Entry point of a worker process.

``python -m harness.worker SPEC.json`` runs a worker at once; ``python -m harness.worker --standby``
imports the runtime, then waits for ``SPEC.json<TAB>LOG`` on stdin (see ``harness.run.standby``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.worker.kafka_stage import KafkaStageWorker
from harness.worker.process import run_process
from harness.worker.spec import WorkerSpec
from harness.worker.stage import StageWorker


def _await_hand_over() -> Path | None:
    line = sys.stdin.readline().strip()
    if not line:
        return None  # the harness closed the pipe: it no longer needs this standby
    spec_path, _, log_path = line.partition("\t")
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    return Path(spec_path)


def main(argv: list[str]) -> int:
    if argv == ["--standby"]:
        spec_path = _await_hand_over()
        if spec_path is None:
            return 0
    elif len(argv) == 1:
        spec_path = Path(argv[0])
    else:
        sys.stderr.write("usage: python -m harness.worker SPEC.json | --standby\n")
        return 2
    spec = WorkerSpec.load(spec_path)
    if spec.kind == "process":
        run_process(spec)
    elif spec.kind == "kafka":
        KafkaStageWorker(spec).run()
    else:
        StageWorker(spec).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
