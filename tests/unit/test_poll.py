"""``poll_until``: yes as soon as the condition holds, no once the deadline passes, progress meanwhile."""

from __future__ import annotations

import time

from harness.poll import deadline_in, poll_until


def test_it_returns_true_as_soon_as_the_condition_holds() -> None:
    asked = []
    assert poll_until(lambda: asked.append(1) or len(asked) == 3, deadline=deadline_in(5), every_s=0.001)
    assert len(asked) == 3


def test_it_returns_false_at_the_deadline_after_asking_at_least_once() -> None:
    asked = []
    assert not poll_until(lambda: asked.append(1) is not None, deadline=time.monotonic() - 1)
    assert asked == [1]
    assert not poll_until(lambda: False, deadline=deadline_in(0.05), every_s=0.01)


def test_it_reports_progress_while_it_waits() -> None:
    waited: list[float] = []
    poll_until(lambda: False, deadline=deadline_in(0.2), every_s=0.01, report=waited.append, report_every_s=0.05)
    assert len(waited) >= 2
    assert waited == sorted(waited)
