"""Process faults: pause a worker (SIGSTOP of its process group) until healed (SIGCONT).

A paused consumer keeps its in-flight messages: with STOMP heart-beats on, the broker drops it
after a few seconds and redelivers; without, they stay in flight until it resumes. Crash points
(SIGKILL at a named point) live in ``harness.worker.crash``; this module only pauses.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

from harness.errors import ConfigError, HarnessError
from harness.faults.base import check_int


class ProcessGone(HarnessError):
    """The process to pause ended before the signal reached it (a worker killed and being replaced)."""


def _group_of(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError as exc:
        raise ProcessGone(f"no process {pid} to pause", hint="pass the pid of a running worker") from exc


@dataclass(frozen=True)
class Pause:
    """Stop process ``pid`` and its process group (workers lead their own group) until healed.

    >>> with active(Pause(worker.pid), ledger):
    ...     time.sleep(5)                      # the worker holds its messages, frozen
    """

    pid: int
    group: bool = True

    def __post_init__(self) -> None:
        check_int("pid", self.pid, low=2, hint="pass the pid of a worker the harness started (Managed.pid)")
        if self.pid == os.getpid():
            raise ConfigError(f"pid={self.pid} is the harness itself", hint="pause a worker process, not this one")

    @property
    def name(self) -> str:
        return "pause"

    def params(self) -> dict[str, object]:
        return {"pid": self.pid, "group": self.group}

    def apply(self) -> None:
        self._signal(signal.SIGSTOP)

    def heal(self) -> None:
        # The process may be gone (killed while paused): then nothing is left to resume.
        with contextlib.suppress(HarnessError):
            self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if not self.group:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError as exc:
                raise ProcessGone(f"no process {self.pid} to signal", hint="is the worker still running?") from exc
            return
        pgid = _group_of(self.pid)
        # Stopping our own group would freeze the harness and the test runner with it.
        if pgid == os.getpgrp():
            raise ConfigError(
                f"pid={self.pid} shares the harness's process group {pgid}",
                hint="start the process with harness.stack.procs.spawn (its own group), or use Pause(pid, group=False)",
            )
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError as exc:
            raise ProcessGone(f"process group {pgid} of pid {self.pid} is gone", hint="is it running?") from exc
