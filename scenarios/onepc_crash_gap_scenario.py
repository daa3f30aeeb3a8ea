"""Mats3 best-effort 1PC stage, killed between the DB commit and the broker commit.

The stage receives an order, inserts its effect and sends the next message, then commits the
database and then the broker. The worker is SIGKILLed at ``after_db_commit`` on one operation
(chosen from the seed); the broker redelivers that message to the restarted worker.

- ``naive``: the redelivery inserts the effect again          -> duplicate-effect
- ``naive-unique``: the unique key refuses it, the flow stops  -> dead-lettered-with-effect
- ``check-then-skip``: finds the effect, re-emits the message  -> clean (but racy with two
  workers: ``scenarios/soak_scenario.py`` catches it; the next two hold there)
- ``check-then-skip-unique``: the same on the table with a unique key -> clean
- ``check-then-skip-locked``: the same under an advisory lock on the op -> clean

Run it: ``txchaos run onepc_crash_gap[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys

import pytest

from harness import Crash, ScenarioSpec
from harness.run.spec.kit import by_variant, onepc_on, op_name, seeded_op, spec_maker

NAME = "onepc_crash_gap"
pytestmark = [pytest.mark.integration, pytest.mark.activemq]
MESSAGES = 20


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    spec = spec_maker(
        NAME,
        seed,
        "harness.patterns.onepc",
        crashes=(Crash("after_db_commit", op_index=seeded_op(seed, MESSAGES)),),
        messages=MESSAGES,
        timeout_s=45,
    )

    return by_variant(
        spec("naive", "naive", {"duplicate-effect"}, **onepc_on()),
        spec("naive-unique", "naive", {"dead-lettered-with-effect"}, **onepc_on("onepc_effects_unique")),
        spec("check-then-skip", "check_then_skip", **onepc_on()),
        spec("check-then-skip-unique", "check_then_skip", **onepc_on("onepc_effects_unique")),
        spec("check-then-skip-locked", "check_then_skip_locked", **onepc_on()),
    )


@pytest.mark.parametrize("variant", list(variants()))
@pytest.mark.parametrize("seed", [0, 7])
def test_crash_in_the_gap(txchaos_run, variant: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    spec = variants(seed)[variant]
    verdict = txchaos_run(spec).verdict
    crashed = op_name(variant, seed, spec.crashes[0].op_index)
    # The crash really happened in the window, and the harness names the exact operation.
    assert verdict.stats["crashes"] == 1, verdict.stats
    assert verdict.found() == dict.fromkeys(spec.expect, 1), verdict.headline()
    for anomaly in spec.expect:
        assert verdict.ops(anomaly) == {crashed}
    assert verdict.stats["submitted"] == MESSAGES


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
