"""Wait for a condition, bounded: ``poll_until``, the one deadline loop the run layer uses.

>>> poll_until(lambda: not settlement.unsettled(), deadline=time.monotonic() + 10)
True
"""

from __future__ import annotations

import time
from collections.abc import Callable


def deadline_in(seconds: float) -> float:
    """Return the ``time.monotonic()`` deadline ``seconds`` from now."""
    return time.monotonic() + seconds


def poll_until(
    done: Callable[[], bool],
    *,
    deadline: float,
    every_s: float = 0.02,
    report: Callable[[float], None] | None = None,
    report_every_s: float = 5.0,
) -> bool:
    """Ask ``done()`` every ``every_s`` seconds until it says yes (True) or ``deadline`` passes (False).

    ``done`` is asked at least once, even past the deadline. ``report(waited_s)`` is called every
    ``report_every_s`` while it waits: progress on a long wait, for the person watching.
    """
    started = time.monotonic()
    next_report = started + report_every_s
    while True:
        if done():
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if report is not None and now >= next_report:
            report(now - started)
            next_report = now + report_every_s
        time.sleep(max(0.0, min(every_s, deadline - now)))
