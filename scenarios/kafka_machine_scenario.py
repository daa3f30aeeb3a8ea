"""The Kafka at-least-once consumer's Hypothesis state machine against real Kafka and Postgres.

The rules are the stage machine's (``harness.machines.stage``) with the Kafka windows: a crash
after the poll, after the DB commit or before the offset commit, a consumer that leaves the group
before its offset commit, and latency on the Kafka or Postgres proxy. The naive consumer (effect,
then offset commit) must be caught applying an effect twice; the inbox consumer (effect and
processed offset in one Postgres transaction) must hold for the profile's examples.

Run it: ``pytest scenarios/kafka_machine_scenario.py`` (``TXCHAOS_PROFILE=dev|ci|nightly``).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harness import Endpoints
from harness.bench.machines import TARGETS
from harness.machines.profiles import profile
from harness.machines.stage import stage_machine

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
# Generous: the naive consumer's duplicate came at the first example when measured.
SEARCH_CAP = 40


def test_naive_consumer_duplicate_is_caught(txchaos_stack: Endpoints) -> None:
    target = TARGETS["kafka"]()
    machine = stage_machine(target.bad, txchaos_stack, **target.attrs)
    search = settings(profile(), max_examples=SEARCH_CAP, database=None, phases=[Phase.explicit, Phase.generate])
    with pytest.raises(AssertionError, match=target.anomaly) as failure:
        run_state_machine_as_test(machine, settings=search)
    assert machine.found_at is not None
    text = str(failure.value)
    for part in ("seed:", "steps:", "run folder:"):
        assert part in text, text
    # The duplicate needs a crash between an effect and the offset commit that covers it.
    assert "arm_crash" in text or "force_redelivery" in text, text


def test_inbox_consumer_holds(txchaos_stack: Endpoints) -> None:
    target = TARGETS["kafka"]()
    machine = stage_machine(target.fixed, txchaos_stack, **target.attrs)
    run_state_machine_as_test(machine, settings=settings(profile(), database=None))
    assert machine.examples >= profile().max_examples
    assert machine.last_result is not None
    assert machine.last_result.verdict.clean, machine.last_result.verdict.headline()
