"""Standby workers: interpreters that have imported the stage runtime before they are needed.

A worker's cold start is ~0.5 s, most of it importing SQLAlchemy and stomp.py. A Hypothesis
example starts a worker and restarts it after every crash, so that cost bounds examples per
minute. ``Standby`` keeps interpreters ready (``python -m harness.worker --standby``: imports
done, blocked on stdin; four of them, since a crash-looping worker restarts every ~0.2 s and a
spare needs ~0.4 s to import on 2 cores: with two, a poison example waited ~0.3 s per restart) and hands
one a worker spec when a worker is wanted; it redirects its output to the run's log and runs
the spec as a cold worker would.

Every standby is spawned by one long-lived keeper thread, because a child dies with the
*thread* that spawned it (PDEATHSIG); a pool's own monitor thread ends with its run.
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

from harness.errors import HarnessError
from harness.paths import cache_root
from harness.stack.procs import Managed, spawn, stop

Request = tuple[Path, Path, str, str]  # spec path, log path, worker name, registry tag


class Standby:
    """Start worker processes from a pre-imported spare; one keeper thread spawns them all."""

    def __init__(self, spares: int = 4) -> None:
        self.spares = spares
        self._requests: queue.Queue[tuple[Request, Future[Managed]] | None] = queue.Queue()
        self._ready: list[Managed] = []
        self._count = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start_worker(self, spec_path: Path, log_path: Path, *, name: str, tag: str, timeout: float = 30.0) -> Managed:
        """Run the worker described by ``spec_path`` in a ready interpreter; returns at once."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._keep, name="worker-standby", daemon=True)
                self._thread.start()
                atexit.register(self.close)
        done: Future[Managed] = Future()
        self._requests.put(((spec_path, log_path, name, tag), done))
        return done.result(timeout)

    def close(self) -> None:
        """Stop the spare interpreters and the keeper thread."""
        self._requests.put(None)
        if self._thread is not None:
            self._thread.join(10)

    # -- the keeper thread ---------------------------------------------------------------------
    def _keep(self) -> None:
        try:
            while True:
                self._ready = [p for p in self._ready if p.alive()]
                while len(self._ready) < self.spares:
                    self._ready.append(self._spawn_spare())
                item = self._requests.get()
                if item is None:
                    return
                request, done = item
                try:
                    done.set_result(self._hand_over(request))
                except BaseException as exc:  # the caller raises it
                    done.set_exception(exc)
        finally:
            for proc in self._ready:
                stop(proc, timeout=1)
            self._ready = []

    def _spawn_spare(self) -> Managed:
        self._count += 1
        return spawn(
            [sys.executable, "-m", "harness.worker", "--standby"],
            name=f"standby-{self._count}",
            tag="worker-standby",
            log_path=cache_root() / "standby" / f"standby-{self._count % 4}.log",
            stdin_pipe=True,
        )

    def _hand_over(self, request: Request) -> Managed:
        spec_path, log_path, name, tag = request
        alive = [p for p in self._ready if p.alive()]
        proc = alive[0] if alive else self._spawn_spare()  # the oldest: most likely done importing
        self._ready = alive[1:]
        stdin = proc.popen.stdin
        if stdin is None:
            raise HarnessError(f"standby {proc.name} has no stdin pipe", hint="spawn standbys with stdin_pipe=True")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            stdin.write(f"{spec_path}\t{log_path}\n".encode())
            stdin.close()
        except BrokenPipeError as exc:
            stop(proc, timeout=1)
            raise HarnessError(
                f"standby worker {proc.name} died before it was used",
                hint=f"read {proc.log_path}",
            ) from exc
        return Managed(name=name, popen=proc.popen, log_path=log_path, record=proc.record, tag=tag)


STANDBY = Standby()
