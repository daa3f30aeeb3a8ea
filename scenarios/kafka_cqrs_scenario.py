"""CQRS entity events with tombstones into a replica, killed in the at-least-once window.

Fifteen entity events wait in a one-partition topic: five entities, each created (v1), updated
(v2) and deleted (v3, a tombstone), keyed by aggregate id. One replica worker polls them in
batches of five (so every batch holds a delete and earlier events of the same entity), applies
each in its own Postgres transaction and commits the offsets per batch. It is SIGKILLed after
the batch's DB commits, before the offset commit (``before_offset_commit``) on an event chosen
from the seed: the restarted worker gets the whole batch back from the broker.

- ``naive``: the replayed create and update of an entity deleted in that batch re-create it
  after its tombstone -> ``resurrected`` on exactly those events; every replayed event older
  than one the replica already applied -> ``out-of-order``
- ``versioned``: upsert only a newer version, the tombstone kept as a marker row; the same crash,
  and one after a single event's DB commit (``after_db_commit``) in a later batch -> clean

Run it: ``txchaos run kafka_cqrs[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys
from functools import partial

import pytest

from harness import Crash, ScenarioSpec
from harness.patterns.kafka_cqrs import entity_event
from harness.run.spec.kit import batch_of, op_name, spec_maker, two_batches
from harness.verify.model import FlowContract

NAME = "kafka_cqrs"
pytestmark = [pytest.mark.integration, pytest.mark.kafka]
MESSAGES = 15
BATCH = 5


def crashed_op_indexes(seed: int) -> tuple[int, int]:
    """Return the event of the first crash (not in the last batch) and of the second (a later batch)."""
    return two_batches(seed, MESSAGES, BATCH, first_from=0)


def expected_ops(variant: str, seed: int) -> dict[str, set[int]]:
    """Return anomaly class -> the event numbers the verdict must name for ``variant`` at ``seed``.

    The naive replica re-applies the crashed batch once: an event is out of order when a newer
    event of its entity is in the batch, and resurrects its entity when that one is the delete.
    """
    if variant != "naive":
        return {}
    batch = [(n, entity_event(n)) for n in batch_of(crashed_op_indexes(seed)[0], BATCH)]
    newest = {ev.key: max(e.version for _, e in batch if e.key == ev.key) for _, ev in batch}
    deleted = {ev.key for _, ev in batch if ev.tombstone}
    older = {n for n, ev in batch if ev.version < newest[ev.key]}
    return {"out-of-order": older, "resurrected": {n for n in older if entity_event(n).key in deleted}}


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    first, second = crashed_op_indexes(seed)
    make = spec_maker(
        NAME,
        seed,
        "harness.patterns.kafka_cqrs",
        flow="kafka_cqrs",
        schema="kafka_cqrs",
        effect_table="cqrs_journal",
        effect_column="event_id",
        options={"batch_size": BATCH, "partitions": 1},
        messages=MESSAGES,
        timeout_s=60,
        contract=FlowContract(expects_downstream=False, per_key=True),
    )

    def spec(variant: str, handler: str, crashes: tuple[Crash, ...]) -> ScenarioSpec:
        return make(variant, handler, expected_ops(variant, seed), crashes=crashes)

    crash = Crash("before_offset_commit", op_index=first)
    return {
        "naive": spec("naive", "naive_replica", (crash,)),
        "versioned": spec("versioned", "versioned_replica", (crash, Crash("after_db_commit", op_index=second))),
    }


@pytest.mark.parametrize("variant", list(variants()))
def test_cqrs_replica_after_redelivery(txchaos_run, variant: str) -> None:  # type: ignore[no-untyped-def]
    seed = 0
    spec = variants(seed)[variant]
    verdict = txchaos_run(spec).verdict
    op = partial(op_name, variant, seed)
    assert verdict.stats["crashes"] == len(spec.crashes), verdict.stats
    expected = {cls: {op(n) for n in ns} for cls, ns in expected_ops(variant, seed).items()}
    assert verdict.found() == {cls: len(ops) for cls, ops in expected.items()}, verdict.headline()
    for cls, ops in expected.items():
        assert verdict.ops(cls) == ops, verdict.headline()
    # The redelivery came from the broker: the crashed batch was polled again.
    assert verdict.stats["redeliveries"] >= BATCH
    assert verdict.stats["submitted"] == MESSAGES


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
