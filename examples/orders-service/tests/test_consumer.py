"""The orders consumer as a service under txchaos: started as its own process, killed by a wire trap
in the gap between its database COMMIT and its broker ACK, with no change to its code.

The trap holds Postgres's confirmation of the COMMIT of the transaction that carries the order id
and SIGKILLs the consumer: the order is placed, the message never acknowledged, so it comes back.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness import Crash, RunResult, ScenarioSpec, Schema, Service

CRASHED = 3


def consumer_spec(variant: str, *args: str, expect: set[str]) -> ScenarioSpec:
    consumer = Service(
        "orders-consumer",
        command=(sys.executable, "-m", "orders.consumer", *args),
        env={
            "ORDERS_DB": "{postgres_url}",
            "BROKER_HOST": "{stomp_host}",
            "BROKER_PORT": "{stomp_port}",
            "ORDERS_QUEUE": "{input}",
            "SHIPPING_QUEUE": "{output}",
        },
        ready="orders consumer ready",
        output_op="order.id",  # where a shipping message names the order (the harness's op id)
        source=Path(__file__).parents[1],  # the project: the consumer runs from here, so `-m orders.consumer` imports
    )
    return ScenarioSpec.for_service(
        consumer,
        variant=variant,
        schema=Schema.file("../orders.sql", relative_to=__file__),
        effect_table="orders",
        messages=10,
        crashes=(Crash("pg_after_commit", op_index=CRASHED),),
        timeout_s=60,
        expect=frozenset(expect),
    )


def test_consumer_without_inbox_places_the_order_again(txchaos_run) -> None:  # type: ignore[no-untyped-def]
    result: RunResult = txchaos_run(consumer_spec("consumer-naive", expect={"duplicate-effect"}))
    assert set(result.verdict.found()) == {"duplicate-effect"}, result.verdict.headline()
    assert result.verdict.ops("duplicate-effect") == {f"consumer-naive-s0-op{CRASHED:05d}"}


def test_consumer_with_inbox_places_each_order_once(txchaos_run) -> None:  # type: ignore[no-untyped-def]
    result: RunResult = txchaos_run(consumer_spec("consumer-inbox", "--inbox", expect=set()))
    assert result.verdict.stats["crashes"] == 1, result.verdict.headline()
    assert result.verdict.clean, result.verdict.headline()
