"""Native work a termination must stop by hand: ``interruptible(stop)`` while it runs.

DuckDB 2 no longer stops a running query when a Python signal handler raises: the handler runs at
once, but the query goes on to its end (a minute at 100M events) and only then reports "Query
interrupted". A connection's own ``interrupt()`` stops it at once. The engine that opens such a
connection registers its ``interrupt`` here; ``harness.run.core.signals.terminating`` calls every
registered one before it raises ``Terminated``. This module imports nothing of the harness, so the
engines (below the run layer) and the run layer can both reach it.

>>> with interruptible(con.interrupt):
...     con.execute(query)  # a SIGTERM under terminating() stops the query now
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_STOPS: list[Callable[[], object]] = []


@contextlib.contextmanager
def interruptible(stop: Callable[[], object]) -> Iterator[None]:
    """Have ``interrupt_all`` call ``stop`` while inside."""
    _STOPS.append(stop)
    try:
        yield
    finally:
        _STOPS.remove(stop)


def interrupt_all() -> None:
    """Call every registered ``stop``, newest first; one that fails does not keep the others from running."""
    for stop in reversed(list(_STOPS)):
        with contextlib.suppress(Exception):
            stop()
