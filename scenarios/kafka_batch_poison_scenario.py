"""A Kafka batch listener and one poison record: does it sink the good records of its batch?

Twenty orders wait in a one-partition topic; one worker polls them in batches of five. One order,
chosen from the seed (never in the first or last batch), is a poison record that fails on every
delivery. See ``harness.patterns.kafka_batch``.

- ``naive``: effects applied outside the transaction, the batch retried whole (3 attempts), then
  dead-lettered whole -> duplicate-effect and dead-lettered-with-effect on the batch's orders
  before the poison one, dead-lettered on the poison order and the ones after it
- ``indexed``: the listener names the failed record's index -> clean: every good order applied
  once, the poison order alone on the dead-letter topic, with an alert

Run it: ``txchaos run kafka_batch_poison[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys
from functools import partial

import pytest

from harness import ScenarioSpec, read_ledger
from harness.run.spec.kit import by_variant, op_name, seeded_op, spec_maker

NAME = "kafka_batch_poison"
pytestmark = [pytest.mark.integration, pytest.mark.kafka]
MESSAGES = 20
BATCH = 5
ATTEMPTS = 3


def poison_index(seed: int) -> int:
    """Return the operation number of the poison record: never in the first or the last batch."""
    return seeded_op(seed, MESSAGES - BATCH, BATCH)


def expected(variant: str, seed: int) -> dict[str, set[int]]:
    """Return anomaly class -> the operation numbers the verdict must name."""
    if variant != "naive":
        return {}
    poison = poison_index(seed)
    start = poison // BATCH * BATCH
    before, rest = set(range(start, poison)), set(range(poison, start + BATCH))
    out = {"dead-lettered": rest}
    if before:
        out |= {"duplicate-effect": before, "dead-lettered-with-effect": before}
    return out


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    make = spec_maker(
        NAME,
        seed,
        "harness.patterns.kafka_batch",
        flow="kafka",
        schema="kafka_consumer",
        effect_table="kafka_effects",
        messages=MESSAGES,
        poison=frozenset({poison_index(seed)}),
        timeout_s=60,
    )

    def spec(variant: str, handler: str, batch_errors: str) -> ScenarioSpec:
        options = {"batch_size": BATCH, "partitions": 1, "db_tx": "batch", "batch_errors": batch_errors}
        return make(variant, handler, expected(variant, seed), options={**options, "max_attempts": ATTEMPTS})

    return by_variant(spec("naive", "naive_listener", "retry_batch"), spec("indexed", "indexed_listener", "index"))


@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("variant", ["naive", "indexed"])
def test_poison_record_in_a_batch(txchaos_run, variant: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    spec = variants(seed)[variant]
    result = txchaos_run(spec)
    verdict = result.verdict
    op = partial(op_name, variant, seed)
    want = expected(variant, seed)
    assert verdict.found() == {anomaly: len(ops) for anomaly, ops in want.items()}, verdict.headline()
    for anomaly, ops in want.items():
        assert verdict.ops(anomaly) == {op(i) for i in ops}, verdict.headline()
    rows = read_ledger(result.run_dir / "ledger").to_pylist()
    parked = {r["op"] for r in rows if r["kind"] == "dead_letter"}
    alerted = {r["op"] for r in rows if r["kind"] == "alert"}
    poison = op(poison_index(seed))
    if variant == "naive":
        batch = poison_index(seed) // BATCH * BATCH
        assert parked == {op(i) for i in range(batch, batch + BATCH)}  # the whole batch, good records too
        assert alerted == set()
    else:
        assert parked == alerted == {poison}  # the poison record alone, and said so
    assert verdict.stats["submitted"] == MESSAGES


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
