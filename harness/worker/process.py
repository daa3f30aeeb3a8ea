"""The runtime of a pattern's helper process (``WorkerSpec.kind == "process"``).

A helper is a function ``main(ctx: ProcessContext) -> None`` that runs until ``ctx.stopping``
is set: an outbox relay polling its table, an HTTP service the stage calls. It is supervised
like a stage worker (restarted after a crash, its exits in the ledger) and can be armed with
crash points like one. It calls ``ctx.ready()`` once it serves, which is what the run waits for.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.stack.base import Endpoints
from harness.worker.crash import CrashPoints
from harness.worker.spec import WorkerSpec
from harness.worker.stage import load_handler


@dataclass
class ProcessContext:
    """What a helper process gets: its spec and options, the stack, a ledger and crash points."""

    spec: WorkerSpec
    endpoints: Endpoints
    ledger: LedgerWriter
    crash: CrashPoints
    stopping: threading.Event

    @property
    def options(self) -> dict[str, Any]:
        return self.spec.options

    @property
    def name(self) -> str:
        return self.spec.name

    def record(self, kind: Kind, **columns: Any) -> None:
        """Write a ledger event (``op=``, ``msg=``, ``dest=`` ... as columns or detail)."""
        self.ledger.emit(kind, stage=self.spec.stage, **columns)

    def crash_point(self, name: str, *, op: str | None = None, msg: str | None = None) -> None:
        """Mark a crash point; the harness may kill the process here."""
        self.crash.reach(name, op=op, msg=msg, stage=self.spec.stage)

    def ready(self) -> None:
        """Tell the harness this process serves (the run starts once every worker is ready)."""
        self.ledger.emit(Kind.WORKER_START, stage=self.spec.stage, dest=self.spec.input_queue)
        (Path(self.spec.run_dir) / "workers" / f"{self.spec.name}.ready").touch()


ProcessMain = Callable[[ProcessContext], None]


def run_process(spec: WorkerSpec) -> None:
    """Run the helper ``spec.handler`` until SIGTERM."""
    run_dir = Path(spec.run_dir)
    ledger = LedgerWriter(run_dir / "ledger", spec.name)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    main: ProcessMain = load_handler(spec.handler)  # type: ignore[assignment]
    main(
        ProcessContext(
            spec, Endpoints.load(Path(spec.endpoints_path)), ledger, CrashPoints(run_dir, spec.name, ledger), stopping
        )
    )
