"""The Kafka consumers' Hypothesis state machines against real Kafka and Postgres.

The rules are the stage machine's (``harness.machines.stage``) with the Kafka windows: a crash
after the poll, after the DB commit or before the offset commit (alone, or on the last of several
records polled in one batch), a consumer that leaves the group before its offset commit, and
latency on the Kafka or Postgres proxy. Each pattern narrows them to its fault family
(``harness.machines.targets.TARGETS``):

- ``kafka``: the naive consumer (effect, then offset commit) must be caught applying an effect
  twice; the inbox consumer (effect and processed offset in one Postgres transaction) holds.
- ``kafka_auto``: the client's default auto offset store, crashed after the poll, must be caught
  losing records; the event-id inbox consumer with manual offset store holds under the same.
- ``kafka_batch``: poison records among good ones; the batch listener without a failure index
  must be caught dead-lettering good records; the indexed listener holds.

Run it: ``pytest scenarios/kafka_machine_scenario.py`` (``TXCHAOS_PROFILE=dev|ci|nightly``).
"""

from __future__ import annotations

import pytest

from harness import Endpoints
from harness.machines.search import holds, hunt_target
from harness.machines.stage import stage_machine
from harness.machines.targets import TARGETS

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
# Generous: each bad variant was found within its first few examples when measured.
SEARCH_CAP = 40
# The rule a counterexample cannot do without: the fault that opens the pattern's window.
CAUSES = {
    "kafka": ("arm_crash", "crash_in_batch", "force_redelivery"),
    "kafka_auto": ("arm_crash('after_poll')", "crash_in_batch('after_poll'"),
    "kafka_batch": ("submit_poison",),
}


@pytest.mark.parametrize("pattern", list(CAUSES))
def test_bad_variant_is_caught(txchaos_stack: Endpoints, pattern: str) -> None:
    target = TARGETS[pattern]()
    # A counterexample that names the target's anomaly and carries what replays it.
    text, (example, seconds) = hunt_target(target, txchaos_stack, SEARCH_CAP)
    assert any(cause in text for cause in CAUSES[pattern]), text
    print(f"{target.pattern}: {target.anomaly} at example {example} after {seconds:.0f}s")


@pytest.mark.parametrize("pattern", list(CAUSES))
def test_fixed_variant_holds(txchaos_stack: Endpoints, pattern: str) -> None:
    target = TARGETS[pattern]()
    machine = stage_machine(target.fixed, txchaos_stack, **target.attrs)
    holds(machine)
