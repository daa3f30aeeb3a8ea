"""What every worker process shares: the handler context protocol and the runtime base.

A handler is written against ``HandlerContext``, which the ActiveMQ stage's ``StageContext`` and
the Kafka stage's ``KafkaContext`` both satisfy with one ``send`` signature, so a pattern written
once runs on either transport where its semantics allow (``harness.patterns.onepc``):

>>> def naive(ctx: HandlerContext) -> None:
...     ctx.db.execute(...)                       # inside the stage's DB transaction
...     ctx.send({"op": ctx.op, "from": ctx.stage})

``WorkerRuntime`` owns what is not the consumer loop: the spec, the ledger, the crash points,
SIGTERM, readiness and the side connection. A runtime subclass supplies ``serve``.
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.clients import db
from harness.clients.db import Connection
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.stack.base import Endpoints
from harness.worker.crash import CrashPoints
from harness.worker.spec import WorkerSpec


class HandlerContext(Protocol):
    """What a stage handler may use on any transport, for one message or record."""

    # Read-only: a handler reads what it was given; the runtime builds a context per message.
    @property
    def op(self) -> str: ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def db(self) -> Connection: ...  # inside the stage's DB transaction
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def worker(self) -> str: ...
    @property
    def stage(self) -> str: ...
    @property
    def side(self) -> Connection: ...  # the worker's autocommit connection, outside that transaction

    def send(self, body: dict[str, Any], dest: str | None = None, *, key: str | None = None) -> None:
        """Send ``body`` to ``dest`` (default: the stage's output) with the stage's commit; ``key``
        names the operation the output belongs to (default: this one's)."""
        ...

    def record(self, kind: Kind, **detail: Any) -> None:
        """Write a ledger event about this operation (EFFECT, SKIP, EXTERNAL_CALL ...)."""
        ...

    def crash_point(self, name: str) -> None:
        """Mark a pattern-specific crash point; the harness may kill the worker here."""
        ...

    def dead_letter(self, reason: str) -> None:
        """Divert this message to the dead-letter destination and raise an alert."""
        ...


@dataclass
class ContextBase:
    """The fields and calls both transports' contexts share; each adds its message and ``send``."""

    op: str
    body: dict[str, Any]
    db: Connection
    options: dict[str, Any]
    worker: str
    stage: str
    _record: Callable[..., None]
    _crash: Callable[[str], None]
    _side: Callable[[], Connection]

    @property
    def side(self) -> Connection:
        """The worker's autocommit connection, outside the stage transaction."""
        return self._side()

    def record(self, kind: Kind, **detail: Any) -> None:
        """Write a ledger event about this operation (EFFECT, SKIP, EXTERNAL_CALL ...)."""
        self._record(kind, **detail)

    def crash_point(self, name: str) -> None:
        """Mark a pattern-specific crash point; the harness may kill the worker here."""
        self._crash(name)


def load_handler(path: str) -> Callable[..., Any]:
    """Import ``module:function``."""
    module, _, func = path.partition(":")
    handler: Callable[..., Any] = getattr(importlib.import_module(module), func)
    return handler


def announce_ready(spec: WorkerSpec, ledger: LedgerWriter, **detail: Any) -> None:
    """Tell the harness this worker serves: the run starts once every worker is ready."""
    ledger.emit(Kind.WORKER_START, stage=spec.stage, dest=spec.input_queue, **detail)
    (Path(spec.run_dir) / "workers" / f"{spec.name}.ready").touch()


class WorkerRuntime:
    """Run one worker of ``spec`` until SIGTERM: ``run`` installs the handler, ``serve`` loops."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.run_dir = Path(spec.run_dir)
        self.endpoints = Endpoints.load(Path(spec.endpoints_path))
        self.ledger = LedgerWriter(self.run_dir / "ledger", spec.name)
        self.crash = CrashPoints(self.run_dir, spec.name, self.ledger)
        self.stop = threading.Event()
        # Deliveries seen per message in this process: the brokers' own counts are missing or reset.
        self.attempts: Counter[str] = Counter()
        self._side_engine: db.Engine | None = None
        self._side_conn: db.Connection | None = None
        self._engine: db.Engine | None = None
        self._conn: db.Connection | None = None
        self._ready = False

    def stage_db(self) -> db.Connection:
        """Return the stage's connection, kept open from message to message.

        A pool checkout per message pinged the database first (a round trip through the proxy
        per message, a tenth of a worker's time); a connection that dropped is replaced here, and
        one that drops in a transaction ends the worker as before (the supervisor restarts it).
        """
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            if self._engine is None:
                self._engine = db.engine(self.endpoints.postgres_url, pool_size=1)
            conn = self._conn = self._engine.connect()
        return conn

    def side(self) -> db.Connection:
        """Return the autocommit connection outside any stage transaction, reconnecting if it dropped."""
        if self._side_conn is None or self._side_conn.closed:
            if self._side_engine is None:
                self._side_engine = db.engine(self.endpoints.postgres_url, pool_size=1, autocommit=True)
            self._side_conn = self._side_engine.connect()
        return self._side_conn

    def ready(self, **detail: Any) -> None:
        """Announce readiness once, however often the loop reconnects."""
        if not self._ready:
            announce_ready(self.spec, self.ledger, **detail)
            self._ready = True

    def run(self) -> None:
        """Serve until SIGTERM sets ``stop`` (a SIGKILL at a crash point ends it anywhere)."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        self.serve()

    def serve(self) -> None:
        """Consume and handle until ``stop`` is set (the transport's loop)."""
        raise NotImplementedError(f"{type(self).__name__} must define serve()")
