"""A poison message with a consumer that crashes on it, every delivery.

Twelve orders, one of them poison (chosen from the seed). The worker dies on the poison message
each time it is delivered; the supervisor restarts it and the broker redelivers at once.

- ``crashing``: redelivered until the run's time is up, never dead-lettered
  -> never-dead-lettered-poison, and stuck: the poison message and, with one consumer, every
  order queued behind it (the broker redelivers it first, each time: it blocks the queue)
- ``attempt-counter``: the delivery counter on a separate autocommit connection diverts it to
  the DLQ with an alert after 3 deliveries; every other order goes through -> clean

Run it: ``txchaos run poison_message[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys

import pytest

from harness import FlowContract, Kind, ScenarioSpec, read_ledger
from harness.run.spec.kit import by_variant, op_name, seeded_op, spec_maker

NAME = "poison_message"
pytestmark = [pytest.mark.integration, pytest.mark.activemq]
MESSAGES = 12


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    spec = spec_maker(
        NAME,
        seed,
        "harness.patterns.poison",
        schema="poison",
        effect_table="poison_effects",
        messages=MESSAGES,
        poison=frozenset({seeded_op(seed, MESSAGES)}),
        settle_s=0.3,
        # The run stops waiting once the worker has crash-looped more than max_deliveries times.
        timeout_s=30,
        # More than 10 deliveries of a message that is never applied nor dead-lettered: poison.
        contract=FlowContract(max_deliveries=10),
    )
    return by_variant(
        spec("crashing", "crashing", {"never-dead-lettered-poison", "stuck"}),
        spec("attempt-counter", "attempt_counter"),
    )


@pytest.mark.parametrize("variant", list(variants()))
def test_poison_message(variant: str, txchaos_run: object) -> None:
    spec = variants()[variant]
    result = txchaos_run(spec)  # type: ignore[operator]
    verdict = result.verdict
    (poison,) = spec.poison
    poison_op = op_name(variant, 0, poison)
    assert set(verdict.found()) == set(spec.expect), verdict.headline()
    if spec.expect:
        assert verdict.ops("never-dead-lettered-poison") == {poison_op}
        behind = {op_name(variant, 0, n) for n in range(poison, MESSAGES)}
        assert verdict.ops("stuck") == behind, "the poison message blocks exactly the orders behind it"
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    of_poison = [e["kind"] for e in events if e["op"] == poison_op]
    deliveries = of_poison.count(Kind.DELIVER)
    if variant == "crashing":
        assert deliveries > 10, f"only {deliveries} deliveries of the poison message"
        assert Kind.DEAD_LETTER not in of_poison
    else:  # diverted after 3 deliveries, flagged, and the other orders all went through
        assert deliveries == 4, of_poison
        assert of_poison.count(Kind.ALERT) == 1
        assert of_poison.count(Kind.DEAD_LETTER) == 1
        assert verdict.stats["submitted"] == MESSAGES
    assert result.as_expected


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
