"""Start workers by forking a pre-imported interpreter: a crash costs milliseconds, not an import.

A worker's cold start is ~0.3 s of CPU, most of it importing SQLAlchemy, stomp.py and the Kafka
client. A Hypothesis example starts a worker and restarts it after every crash, and a poison
message crash-loops it a dozen times an example: with spare interpreters importing in the
background, 2 cores spent the loop importing (measured 100-290 ms from a worker's death to its
replacement subscribing). ``Standby`` keeps one fork server (``harness.worker.zygote``) that has
imported everything and forks each worker from it.

The server is spawned by one long-lived keeper thread, because a child dies with the *thread*
that spawned it (PDEATHSIG); a pool's own monitor thread ends with its run. Each forked worker
dies with the server, so a harness killed by SIGKILL takes the server and every worker with it,
and each worker is recorded for the next start's reaping like any other process.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import IO

from harness.errors import HarnessError
from harness.paths import cache_root
from harness.poll import deadline_in, poll_until
from harness.stack.procs import Managed, spawn, stop, write_record

Request = tuple[Path, Path, str, str]  # spec path, log path, worker name, registry tag
SERVER_TAG = "worker-standby"


class ForkedWorker:
    """A worker forked by the server: ``subprocess.Popen``'s poll/wait, fed by the server's exit reports."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class _Server:
    """One running fork server: its pipes, and the workers it reported forking."""

    def __init__(self, proc: Managed) -> None:
        popen = proc.popen
        if not isinstance(popen, subprocess.Popen) or popen.stdin is None or popen.stdout is None:
            raise HarnessError("the worker fork server has no pipes", hint="spawn it with stdin_pipe and stdout_pipe")
        self.proc = proc
        self.stdin: IO[bytes] = popen.stdin
        self.stdout: IO[bytes] = popen.stdout
        self.pids: queue.Queue[int | None] = queue.Queue()  # answers to requests, in order
        self.workers: dict[int, ForkedWorker] = {}
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="worker-fork-server", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for raw in self.stdout:
                word, *rest = raw.decode().split()
                if word == "pid":
                    pid = int(rest[0])
                    with self.lock:
                        self.workers[pid] = ForkedWorker(pid)
                    self.pids.put(pid)
                elif word == "exit":
                    with self.lock:
                        worker = self.workers.pop(int(rest[0]), None)
                    if worker is not None:
                        worker.ended(int(rest[1]))
        finally:
            # The server is gone, and its workers with it (PDEATHSIG): nobody will report them.
            with self.lock:
                orphans, self.workers = list(self.workers.values()), {}
            for worker in orphans:
                worker.ended(-9)
            self.pids.put(None)

    def fork(self, request: Request, timeout: float) -> Managed:
        spec_path, log_path, name, tag = request
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.stdin.write(f"{spec_path}\t{log_path}\n".encode())
            self.stdin.flush()
            pid = self.pids.get(timeout=timeout)
        except (BrokenPipeError, queue.Empty):
            pid = None
        if pid is None:
            raise HarnessError(f"the worker fork server could not start {name}", hint=f"read {self.proc.log_path}")
        with self.lock:
            worker = self.workers.get(pid)
        if worker is None:  # it ended before we looked: its exit was reported already
            worker = ForkedWorker(pid)
            worker.ended(-9)
        # A forked worker's environment is the server's, so it carries the server's tag: the one a
        # later start checks before it reaps a leaked pid.
        record = write_record(pid, name=name, tag=SERVER_TAG, argv0="harness.worker")
        return Managed(name=name, popen=worker, log_path=log_path, record=record, tag=tag)

    def alive(self) -> bool:
        return self.proc.alive() and self.reader.is_alive()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.stdin.close()  # EOF: the server exits, and its workers die with it
        poll_until(lambda: not self.proc.alive(), deadline=deadline_in(2), every_s=0.01)
        stop(self.proc, timeout=1)


class Standby:
    """Start worker processes by forking a pre-imported server; one keeper thread owns the server."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Request, Future[Managed]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._count = 0

    def start_worker(self, spec_path: Path, log_path: Path, *, name: str, tag: str, timeout: float = 30.0) -> Managed:
        """Run the worker described by ``spec_path`` in a forked interpreter; returns once it runs."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._keep, name="worker-standby", daemon=True)
                self._thread.start()
                atexit.register(self.close)
        done: Future[Managed] = Future()
        self._requests.put(((spec_path, log_path, name, tag), done))
        return done.result(timeout)

    def close(self) -> None:
        """Stop the fork server (its workers die with it) and the keeper thread."""
        self._requests.put(None)
        if self._thread is not None:
            self._thread.join(10)

    # -- the keeper thread ---------------------------------------------------------------------
    def _keep(self) -> None:
        server = self._start_server()  # at once: it imports while the first request is on its way
        try:
            while (item := self._requests.get()) is not None:
                request, done = item
                try:
                    if not server.alive():
                        server.close()
                        server = self._start_server()
                    done.set_result(server.fork(request, timeout=30.0))
                except BaseException as exc:  # the caller raises it
                    done.set_exception(exc)
        finally:
            server.close()

    def _start_server(self) -> _Server:
        self._count += 1
        proc = spawn(
            [sys.executable, "-m", "harness.worker", "--zygote"],
            name=f"worker-fork-server-{self._count}",
            tag=SERVER_TAG,
            log_path=cache_root() / "standby" / f"fork-server-{self._count % 4}.log",
            stdin_pipe=True,
            stdout_pipe=True,
        )
        return _Server(proc)


STANDBY = Standby()
