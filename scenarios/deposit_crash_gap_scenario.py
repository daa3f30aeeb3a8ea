"""Deposits whose double-apply adds no row, killed between the DB commit and the broker commit (issue 15).

The stage credits a deposit (``harness.patterns.bank``): it books the deposit in ``deposits`` (one
row per operation) and moves the ``main`` account's balance in place, then commits the database
and then the broker. The worker is SIGKILLed at ``after_db_commit`` on one operation (chosen from
the seed); the broker redelivers that message to the restarted worker.

- ``upsert-rows-only``: the bad handler judged by rows -> clean (the upsert keeps one row: missed)
- ``upsert``: the same run with the deposits' promises declared on the contract (the declared
  effect ``bank.DEPOSIT_EFFECT_SQL`` and the balance invariant ``bank.BALANCE_SQL``)
  -> duplicate-effect and invariant-broken on the crashed operation
- ``once``: the fixed handler credits only when its insert booked the deposit -> clean

Needs the run layer to call ``declared.check`` after the schema and ``declared.snapshot`` at the
end-state snapshot (``harness/verify/declared.py``); without them a declared contract has no
residue to judge and every operation reads as lost.

Run it: ``txchaos run deposit_crash_gap[:VARIANT] --seed N`` or ``pytest scenarios/``.
"""

from __future__ import annotations

import sys

import pytest

from harness import Crash, FlowContract, ScenarioSpec
from harness.patterns import bank
from harness.run.spec.kit import by_variant, op_name, seeded_op, spec_maker
from harness.verify.model import Invariant

NAME = "deposit_crash_gap"
pytestmark = [pytest.mark.integration, pytest.mark.activemq]
MESSAGES = 20
DECLARED = FlowContract(
    effect_sql=bank.DEPOSIT_EFFECT_SQL,
    invariants=(Invariant("balance", bank.BALANCE_SQL, label=bank.BALANCE_LABEL),),
)


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    spec = spec_maker(
        NAME,
        seed,
        "harness.patterns.bank",
        schema="deposits",
        effect_table="deposits",
        crashes=(Crash("after_db_commit", op_index=seeded_op(seed, MESSAGES)),),
        messages=MESSAGES,
        timeout_s=45,
        contract=DECLARED,
    )
    return by_variant(
        spec("upsert-rows-only", "deposit_upsert", contract=FlowContract()),
        spec("upsert", "deposit_upsert", {"duplicate-effect", "invariant-broken"}),
        spec("once", "deposit_once"),
    )


@pytest.mark.parametrize("variant", list(variants()))
@pytest.mark.parametrize("seed", [0, 7])
def test_a_double_apply_without_a_row(txchaos_run, variant: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    spec = variants(seed)[variant]
    verdict = txchaos_run(spec).verdict
    crashed = op_name(variant, seed, spec.crashes[0].op_index)
    assert verdict.stats["crashes"] == 1, verdict.stats
    assert verdict.found() == dict.fromkeys(spec.expect, 1), verdict.headline()
    if spec.expect:
        # the exact operation, and the balance named in words with that operation behind it
        assert verdict.ops("duplicate-effect") == {crashed}
        (said,) = verdict.broken_promises()
        assert said.startswith("invariant-broken: accounts.balance of main = ")
        assert said.endswith(f": op {crashed} applied more than once")


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
