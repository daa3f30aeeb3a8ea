"""A sink's life over a long run: it rides out many broker restarts, and a dead one stops the run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.run.core.sink_parts import Messages
from harness.run.transports.activemq_sink import MAX_RECONNECTS, Reconnects


def test_a_sink_rides_out_any_number_of_broker_kills() -> None:
    """A 1M-op soak killed the broker 8 times in 42 minutes; a budget for the whole run was spent
    by then (each kill: a lost connection and a refused connect or a few) and the sink died."""
    budget = Reconnects()
    for _ in range(10 * MAX_RECONNECTS):
        assert not budget.failed(connected=True)  # the connection the kill cut
        for _ in range(5):
            assert not budget.failed(connected=False)  # the broker still down: refused
    assert budget.in_row == 6


def test_a_broker_that_stays_away_spends_the_budget_with_growing_waits() -> None:
    budget = Reconnects()
    assert not budget.failed(connected=True)
    waits = [budget.wait_s]
    spent = [budget.failed(connected=False) for _ in range(MAX_RECONNECTS)]
    waits.append(budget.wait_s)
    assert spent == [False] * (MAX_RECONNECTS - 1) + [True]
    assert waits == [0.2, 2.0]  # 0.2 s after the first failure, capped at 2 s


class _DeadSink:
    def check(self) -> None:
        raise HarnessError("STOMP connect to 127.0.0.1:1 failed", hint="is the broker up?")

    def count(self) -> int:
        return 452_364


def test_a_dead_sink_stops_whoever_counts_what_came_out() -> None:
    """The soak's closed loop asks every tick how many came out: a dead sink's count never moves, and
    the soak waited on it for ever; it now stops on the sink's error (healed, its books closed)."""
    place: Any = SimpleNamespace(sink=_DeadSink())
    workload = Messages(session=None, place=place)  # type: ignore[arg-type]
    with pytest.raises(HarnessError, match="STOMP connect"):
        workload.out_count()
    place.sink = None
    assert workload.out_count() is None  # no sink (yet, or any more): nothing to count
