"""Entry point of a worker process: ``python -m harness.worker SPEC.json``."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.worker.spec import WorkerSpec
from harness.worker.stage import StageWorker


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m harness.worker SPEC.json\n")
        return 2
    StageWorker(WorkerSpec.load(Path(argv[0]))).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
