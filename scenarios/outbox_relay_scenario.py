"""Inbox/outbox: the order and its outbox row in one transaction, a relay, a consumer stage.

``worker`` places each order and writes its outbox row (plus a NOTIFY) in the stage transaction;
the ``relay`` helper sends each row to ``consumer``'s queue and marks it sent; ``consumer``
applies the effect (``outbox_effects``) and emits the flow's outgoing message. The relay and the
stages are SIGKILLed at chosen points, on operations chosen from the seed.

- ``sweeper-off``: the relay only relays rows it is told about; killed after it took a row,
  before the send                                              -> orphan-outbox
- ``naive-consumer``: sweeper on; the relay killed after the send, before marking the row:
  the sweeper sends it again, the consumer applies it twice  -> duplicate-effect
- ``inbox-sweeper``: sweeper on, consumer with an inbox keyed by the producer's msg_id; killed at
  every point of the relay, the producer stage and the consumer, each on its own operation
                                                              -> clean

Run it: ``txchaos run outbox_relay[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import json
import random
import sys

import pytest

from harness import Crash, Helper, Kind, ScenarioSpec, Stage, read_ledger
from harness.patterns.outbox import POINTS
from harness.run.spec.kit import by_variant, op_name, spec_maker

NAME = "outbox_relay"
pytestmark = [pytest.mark.integration, pytest.mark.activemq]
MESSAGES = 12
PATTERN = "harness.patterns.outbox"

# Every point of the fixed variant: (point, worker). worker-0 is the producer stage.
FIXED_POINTS: tuple[tuple[str, str], ...] = (
    ("relay_before_send", "relay"),
    ("relay_after_send", "relay"),
    ("before_db_commit", "worker-0"),
    ("after_db_commit", "worker-0"),
    ("after_broker_commit", "worker-0"),
    ("before_db_commit", "consumer-0"),
    ("after_db_commit", "consumer-0"),
    ("after_broker_commit", "consumer-0"),
)


def crash_ops(seed: int) -> list[int]:
    """Return distinct operation numbers for the crashes at ``seed`` (one per fixed point)."""
    return random.Random(seed).sample(range(MESSAGES), len(FIXED_POINTS))


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    ops = crash_ops(seed)
    make = spec_maker(
        NAME,
        seed,
        PATTERN,
        schema="outbox",
        effect_table="outbox_effects",
        outbox_table="outbox",
        points=POINTS,
        messages=MESSAGES,
        settle_s=0.3,
    )

    def spec(variant: str, consumer: str, sweeper: bool, crashes: tuple[Crash, ...], expect: set[str]) -> ScenarioSpec:
        chain = (Stage("consumer", f"{PATTERN}:{consumer}"),)
        relay = Helper("relay", f"{PATTERN}:relay", options={"sweeper": sweeper})
        # An orphaned row never comes out: the sweeper-off run waits its whole timeout.
        timeout_s = 4 if not sweeper else 30
        return make(variant, "place_order", expect, chain=chain, helpers=(relay,), crashes=crashes, timeout_s=timeout_s)

    def crash(i: int) -> Crash:
        point, worker = FIXED_POINTS[i]
        return Crash(point, op_index=ops[i], worker=worker)

    return by_variant(
        spec("sweeper-off", "consumer_inbox", False, (crash(0),), {"orphan-outbox"}),
        spec("naive-consumer", "consumer_naive", True, (crash(1),), {"duplicate-effect"}),
        spec("inbox-sweeper", "consumer_inbox", True, tuple(crash(i) for i in range(len(FIXED_POINTS))), set()),
    )


@pytest.mark.parametrize("variant", list(variants()))
@pytest.mark.parametrize("seed", [0, 3])
def test_outbox_relay(txchaos_run, variant: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    spec = variants(seed)[variant]
    result = txchaos_run(spec)
    verdict = result.verdict
    assert set(verdict.found()) == set(spec.expect), verdict.headline()
    # Every armed point was reached and fired: the windows were really hit.
    assert verdict.stats["crashes"] == len(spec.crashes), verdict.stats
    assert verdict.stats["submitted"] == MESSAGES
    crashed = op_name(variant, seed, crash_ops(seed)[0 if variant == "sweeper-off" else 1])
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    relayed = [e for e in events if e["kind"] == Kind.SEND and e["src"] == "relay" and e["op"] == crashed]
    if variant == "sweeper-off":
        # The row the relay died on is an orphan, and so is any row whose NOTIFY the dead relay never
        # read: each was committed after the crashed one (the relay reads them in commit order),
        # and none was ever relayed.
        orphans = verdict.ops("orphan-outbox")
        assert crashed in orphans, verdict.headline()
        committed = {e["op"]: e["ts_ns"] for e in events if e["kind"] == Kind.DB_COMMIT and e["src"] == "worker-0"}
        assert all(committed[op] > committed[crashed] for op in orphans - {crashed}), verdict.headline()
        assert not [e for e in events if e["kind"] == Kind.SEND and e["src"] == "relay" and e["op"] in orphans]
    elif variant == "naive-consumer":
        assert verdict.ops("duplicate-effect") == {crashed}, verdict.headline()
        # Sent once by the notification, then again by the sweeper after the relay's restart.
        assert [json.loads(e["detail"]).get("swept") for e in relayed] == [False, True]
    else:
        skips = {e["op"] for e in events if e["kind"] == Kind.SKIP}
        # The inbox caught the re-sent message; the producer skipped its redelivered order.
        assert crashed in skips
        assert op_name(variant, seed, crash_ops(seed)[3]) in skips
    assert result.as_expected


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
