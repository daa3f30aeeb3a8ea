"""wait_each: the stack providers' parallel readiness waits."""

from __future__ import annotations

import threading
import time

import pytest

from harness.errors import StackError
from harness.stack.waits import wait_each


def test_the_waits_overlap_and_each_runs_once() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def wait(service: str) -> None:
        time.sleep(0.2)
        with lock:
            seen.append(service)

    started = time.monotonic()
    wait_each(("postgres", "activemq", "kafka", "dtm"), wait)
    assert sorted(seen) == ["activemq", "dtm", "kafka", "postgres"]
    assert time.monotonic() - started < 0.6  # in parallel: about one wait, not four


def test_an_error_is_raised_once_every_wait_has_ended() -> None:
    ended: list[str] = []

    def wait(service: str) -> None:
        if service == "kafka":
            raise StackError("kafka never answered", hint="read its log")
        time.sleep(0.2)
        ended.append(service)

    with pytest.raises(StackError, match="kafka never answered"):
        wait_each(("postgres", "kafka", "dtm"), wait)
    assert sorted(ended) == ["dtm", "postgres"]  # none left probing behind the caller
