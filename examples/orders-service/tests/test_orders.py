"""The order stage under a crash between its DB commit and its broker commit.

Run: ``pytest --txchaos-provider local`` (or against a running stack: ``txchaos up``, then
``pytest --txchaos-endpoints reports/stacks/<id>/endpoints.json``).
"""

from __future__ import annotations

from harness import Crash, RunResult, ScenarioSpec, Schema

CRASHED = 3  # the operation whose worker is killed after its DB commit


def orders_spec(variant: str, handler: str, expect: set[str]) -> ScenarioSpec:
    return ScenarioSpec(
        name="orders",
        variant=variant,
        handler=f"orders.handlers:{handler}",  # imported from this project, by the workers too
        # This project's DDL. A plain "orders.sql" would be taken from the working directory;
        # relative_to=__file__ finds it wherever pytest is started.
        schema=Schema.file("../orders.sql", relative_to=__file__),
        effect_table="orders",  # one row per effect, keyed by op_id: where duplicates show
        messages=10,
        crashes=(Crash("after_db_commit", op_index=CRASHED),),
        timeout_s=60,
        expect=frozenset(expect),
    )


def test_naive_handler_places_a_redelivered_order_twice(txchaos_run) -> None:  # type: ignore[no-untyped-def]
    result: RunResult = txchaos_run(orders_spec("naive", "place_order_naive", {"duplicate-effect"}))
    verdict = result.verdict
    assert verdict.stats["crashes"] == 1, verdict.headline()
    assert set(verdict.found()) == {"duplicate-effect"}, verdict.headline()
    assert verdict.ops("duplicate-effect") == {f"naive-s0-op{CRASHED:05d}"}


def test_inbox_handler_places_each_order_once(txchaos_run) -> None:  # type: ignore[no-untyped-def]
    result: RunResult = txchaos_run(orders_spec("inbox", "place_order", set()))
    verdict = result.verdict
    assert verdict.stats["crashes"] == 1, verdict.headline()
    assert verdict.clean, verdict.headline()
