"""Native work a signal must stop by hand: ``interruptible(stop)`` while it runs.

DuckDB 2 no longer stops a running query when a Python signal handler raises: the handler runs at
once, but the query goes on to its end (a minute at 100M events) and only then reports "Query
interrupted", a ``RuntimeError`` in place of the handler's exception. A connection's own
``interrupt()`` stops it at once. The engine that opens such a connection registers its
``interrupt`` here; the handlers of ``harness.run.core.signals.terminating`` (SIGTERM, SIGHUP and
Ctrl-C) call ``interrupt_all(exc)`` before they raise ``exc``, and the block that registered the
stop raises ``exc`` again in place of the library's own error, so a caller that wraps errors
(``except Exception``) never mistakes the stop for a failure. This module imports nothing of the
harness, so the engines (below the run layer) and the run layer can both reach it.

>>> with interruptible(con.interrupt):
...     con.execute(query)  # a SIGTERM or Ctrl-C under terminating() stops the query now
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class _Stop:
    """One registered ``stop``, and the interrupt it was called for, once it was."""

    def __init__(self, stop: Callable[[], object]) -> None:
        self.stop = stop
        self.reason: BaseException | None = None


_STOPS: list[_Stop] = []


@contextlib.contextmanager
def interruptible(stop: Callable[[], object]) -> Iterator[None]:
    """Have ``interrupt_all`` call ``stop`` while inside; an error after that call is the interrupt."""
    entry = _Stop(stop)
    _STOPS.append(entry)
    try:
        yield
    except Exception as exc:
        if entry.reason is None:
            raise
        raise entry.reason from exc  # the library's "Query interrupted" is the signal's doing
    finally:
        _STOPS.remove(entry)


def interrupt_all(reason: BaseException) -> None:
    """Call every registered ``stop``, newest first, for ``reason`` (the interrupt about to be raised).

    One that fails does not keep the others from running.
    """
    for entry in reversed(list(_STOPS)):
        entry.reason = reason
        with contextlib.suppress(Exception):
            entry.stop()
