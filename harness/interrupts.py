"""Native work a signal must stop by hand: ``interruptible(stop)`` while it runs.

DuckDB 2 no longer stops a running query when a Python signal handler raises: the handler runs at
once, but the query goes on to its end (a minute at 100M events) and only then reports "Query
interrupted", a ``RuntimeError`` in place of the handler's exception. A connection's own
``interrupt()`` stops it at once. The engine that opens such a connection registers its
``interrupt`` here:

- while the block runs, Ctrl-C calls every registered stop, then does what the SIGINT handler
  before did (Python's raises ``KeyboardInterrupt``; PySpark's, installed by every SparkContext,
  cancels its jobs and raises it too);
- the handlers of ``harness.signals.terminating`` (SIGTERM, SIGHUP) call
  ``interrupt_all(exc)`` before they raise ``exc``;
- the block that registered the stop raises the interrupt again in place of the library's own
  error, so a caller that wraps errors (``except Exception``) never mistakes the stop for a failure.

This module imports nothing of the harness, so the engines (below the run layer) and the run layer
can both reach it.

>>> with interruptible(con.interrupt):
...     con.execute(query)  # Ctrl-C, or a SIGTERM under terminating(), stops the query now
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType


class _Stop:
    """One registered ``stop``, and the interrupt it was called for, once it was."""

    def __init__(self, stop: Callable[[], object]) -> None:
        self.stop = stop
        self.reason: BaseException | None = None


_STOPS: list[_Stop] = []


@contextlib.contextmanager
def interruptible(stop: Callable[[], object]) -> Iterator[None]:
    """Have Ctrl-C and ``interrupt_all`` call ``stop`` while inside; an error after that call is the interrupt."""
    entry = _Stop(stop)
    _STOPS.append(entry)
    undo = _stop_on_ctrl_c()
    try:
        yield
    except Exception as exc:
        if entry.reason is None:
            raise
        raise entry.reason from exc  # the library's "Query interrupted" is the signal's doing
    finally:
        undo()
        _STOPS.remove(entry)


def interrupt_all(reason: BaseException) -> None:
    """Call every registered ``stop``, newest first, for ``reason`` (the interrupt about to be raised).

    One that fails does not keep the others from running.
    """
    for entry in reversed(list(_STOPS)):
        entry.reason = reason
        with contextlib.suppress(Exception):
            entry.stop()


def _stop_on_ctrl_c() -> Callable[[], None]:
    """Put a SIGINT handler in front of the one there now that first stops the registered work;
    return what takes it away again. Outside the main thread, or when SIGINT is ignored (a job
    started in the background) or not Python's to handle, it changes nothing."""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(before):
        return lambda: None

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        exc = KeyboardInterrupt()
        interrupt_all(exc)
        if before is not signal.default_int_handler:
            before(signum, frame)  # its own way first (PySpark cancels its jobs and raises)
        raise exc

    signal.signal(signal.SIGINT, on_ctrl_c)

    def undo() -> None:
        if signal.getsignal(signal.SIGINT) is on_ctrl_c:  # not if another took SIGINT meanwhile
            signal.signal(signal.SIGINT, before)

    return undo
