"""The worker fork server: one interpreter imports the runtime once, then forks a worker per request.

A worker killed at a crash point must be replaced at once: a poison message crash-loops its
consumer a dozen times in one Hypothesis example. Starting a fresh interpreter costs ~0.3 s of
CPU for the imports (SQLAlchemy, stomp.py, the Kafka client, pyarrow); on 2 cores a crash loop
spent most of its time importing spares. A fork of an interpreter that has already imported
everything costs a few milliseconds.

Protocol over pipes (``harness.run.processes.standby`` is the other end), one line each:

- stdin: ``SPEC_PATH<TAB>LOG_PATH`` asks for a worker; EOF stops the server.
- stdout: ``pid PID`` answers each request in order; ``exit PID RETURNCODE`` reports a worker's
  end (negative: killed by that signal, as ``subprocess`` reports it).

The server is single-threaded on purpose: a fork copies only the calling thread, and a lock
held by another thread at that moment would stay locked in the child forever.

What the server has imported is frozen out of the cyclic garbage collector before the first fork
(``harness.heap``, as the ``gc`` module's documentation advises for a fork server), and the
workers collect less often: a Kafka worker's collections scanned those hundreds of thousands of
long-lived objects over and over, 1.5 s of its 8.8 s of CPU in a 200,000-operation soak (0.3 s
frozen). The pages holding them also stay shared with every fork, not copied by a collection.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from harness.heap import freeze_loaded

_PR_SET_PDEATHSIG = 1
# Allocations, less frees, before a worker's youngest generation is collected (Python's default is
# 700): a worker's garbage is freed by reference counting (records, contexts, rows), and a Kafka
# worker collected thousands of times a soak for the few cycles it makes.
GEN0_THRESHOLD = 10_000

Runner = Callable[[Path], None]


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _child(spec_path: Path, log_path: str, server_pid: int, run: Runner) -> None:
    """Become the worker: own session, die with the server, output to the log; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, so a stop takes what it starts with it
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:
            os._exit(1)  # the server died between fork and prctl: nobody would stop this worker
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        run(spec_path)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(run: Runner) -> int:
    """Fork ``run(spec_path)`` per request on stdin until EOF; report pids and exits on stdout."""
    server_pid = os.getpid()
    freeze_loaded()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written

    def say(line: str) -> None:
        os.write(1, f"{line}\n".encode())  # raw fd: no buffered object whose lock a fork could copy

    pending = b""
    while True:
        # A SIGCHLD writes the wakeup fd; select is retried after the signal (PEP 475) and sees it.
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        while True:  # reap every worker that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            say(f"exit {pid} {_returncode(status)}")
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return 0  # the harness closed the pipe: its workers die with this process
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            spec_path, _, log_path = line.decode().partition("\t")
            pid = os.fork()
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                _child(Path(spec_path), log_path, server_pid, run)
            # The child sets its group too; doing it here as well means the group exists before
            # the harness hears the pid, so a stop right away cannot miss it.
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)
            say(f"pid {pid}")
