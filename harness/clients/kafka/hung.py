"""A watch over calls into librdkafka that may outlive the bound they were given.

librdkafka's ``send_offsets_to_transaction`` waits for the group coordinator without checking its
timeout: when the coordinator goes away during the call (a broker restart), the call blocks for
good (librdkafka issue 5456, open in 2.16). A saga soak under broker restarts showed it: a worker
stayed blocked there through the whole two-minute quiescence, and its fixed saga was judged
``stuck``. A blocked C call cannot be interrupted from Python, so once a call outlives its bound
by a grace, the watch ends the process. Its supervisor starts it again, and the new producer's
``init_transactions`` aborts what the old one left open, as a container's liveness probe would.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

HUNG_GRACE_S = 10.0  # past a call's own bound: librdkafka's retries inside that bound are not a hang
HUNG_EXIT = 70  # the exit code of a process the watch ended (EX_SOFTWARE)


def end_process(what: str) -> None:
    """Say ``what`` hung on stderr (the worker's log) and end the process at once."""
    sys.stderr.write(f"{what}; ending the process so that its supervisor starts it again\n")
    sys.stderr.flush()
    os._exit(HUNG_EXIT)


class CallWatch:
    """Run calls bounded at ``bound_s``; call ``on_hung`` once one is still running ``grace_s`` later.

    One daemon thread per watch looks every ``every_s`` until ``close``; a call costs two
    attribute writes.
    """

    def __init__(
        self,
        bound_s: float,
        on_hung: Callable[[str], None] = end_process,
        *,
        grace_s: float = HUNG_GRACE_S,
        every_s: float = 0.5,
    ) -> None:
        self.bound_s, self.grace_s, self.every_s = bound_s, grace_s, every_s
        self.on_hung = on_hung
        self._running: tuple[str, float] | None = None  # (what, when it counts as hung)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="txchaos-kafka-call-watch", daemon=True)
        self._thread.start()

    def run(self, what: str, call: Callable[[], None]) -> None:
        """Run ``call`` (``what`` names it) under the watch."""
        self._running = (what, time.monotonic() + self.bound_s + self.grace_s)
        try:
            call()
        finally:
            self._running = None

    def close(self) -> None:
        """Stop watching (the thread ends within ``every_s``)."""
        self._closed.set()

    def _watch(self) -> None:
        while not self._closed.wait(self.every_s):
            running = self._running
            if running is not None and time.monotonic() > running[1]:
                self.on_hung(
                    f"Kafka {running[0]} still blocked {self.bound_s + self.grace_s:.0f} s into a call bounded "
                    f"at {self.bound_s:.0f} s (librdkafka issue 5456: a group coordinator gone mid-call)"
                )
                return
