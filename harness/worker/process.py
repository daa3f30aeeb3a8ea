"""The runtime of a pattern's helper process (``WorkerSpec.kind == "process"``).

A helper is a function ``main(ctx: ProcessContext) -> None`` that runs until ``ctx.stopping``
is set: an outbox relay polling its table, an HTTP service the stage calls. It is supervised
like a stage worker (restarted after a crash, its exits in the ledger) and can be armed with
crash points like one. It calls ``ctx.ready()`` once it serves, which is what the run waits for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.stack.base import Endpoints
from harness.worker.base import WorkerRuntime, announce_ready, load_handler
from harness.worker.crash import CrashPoints
from harness.worker.spec import WorkerSpec


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
        announce_ready(self.spec, self.ledger)


ProcessMain = Callable[[ProcessContext], None]


class ProcessWorker(WorkerRuntime):
    """Run the helper ``spec.handler`` once, with a ``ProcessContext``; it returns when stopped."""

    def __init__(self, spec: WorkerSpec) -> None:
        # The user's module first: an import error must name it, not a missing stack file.
        self.main: ProcessMain = load_handler(spec.handler)
        super().__init__(spec)

    def serve(self) -> None:
        self.main(ProcessContext(self.spec, self.endpoints, self.ledger, self.crash, self.stop))


def run_process(spec: WorkerSpec) -> None:
    """Run the helper ``spec.handler`` until SIGTERM."""
    ProcessWorker(spec).run()
