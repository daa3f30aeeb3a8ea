"""The Kafka at-least-once consumer, killed in its two windows.

Twenty orders wait in a one-partition topic; one worker in a consumer group polls them in
batches of five, applies each order's effect in its own Postgres transaction, emits an event,
and commits the offsets. The worker is SIGKILLed at a point chosen from the seed; its
partition moves to its restarted self once the dead member's session times out (6 s).

- ``naive``: killed after the batch's DB commits, before the offset commit
  (``before_offset_commit``): the batch is polled again -> duplicate-effect on all five orders
- ``naive-mid-batch``: killed right after one order's DB commit (``after_db_commit``)
  -> duplicate-effect on the batch's orders up to and including that one
- ``auto-store``: librdkafka's default offset store (the offset of a record is stored when the
  record is handed over) with a commit after each record; killed after the poll, before an
  order's DB work (``after_poll``) -> lost: that order and the rest of its batch
- ``inbox-offset`` / ``inbox-event``: manual offset store, an inbox keyed by the record's
  (topic, partition, offset) or by its event id, killed in both windows -> clean
- ``naive-batch`` / ``inbox-offset-batch``: ``naive`` and ``inbox-offset`` with one Postgres
  transaction per batch (one INSERT applies the batch's effects; the inbox one first claims the
  batch's offsets and applies only the new records'), killed as ``naive`` -> duplicate-effect on
  all five, and in both windows -> clean. These are the consumers to soak for throughput:
  ``txchaos soak kafka_consumer:inbox-offset-batch --workers 1 --option batch_size=500 --option partitions=3``
- ``one-output``: ``inbox-event`` on a flow that promises one output per order
  (``FlowContract(exactly_once_output=True)``), the event produced after each DB commit, killed
  before the offset commit: the re-polled batch skips its effects but emits its events again
  -> duplicate-output on the batch's orders whose first event had left the producer before the
  kill (the others' were still queued in it and died with it); by rows it is clean, a second
  event being only a statistic
- ``one-output-txn``: the same promise, the events produced in a Kafka transaction with the
  offsets (read ``read_committed``): the killed batch's events are aborted -> clean

Run it: ``txchaos run kafka_consumer[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest

from harness import Crash, FlowContract, ScenarioSpec
from harness.run.spec.kit import batch_of, op_name, spec_maker, two_batches

NAME = "kafka_consumer"
pytestmark = [pytest.mark.integration, pytest.mark.kafka]
MESSAGES = 20
BATCH = 5


def crashed_op_indexes(seed: int) -> tuple[int, int]:
    """Return the operation of the first crash (not the first or last batch's) and of the second (a later batch)."""
    return two_batches(seed, MESSAGES, BATCH, first_from=BATCH)


def expected_ops(variant: str, seed: int) -> set[int]:
    """Return the operation numbers the verdict must name for ``variant`` at ``seed``."""
    first, _ = crashed_op_indexes(seed)
    batch = batch_of(first, BATCH)
    if variant in ("naive", "naive-batch"):
        return set(batch)
    if variant == "one-output":  # at most these: see the module docstring
        return set(batch)
    if variant == "naive-mid-batch":
        return set(range(batch.start, first + 1))
    if variant == "auto-store":
        return set(range(first, batch.stop))
    return set()


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    first, second = crashed_op_indexes(seed)
    manual = {"batch_size": BATCH, "partitions": 1}
    make = spec_maker(
        NAME,
        seed,
        "harness.patterns.kafka_consumer",
        flow="kafka",
        schema="kafka_consumer",
        effect_table="kafka_effects",
        messages=MESSAGES,
        timeout_s=60,
    )

    def spec(
        variant: str,
        handler: str,
        options: dict[str, object],
        crashes: tuple[Crash, ...],
        expect: set[str],
        contract: FlowContract | None = None,
    ) -> ScenarioSpec:
        return make(variant, handler, expect, options=options, crashes=crashes, contract=contract or FlowContract())

    both = (Crash("before_offset_commit", op_index=first), Crash("after_poll", op_index=second))
    auto = {**manual, "offset_store": "auto", "commit": "record"}
    batched = {**manual, "db_tx": "batch"}
    one_output = FlowContract(exactly_once_output=True)
    return {
        "naive": spec("naive", "naive", manual, both[:1], {"duplicate-effect"}),
        "naive-mid-batch": spec(
            "naive-mid-batch", "naive", manual, (Crash("after_db_commit", op_index=first),), {"duplicate-effect"}
        ),
        "auto-store": spec("auto-store", "naive", auto, (Crash("after_poll", op_index=first),), {"lost"}),
        "inbox-offset": spec("inbox-offset", "inbox_offset", manual, both, set()),
        "inbox-event": spec("inbox-event", "inbox_event", manual, both, set()),
        "naive-batch": spec("naive-batch", "naive_batch", batched, both[:1], {"duplicate-effect"}),
        "inbox-offset-batch": spec("inbox-offset-batch", "inbox_offset_batch", batched, both, set()),
        "one-output": spec("one-output", "inbox_event", manual, both[:1], {"duplicate-output"}, one_output),
        "one-output-txn": spec(
            "one-output-txn", "inbox_event", {**manual, "commit": "transaction"}, both[:1], set(), one_output
        ),
    }


def crashed_batch(run_dir: Path) -> list[str]:
    """Return, from the ledger, the operations polled in the same batch as the first crash."""
    from harness.ledger.reader import read_ledger

    rows = read_ledger(run_dir / "ledger").to_pylist()
    crash = min((r for r in rows if r["kind"] == "crash"), key=lambda r: r["ts_ns"])
    delivered = [r for r in rows if r["kind"] == "deliver" and r["pid"] == crash["pid"]]
    batch = next(json.loads(r["detail"])["batch"] for r in delivered if r["op"] == crash["op"])
    return [r["op"] for r in sorted(delivered, key=lambda r: r["seq"]) if json.loads(r["detail"])["batch"] == batch]


@pytest.mark.parametrize("variant", list(variants()))
def test_consumer_crash_windows(txchaos_run, variant: str) -> None:  # type: ignore[no-untyped-def]
    seed = 0
    spec = variants(seed)[variant]
    result = txchaos_run(spec)
    verdict = result.verdict
    op = partial(op_name, variant, seed)
    assert verdict.stats["crashes"] == len(spec.crashes), verdict.stats
    # The batch the ledger shows around the first crash is the one the seed predicts.
    first, _ = crashed_op_indexes(seed)
    assert crashed_batch(result.run_dir) == [op(i) for i in batch_of(first, BATCH)]
    named = {op(i) for i in expected_ops(variant, seed)}
    if variant == "one-output":  # the batch's events that had left the producer before the kill
        assert set(verdict.found()) == {"duplicate-output"}, verdict.headline()
        assert verdict.ops("duplicate-output") <= named, verdict.headline()
        assert verdict.stats["duplicate_downstream_deliveries"] == verdict.anomalies["duplicate-output"]
        return
    assert verdict.found() == ({next(iter(spec.expect)): len(named)} if spec.expect else {}), verdict.headline()
    for anomaly in spec.expect:
        assert verdict.ops(anomaly) == named, verdict.headline()
    if not spec.expect:
        assert verdict.stats["redeliveries"] >= BATCH  # the crashes did make the group poll records again
    assert verdict.stats["submitted"] == MESSAGES


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
