"""Keep a service's instances running: start, readiness from their output, why each one ended.

``ServicePool`` is the ``WorkerPool`` of a service under test: an instance is the team's own
command (any language), started in its own process group with its environment filled in, its
output kept in ``logs/<instance>.log``. It is ready once that output matches the service's
``ready`` pattern (after each start). When an instance ends, the pool records why: a trap or the
harness killed it (``expect_exit``), or a fault was on its connections (``excuse``), or it died on
its own: the last is the service's failure, not an anomaly of the flow, and the run reports it so.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError, HarnessError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.run.processes.supervisor import Supervised, WorkerPool
from harness.stack import containers
from harness.stack.procs import spawn

EXCUSE_S = 5.0  # an instance that ends this soon after a fault healed may have ended of the fault


@dataclass(frozen=True)
class Instance:
    """One instance of a service: its name (``<service>-<n>``), argv, environment and folder."""

    name: str
    stage: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: Path | None
    image: str | None = None  # a container of this image, ``argv`` its arguments
    passed: tuple[str, ...] = ()  # the variables a container gets (the service's env)


@dataclass(frozen=True)
class OwnExit:
    """An instance that ended with nothing to explain it: the service's own failure."""

    instance: str
    returncode: int
    signal: str | None
    log: Path


def ready_since(log: Path, start: int, ready: re.Pattern[bytes]) -> int | None:
    """Return the time (ns) ``log`` got a line matching ``ready`` after byte ``start``, or None.

    The log's time is when the ready line was written (or a line after it, microseconds later): the
    ready file carries it, not the polling round's, so a start measured from it (`txchaos bench
    services --starts`) holds no 20 ms tick. Only the bytes the stat saw are read: a ready line
    written between the stat and the read would get the older time, so the next round stamps it.
    """
    seen = log.stat()
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(max(0, seen.st_size - start))
    return seen.st_mtime_ns if ready.search(text) else None


class ServicePool(WorkerPool):
    """Run ``instances`` until ``stop``, restarting each when it ends; see the module docstring."""

    def __init__(
        self,
        instances: Sequence[Instance],
        run_dir: Path,
        ledger: LedgerWriter,
        *,
        ready: str,
        restart_delay: float = 0.05,
        on_ready: Callable[[str], None] | None = None,
        frozen: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(instances, run_dir, ledger, restart_delay=restart_delay)
        self.ready = re.compile(ready.encode())
        self.own_exits: list[OwnExit] = []
        self._offsets: dict[str, int] = {}
        self._expected: set[str] = set()
        self._excused_until = 0.0
        self._faulted = 0
        self._lock = threading.Lock()
        self._on_ready = on_ready
        self._frozen = frozen
        self._containers: dict[str, str] = {}  # instance -> its current container
        self._spawned = 0

    # -- what the run tells the pool -----------------------------------------------------------
    def expect_exit(self, name: str) -> None:
        """Say that ``name`` is about to be killed on purpose (a trap fired, a rule kills it)."""
        with self._lock:
            self._expected.add(name)

    def fault_on(self) -> None:
        """Say a fault is on the service's connections: an instance may end of it."""
        with self._lock:
            self._faulted += 1

    def fault_off(self) -> None:
        with self._lock:
            self._faulted = max(0, self._faulted - 1)
            self._excused_until = time.monotonic() + EXCUSE_S

    def serving(self) -> bool:
        """Return whether every instance is alive, ready and not frozen (a frozen one holds an operation)."""
        return (self._frozen is None or self._frozen() == 0) and super().serving()

    def pid(self, name: str) -> int:
        """Return the process (group) id of instance ``name`` now (a trap's kill target).

        For a container: its init process, as the host sees it (``docker run`` while it starts).
        """
        container = self._containers.get(name)
        if container is not None and (pid := containers.init_pid(container)) is not None:
            return pid
        return self.procs[name].pid

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._containers:  # stopping `docker run` leaves its container running
                containers.remove_run(self.run_dir.name)

    # -- WorkerPool hooks ----------------------------------------------------------------------
    def _spawn(self, spec: Supervised) -> None:
        assert isinstance(spec, Instance)
        log = self.run_dir / "logs" / f"{spec.name}.log"
        self._offsets[spec.name] = log.stat().st_size if log.exists() else 0
        argv = spec.argv
        if spec.image is not None:
            self._spawned += 1
            name = self._containers[spec.name] = f"txchaos-{self.run_dir.name}-{spec.name}-{self._spawned}"
            argv = containers.run_argv(spec.image, spec.argv, spec.passed, name=name, run_id=self.run_dir.name)
        try:
            self.procs[spec.name] = spawn(
                argv,
                name=spec.name,
                tag=f"run/{self.run_dir.name}/{spec.name}",
                log_path=log,
                env=spec.env,
                cwd=spec.cwd,
            )
        except OSError as exc:  # checked before the run; gone since (a build folder removed)
            raise HarnessError(f"starting {spec.name} failed: {exc}", hint=f"check the command {spec.argv[0]}") from exc

    def _tick(self) -> None:
        for name, proc in list(self.procs.items()):
            path = self._ready_path(name)
            if path.exists() or not proc.alive():
                continue
            try:
                written = ready_since(proc.log_path, self._offsets.get(name, 0), self.ready)
            except OSError:
                continue
            if written is not None:
                path.touch()
                os.utime(path, ns=(written, written))
                if self._on_ready is not None:
                    self._on_ready(name)

    def _exited(self, spec: Supervised, code: int, sig: str | None) -> None:
        with self._lock:
            expected = spec.name in self._expected
            self._expected.discard(spec.name)
            excused = self._faulted > 0 or time.monotonic() < self._excused_until
        cause = "killed" if expected else ("fault" if excused else "own")
        self.ledger.emit(Kind.WORKER_EXIT, stage=spec.stage, worker=spec.name, returncode=code, signal=sig, cause=cause)
        if cause == "own":
            self.own_exits.append(OwnExit(spec.name, code, sig, self.procs[spec.name].log_path))

    def _failed_start(self, name: str, *, dying: bool, timeout: float = 0.0) -> Exception:
        proc = self.procs[name]
        tail = proc.log_tail(12)
        said = f"\n--- last lines of {proc.log_path} ---\n{tail}" if tail else f" (its log {proc.log_path} is empty)"
        if dying:
            return ConfigError(
                f"service instance {name} keeps ending before it is ready (exit {proc.popen.returncode}){said}",
                hint="run its command by hand with the same environment; the run's endpoints.json has the stack",
            )
        return ConfigError(
            f"service instance {name} never printed a line matching {self.ready.pattern.decode()!r} "
            f"in {timeout:.0f}s{said}",
            hint="print that line once the service serves, or set Service(ready=...) to a line it prints "
            "(and ready_timeout_s= if it needs longer)",
        )
