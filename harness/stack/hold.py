"""One run at a time on a stack: ``StackHold``.

A run begins by emptying every table and removing every toxic of the stack it runs on, and a soak
opens and heals faults on it for an hour. A second run on the same stack meanwhile (a second
terminal, a benchmark next to a soak) would empty the first one's tables and heal its faults, and
the first one's verdict would then be wrong without saying so. So a run holds its stack for its
whole life, and the pytest plugin's reset between tests holds it while it resets; whoever comes
second is refused at once, told who holds the stack.

The hold is an advisory ``flock`` on a file in the stack's state folder: the kernel drops it when
the holder's process ends, however it ends, so a killed run never leaves its stack held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import IO, Self

from harness.errors import ConfigError
from harness.paths import cache_root
from harness.stack.base import Endpoints

HOLD_NAME = "run.lock"


def hold_path(endpoints: Endpoints) -> Path:
    """Return the file a hold on ``endpoints``' stack locks: in its state folder, or (a stack
    described without one) in the cache, by stack id."""
    state = Path(endpoints.state_dir) if endpoints.state_dir else None
    if state is not None and state.is_dir():
        return state / HOLD_NAME
    folder = cache_root() / "holds"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{endpoints.stack_id or 'unnamed'}.lock"


class StackHold:
    """Hold ``endpoints``' stack for ``holder`` (words saying who, for whoever is refused), or raise
    ``ConfigError`` naming the holder; ``release`` (or the end of the ``with`` block, or of the
    process) lets the next one in. Releasing twice is harmless."""

    def __init__(self, endpoints: Endpoints, holder: str) -> None:
        self.path = hold_path(endpoints)
        self._file: IO[str] | None = self.path.open("a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            who = self._file.read().strip() or "another run"
            self._file.close()
            self._file = None
            raise ConfigError(
                f"stack {endpoints.stack_id} is in use by {who}: a second run would empty its tables and heal its "
                "faults",
                hint="wait until it ends, or give this run a stack of its own (`txchaos up` starts another; "
                "TXCHAOS_ENDPOINTS names its endpoints.json)",
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{holder} (pid {os.getpid()}, since {time.strftime('%H:%M:%S')})\n")
        self._file.flush()

    @property
    def held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            self._file.seek(0)
            self._file.truncate()
        self._file.close()  # closing drops the lock
        self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
