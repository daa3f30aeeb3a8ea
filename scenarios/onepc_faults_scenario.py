"""The 1PC stage with its crash in the gap, under each fault family: slow network, reset
connections, a broker killed with -9 and restarted.

Twenty orders; the worker is killed after the DB commit on one of them, and one fault window
opens after the fifth order and holds for a while as the flow goes on. The fault must not hide
the anomaly from the harness, and must not make the fixed stage fail:

- ``naive-<fault>``: -> duplicate-effect, on the crashed operation at least
- ``check-then-skip-<fault>``: -> clean

Run it: ``txchaos run onepc_faults[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys

import pytest

from harness import Crash, KillBroker, Latency, ResetPeer, ScenarioSpec
from harness.run.spec.kit import by_variant, onepc_on, op_name, seeded_op, spec_maker
from harness.run.spec.scenario import FaultWindow

NAME = "onepc_faults"
pytestmark = [pytest.mark.integration, pytest.mark.activemq]
MESSAGES = 20

FAULTS = {
    "latency": FaultWindow(Latency(150, jitter_ms=50), after_ops=5, hold_s=2.0, target="activemq_stomp"),
    "db-reset": FaultWindow(ResetPeer(), after_ops=5, hold_s=0.5, target="postgres"),
    "broker-kill": FaultWindow(KillBroker("activemq"), after_ops=5, hold_s=0.5),
}


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    spec = spec_maker(
        NAME,
        seed,
        "harness.patterns.onepc",
        **onepc_on(),
        # One operation from the seed, after the fault opens (op 6 on).
        crashes=(Crash("after_db_commit", op_index=seeded_op(seed, MESSAGES, 6)),),
        messages=MESSAGES,
        settle_s=0.3,
        timeout_s=60,
    )
    return by_variant(
        *(
            spec(f"{variant}-{label}", handler, expect, faults=(window,))
            for label, window in FAULTS.items()
            for variant, handler, expect in (
                ("naive", "naive", {"duplicate-effect"}),
                ("check-then-skip", "check_then_skip", set()),
            )
        )
    )


@pytest.mark.parametrize("variant", list(variants()))
def test_crash_gap_under_faults(txchaos_run, variant: str) -> None:  # type: ignore[no-untyped-def]
    spec = variants(0)[variant]
    result = txchaos_run(spec)
    verdict = result.verdict
    crashed = op_name(variant, 0, spec.crashes[0].op_index)
    assert set(verdict.found()) == set(spec.expect), verdict.headline()
    if spec.expect:
        assert crashed in verdict.ops("duplicate-effect")
    assert verdict.stats["submitted"] == MESSAGES
    assert result.as_expected


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
