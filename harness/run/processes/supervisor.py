"""Run worker processes, notice when one dies, record it, and start it again."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from harness.errors import HarnessError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.poll import deadline_in, poll_until
from harness.run.processes.standby import STANDBY
from harness.stack.procs import Managed, stop
from harness.worker.spec import WorkerSpec


class Supervised(Protocol):
    """What the pool needs of what it runs: a name (unique in the run) and the stage it serves."""

    @property
    def name(self) -> str: ...

    @property
    def stage(self) -> str: ...


# A process that ends sooner than this after it started counts towards its restart backoff.
QUICK_EXIT_S = 1.0
BACKOFF_MAX_S = 0.2  # the longest a process waits to be started again
# ... when it ended before it was ready (it could not reach a killed broker or database): the heal
# of the outage starts it at once (``expedite``), so a longer wait only spares forks and log lines
OUTAGE_BACKOFF_MAX_S = 1.0


class WorkerPool:
    """Keep ``specs`` running as OS processes until ``stop``; restarts are recorded in the ledger.

    Workers are forked from a pre-imported interpreter (``harness.run.processes.standby``), so a restart
    after a crash costs ~25 ms, not the third of a second of a cold start.

    A process is started again ``restart_delay`` after it ends, doubled for each exit in a row that
    came less than ``QUICK_EXIT_S`` after its start, up to ``BACKOFF_MAX_S`` (``OUTAGE_BACKOFF_MAX_S``
    for one that ended before it was ready): a crash point or a nemesis kill is answered at once,
    while workers that cannot reach a killed broker or database are not forked dozens of times a
    second, on the cores that broker needs to come back. A heal (``expedite``) ends every wait at once.
    """

    def __init__(
        self, specs: Sequence[Supervised], run_dir: Path, ledger: LedgerWriter, *, restart_delay: float = 0.01
    ) -> None:
        self.specs = specs
        self.run_dir = run_dir
        self.ledger = ledger
        self.restart_delay = restart_delay
        self.procs: dict[str, Managed] = {}
        self.restarts = 0
        self._born: dict[str, float] = {}  # when each process was last started (monotonic)
        self._streak: dict[str, int] = {}  # quick exits in a row, per process
        self._due: dict[str, float] = {}  # processes waiting out their backoff: when each starts again
        self._expedite = threading.Event()  # set by ``expedite``: the monitor starts every waiting process
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._monitor, name="worker-monitor", daemon=True)

    def start(self, timeout: float = 60.0) -> None:
        """Start the workers and wait until each has subscribed (its ``.ready`` file exists)."""
        self._thread.start()
        self._ready.wait(timeout)
        pending = {s.name for s in self.specs}

        def ready() -> bool:
            nonlocal pending
            pending = {n for n in pending if not self._ready_path(n).exists()}
            for name in pending:
                if not self.procs[name].alive() and self.restarts > 3 * len(self.specs):
                    raise self._failed_start(name, dying=True)
            return not pending

        if not poll_until(ready, deadline=deadline_in(timeout)):
            raise self._failed_start(sorted(pending)[0], dying=False, timeout=timeout)

    def _failed_start(self, name: str, *, dying: bool, timeout: float = 0.0) -> Exception:
        """Return the error for a process that keeps dying (``dying``) or never got ready in ``timeout``."""
        if dying:
            return HarnessError(f"{name} keeps dying before it subscribes", hint=f"read {self.procs[name].log_path}")
        return HarnessError(
            f"worker(s) [{name!r}] did not subscribe in {timeout:.0f}s",
            hint=f"read the worker logs in {self.run_dir / 'logs'}",
        )

    def _ready_path(self, name: str) -> Path:
        return self.run_dir / "workers" / f"{name}.ready"

    def serving(self) -> bool:
        """Return whether every worker is alive and subscribed: none is dead or restarting.

        A worker killed after its DB commit has its message back in the queue; until its
        replacement subscribes, that redelivery has not happened yet, even if the operation
        already came out downstream (an outbox relay sends it on independently).
        """
        return all(p.alive() and self._ready_path(n).exists() for n, p in list(self.procs.items()))

    def wait_serving(self, deadline: float) -> bool:
        """Wait until ``serving()`` or the monotonic ``deadline``; return whether it serves."""
        while not self.serving():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def wait_alive(self, name: str, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until process ``name`` runs: one killed a moment ago is being
        replaced, and a step aimed at it (a pause) must reach the replacement. Return whether it runs."""
        return poll_until(lambda: self.procs[name].alive(), deadline=deadline_in(timeout_s), every_s=0.05)

    def backoff(self, name: str, ended: float, *, ready: bool = True) -> float:
        """Return how long to wait before starting ``name`` again, which ended at ``ended`` (``ready``:
        after it said it was ready)."""
        quick = ended - self._born.get(name, ended) < QUICK_EXIT_S
        streak = self._streak[name] = self._streak.get(name, 0) + 1 if quick else 0
        longest = BACKOFF_MAX_S if ready else OUTAGE_BACKOFF_MAX_S
        return min(longest, self.restart_delay * 2.0 ** max(0, streak - 1))

    def expedite(self) -> None:
        """Start every process waiting out its backoff now, and forget the streaks: the outage that
        kept them ending (a fault window, a killed broker) was healed (any thread)."""
        self._expedite.set()

    def _start(self, spec: Supervised) -> None:
        self._born[spec.name] = time.monotonic()
        self._spawn(spec)

    def _spawn(self, spec: Supervised) -> None:
        assert isinstance(spec, WorkerSpec)
        spec_path = spec.write(self.run_dir / "workers" / f"{spec.name}.json")
        self.procs[spec.name] = STANDBY.start_worker(
            spec_path,
            self.run_dir / "logs" / f"{spec.name}.log",
            name=spec.name,
            tag=f"run/{self.run_dir.name}/{spec.name}",
        )

    def _monitor(self) -> None:
        (self.run_dir / "workers").mkdir(parents=True, exist_ok=True)
        for spec in self.specs:
            self._start(spec)
        self._ready.set()
        self._rounds()
        for proc in self.procs.values():
            # At quiescence a graceful stop protects nothing: a message still in flight goes back to
            # the queue either way and is drained as residue. SIGKILL saves ~0.3 s per run.
            stop(proc, timeout=5, sig=signal.SIGKILL)

    def _rounds(self) -> None:
        """Watch the processes until ``stop``: record each exit, start it again after its backoff."""
        while not self._stopping.is_set():
            self._tick()
            if self._expedite.is_set():
                self._expedite.clear()
                self._due = dict.fromkeys(self._due, 0.0)
                self._streak.clear()
            for spec in self.specs:
                name = spec.name
                if self._stopping.is_set():
                    break
                if name in self._due:  # waiting out its backoff; the others are looked after meanwhile
                    if time.monotonic() >= self._due[name]:
                        del self._due[name]
                        self.restarts += 1
                        self._start(spec)
                    continue
                proc = self.procs[name]
                code = proc.popen.poll()
                if code is None:
                    continue
                ended = time.monotonic()
                sig = signal.Signals(-code).name if code < 0 else None
                self._exited(spec, code, sig)
                proc.record.unlink(missing_ok=True)
                ready = self._ready_path(name).exists()
                self._ready_path(name).unlink(missing_ok=True)
                self._due[name] = ended + self.backoff(name, ended, ready=ready)
            self._stopping.wait(0.01)

    def _tick(self) -> None:
        """Look after the running processes once per monitor round (readiness, say)."""

    def _exited(self, spec: Supervised, code: int, sig: str | None) -> None:
        """Record that ``spec``'s process ended (it is started again right after)."""
        self.ledger.emit(Kind.WORKER_EXIT, stage=spec.stage, worker=spec.name, returncode=code, signal=sig)

    def stop(self) -> None:
        """Stop every worker (SIGKILL) and wait for the monitor to finish."""
        self._stopping.set()
        self._thread.join(30)
