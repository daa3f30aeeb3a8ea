"""The 1PC stage under the redelivery randomizer's actions, not only a crash.

A worker gives one message back to the broker after its DB commit, in each of the ways a real
consumer does: ABORT then UNSUBSCRIBE, or a dropped connection before the ACK. Every way is a
redelivery of a message whose effect is already committed, so the naive stage applies it twice
and the check-then-skip stage must not. A NACK *before* the commit shows the broker fact the
machines are told about: without the redelivery plugin a NACK dead-letters at once.

- ``naive-<action>``: -> duplicate-effect on the given-back operation
- ``check-then-skip-<action>``: -> clean
- ``naive-nack``: NACK before the DB commit -> dead-lettered (nothing applied, nothing redelivered)

Run it: ``txchaos run onepc_redelivery[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys

import pytest

from harness import Crash, ScenarioSpec
from harness.run.spec.kit import by_variant, onepc_on, op_name, seeded_op, spec_maker

NAME = "onepc_redelivery"
pytestmark = [pytest.mark.integration, pytest.mark.activemq]
MESSAGES = 10
ACTIONS = ("abort_unsubscribe", "disconnect")


def given_back_index(seed: int) -> int:
    """Return which operation is given back to the broker, for ``seed``."""
    return seeded_op(seed, MESSAGES)


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    n = given_back_index(seed)
    spec = spec_maker(NAME, seed, "harness.patterns.onepc", **onepc_on(), messages=MESSAGES, settle_s=0.3, timeout_s=30)
    given_back = [
        spec(
            f"{variant}-{action.replace('_', '-')}",
            handler,
            expect,
            crashes=(Crash("after_db_commit", op_index=n, action=action),),
        )
        for action in ACTIONS
        for variant, handler, expect in (
            ("naive", "naive", {"duplicate-effect"}),
            ("check-then-skip", "check_then_skip", set()),
        )
    ]
    nack = Crash("before_db_commit", op_index=n, action="nack")
    return by_variant(*given_back, spec("naive-nack", "naive", {"dead-lettered"}, crashes=(nack,)))


@pytest.mark.parametrize("variant", list(variants()))
def test_redelivery_actions(txchaos_run, variant: str) -> None:  # type: ignore[no-untyped-def]
    spec = variants(3)[variant]
    verdict = txchaos_run(spec).verdict
    given_back = op_name(variant, 3, given_back_index(3))
    assert verdict.found() == dict.fromkeys(spec.expect, 1), verdict.headline()
    for anomaly in spec.expect:
        assert verdict.ops(anomaly) == {given_back}
    assert verdict.stats["crashes"] == 0  # given back, not killed: the worker never restarted
    assert verdict.stats["submitted"] == MESSAGES


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
