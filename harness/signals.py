"""Make SIGTERM and SIGHUP interrupt a run the way Ctrl-C does, so healing in ``finally`` runs.

A CI job that times out sends SIGTERM; a closed terminal sends SIGHUP. Python's default for both
is to die on the spot: no ``finally`` runs, a latency toxic stays on the proxy and workers stay
up. ``terminating()`` installs handlers that raise ``Terminated`` (a ``KeyboardInterrupt``) in the
main thread instead, so every path that already heals on Ctrl-C heals on these too. A second
signal while healing is ignored: interrupting the healing is what this module exists to prevent.
Ctrl-C keeps Python's own meaning (a ``KeyboardInterrupt`` each time); ``harness.interrupts``
makes it stop native work (a DuckDB query) while that runs, as these handlers do.

>>> with terminating() as seen:
...     run_the_scenario()  # a SIGTERM here raises Terminated; finally blocks heal
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from harness import procfs
from harness.interrupts import interrupt_all
from harness.poll import deadline_in, poll_until

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A termination signal arrived; raised in the main thread like Ctrl-C's KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"terminated by {self.name}")


class Seen:
    """Which termination signal arrived first, if any."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None


@contextlib.contextmanager
def terminating(signals: tuple[signal.Signals, ...] = SIGNALS) -> Iterator[Seen]:
    """Raise ``Terminated`` in the main thread on ``signals`` while inside; restore the old handlers after.

    Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    seen = Seen()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if seen.signum is not None:
            return  # already healing: let it finish
        seen.signum = signum
        exc = Terminated(signum)
        interrupt_all(exc)  # native work that no longer sees Python's signals (DuckDB 2's queries)
        raise exc

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, handle)
        yield seen
    except Exception as exc:
        # A library that checks for signals inside its own loop turns our Terminated into its own
        # error (DuckDB: "Query interrupted"), which a caller would wrap as a harness failure: the
        # run was asked to stop, and says so.
        if seen.signum is None:
            raise
        raise Terminated(seen.signum) from exc
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def deferred(signals: tuple[signal.Signals, ...] = (signal.SIGINT, *SIGNALS)) -> Iterator[None]:
    """Hold ``signals`` back while inside; deliver the first one that came as the block ends.

    For a step that must not stop halfway: a submission has written its SUBMIT rows and must
    send every one of them, or the ledger claims operations the broker never held (judged lost).
    The signal then reaches whatever handler was there before (``terminating``'s, Ctrl-C's
    KeyboardInterrupt) right after the block, even when the block ends with an exception.
    Outside the main thread this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, lambda signum, _frame: held.append(signum))
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if held:  # asked to stop: that wins, over an error out of the block too (kept as its context)
            signal.raise_signal(held[0])


def children(pid: int | None = None) -> list[int]:
    """Return the live child processes of ``pid`` (default: this process), from /proc."""
    parent = os.getpid() if pid is None else pid
    found = []
    for entry in procfs.PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = procfs.read(int(entry.name))  # None: gone meanwhile
        if stat is not None and stat.ppid == parent and stat.state != "Z":
            found.append(int(entry.name))
    return found


def _ends_by_itself(pid: int) -> bool:
    """Whether child ``pid`` is multiprocessing's resource tracker (a benchmark's process crews start
    one). It ends once this process does, after unlinking what the crews left; stopped before that,
    multiprocessing starts another at exit, which prints a traceback for every name it never saw."""
    return any("multiprocessing.resource_tracker" in arg for arg in procfs.cmdline(pid))


def stop_children(timeout: float = 5.0) -> list[int]:
    """SIGTERM the children still alive after an interrupt's healing, SIGKILL them after ``timeout``.

    Healing stops what the harness tracks; this catches what it does not, such as a JVM a library
    was still launching when the signal came (pyspark's gateway leaks it). Returns their pids.
    """
    left = [pid for pid in children() if not _ends_by_itself(pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    poll_until(lambda: not set(children()) & set(left), deadline=deadline_in(timeout), every_s=0.05)
    for pid in set(children()) & set(left):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    unreaped = set(left)

    def reaped() -> bool:  # leave no zombie either
        for pid in list(unreaped):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    unreaped.discard(pid)
            except ChildProcessError:
                unreaped.discard(pid)  # reaped by its Popen object already
        return not unreaped

    poll_until(reaped, deadline=deadline_in(1.0))
    return left


def message(seen: Seen | BaseException) -> str:
    """Return the one line printed when a run was interrupted: which signal, and that all is stopped."""
    name = seen.name if isinstance(seen, Seen | Terminated) else None
    cause = f"terminated by {name}" if name else "interrupted"
    return f"{cause}; every process the harness started has been stopped and every fault healed"
