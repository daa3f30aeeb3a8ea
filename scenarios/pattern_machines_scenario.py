"""Every ActiveMQ pattern's Hypothesis state machine against the real stack: bad caught, fixed holds.

The patterns and their rules are the ones ``txchaos bench machines`` measures
(``harness.machines.targets.TARGETS``). The 1PC stage has its own file, which also proves the
counterexample shrinks (``onepc_machine_scenario.py``); here the search stops at the first
counterexample (no shrink phase: shrinking is what the benchmark times), and the fixed variant
runs the profile's examples (``TXCHAOS_PROFILE=dev|ci|nightly``) without a single failure.

Run it: ``pytest scenarios/pattern_machines_scenario.py``.
"""

from __future__ import annotations

import pytest

from harness import Endpoints
from harness.machines.search import holds, hunt_target
from harness.machines.stage import stage_machine
from harness.machines.targets import TARGETS

pytestmark = [pytest.mark.integration, pytest.mark.activemq]
# The ActiveMQ patterns but the 1PC stage, which has its own file (onepc_machine_scenario.py), as
# has every Kafka pattern (kafka_*machine_scenario.py).
PATTERNS = [name for name, target in TARGETS.items() if name != "onepc" and target().bad.flow.name == "activemq"]
# Generous: each pattern's bad variant was found within its first 7 examples when measured.
SEARCH_CAP = 60


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bad_variant_is_caught(txchaos_stack: Endpoints, pattern: str) -> None:
    target = TARGETS[pattern]()
    # A counterexample that names the target's anomaly and carries what replays it.
    _, (example, seconds) = hunt_target(target, txchaos_stack, SEARCH_CAP)
    print(f"{target.pattern}: {target.anomaly} at example {example} after {seconds:.0f}s")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_fixed_variant_holds(txchaos_stack: Endpoints, pattern: str) -> None:
    target = TARGETS[pattern]()
    machine = stage_machine(target.fixed, txchaos_stack, **target.attrs)
    holds(machine)
