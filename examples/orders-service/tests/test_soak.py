"""The order stage soaked: two workers for a few seconds while the nemesis arms crash points.

A soak finds what one run may miss: operations flow the whole time, and each crash is armed on an
operation a little ahead of the last one submitted. With seed 0 the schedule arms three crashes
between the DB commit and the broker commit (``nemesis.json`` in the run folder lists them). The
naive handler's duplicates show on operations whose worker was killed there; the inbox handler holds
under the same schedule (the same seed draws the same one).
"""

from __future__ import annotations

from dataclasses import replace

from test_orders import orders_spec

from harness import Soak, SoakResult

SEED = 0


def soak(txchaos_soak, variant: str, handler: str, expect: set[str]) -> SoakResult:  # type: ignore[no-untyped-def]
    spec = replace(orders_spec(variant, handler, expect), crashes=())  # the nemesis arms its own
    return txchaos_soak(Soak(spec, duration_s=12, workers=2, nemesis=("crash",), seed=SEED))


def test_a_soak_catches_the_naive_handler_placing_an_order_twice(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    result = soak(txchaos_soak, "naive", "place_order_naive", {"duplicate-effect"})
    verdict = result.verdict
    assert result.stats.crashes_armed == 3, result.stats
    assert verdict.stats["crashes"] >= 1, verdict.headline()  # the crashes fired
    assert result.stats.worker_restarts >= verdict.stats["crashes"], result.stats  # each killed worker came back
    assert set(verdict.found()) == {"duplicate-effect"}, verdict.headline()
    # each crash between the commits placed its order twice: one duplicate per crash, no other
    assert len(verdict.ops("duplicate-effect")) == verdict.stats["crashes"], verdict.headline()


def test_the_inbox_handler_holds_under_the_same_soak(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    result = soak(txchaos_soak, "inbox", "place_order", set())
    verdict = result.verdict
    assert result.stats.crashes_armed == 3, result.stats
    assert verdict.stats["crashes"] >= 1, verdict.headline()
    assert verdict.clean, verdict.headline()
