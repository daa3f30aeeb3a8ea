"""The CQRS replica's Hypothesis state machine against real Kafka and Postgres.

The rules are the Kafka stage machine's (submit entity events, a crash after the poll, after the
DB commit or before the offset commit, a consumer leaving the group before its offset commit,
latency on the Kafka or Postgres proxy) plus ``crash_at_delete``: a crash point armed on an
entity's delete, polled in one batch with the entity's earlier events. The naive replica must be
caught resurrecting a deleted entity from a redelivered update (its spec's ``expect`` makes the
search hunt ``resurrected``: an update merely replayed out of order is a smaller failure of the same
bug, which shrinking would otherwise settle on); the versioned replica must hold for the
profile's examples, failing on any anomaly.

Run it: ``pytest scenarios/kafka_cqrs_machine_scenario.py`` (``TXCHAOS_PROFILE=dev|ci|nightly``).
"""

from __future__ import annotations

import pytest

from harness import Endpoints
from harness.machines.search import holds, hunt_target
from harness.machines.targets import TARGETS

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
SEARCH_CAP = 40


def test_naive_replica_resurrection_is_caught(txchaos_stack: Endpoints) -> None:
    target = TARGETS["cqrs"]()
    # A counterexample that names the target's anomaly and carries what replays it.
    text, _ = hunt_target(target, txchaos_stack, SEARCH_CAP)
    # A resurrection needs the broker to give back a delete's batch: a crash or a leave after it.
    assert any(rule in text for rule in ("crash_at_delete", "arm_crash", "force_redelivery")), text


def test_versioned_replica_holds(txchaos_stack: Endpoints) -> None:
    target = TARGETS["cqrs"]()
    machine = target.machine(target.fixed, txchaos_stack, **target.attrs)
    holds(machine)
