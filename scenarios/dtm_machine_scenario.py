"""The DTM transfer's Hypothesis state machine against the real stack: bad variants caught, the fixed one holds.

Rules: submit transfers, kill the service or the branch at any of their points, hold a local
transaction past the check-back, toxics (latency, reset_peer, partition) on the ``dtm`` and
``postgres`` proxies, kill -9 of the DTM server. Invariants after quiescence: every committed
debit has exactly one credit (a clean verdict) and the money balances.

- ``naive-checkback``: the SELECT-only check-back -> caught as ``lost``, on a held transfer
- ``branch-no-barrier``: the credit branch without its barrier -> caught as ``duplicate-effect``
  whenever DTM calls a branch again after its credit committed: the branch killed after its
  commit, a reset on the Postgres proxy losing the answer to its COMMIT (it answers an error),
  or DTM killed before it recorded the branch's answer
- ``fixed``: barrier check-back and branch barrier -> the profile's examples hold

The bad searches stop at the first counterexample (no shrink phase), capped; the fixed one runs
``TXCHAOS_PROFILE``'s examples (dev 8, ci 15).

Run it: ``pytest scenarios/dtm_machine_scenario.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from harness import Endpoints, Kind, ScenarioSpec, read_ledger
from harness.machines.dtm import dtm_machine
from harness.machines.search import check_failure_text, find_counterexample, holds, hunt_settings
from harness.run.spec.files import resolve

pytestmark = [pytest.mark.integration, pytest.mark.dtm]
SEARCH_CAP = 40


def machine_spec(variant: str, *, checkback: str = "barrier", branch_barrier: bool = True) -> ScenarioSpec:
    """Return the transfer spec the machine drives: no scripted crash, hold or fault."""
    (base,) = resolve("dtm_transfer:after-commit", 0, Path(__file__).parent)
    (branch,) = base.helpers
    return replace(
        base,
        variant=variant,
        crashes=(),
        # Check-backs a second after prepare (DTM's smallest): the machine waits for many of them.
        options={"checkback": checkback, "interval_s": 1},
        helpers=(replace(branch, options={"barrier": branch_barrier}),),
    )


# variant -> (spec, the anomaly it must be caught with, machine attributes). The branch search
# arms only the branch's kill after its commit: the service's points cannot make a double credit,
# nor can a kill before the branch's commit (DTM's retry then credits once). With both branch
# points a clean-clone run once found no counterexample in SEARCH_CAP examples.
BAD: dict[str, tuple[ScenarioSpec, str, dict[str, object]]] = {
    "naive-checkback": (machine_spec("naive-checkback", checkback="naive"), "lost", {}),
    "branch-no-barrier": (
        machine_spec("branch-no-barrier", branch_barrier=False),
        "duplicate-effect",
        {"crash_points": ("branch_after_commit",)},
    ),
}


@pytest.mark.parametrize("variant", list(BAD))
def test_bad_variant_is_caught(txchaos_stack: Endpoints, variant: str) -> None:
    spec, anomaly, attrs = BAD[variant]
    machine = dtm_machine(spec, txchaos_stack, **attrs)
    # The counterexample is first_failure even when Hypothesis's replay of it met other timing.
    # An error that is not a failed check (a broken stack) is raised as it is, not swallowed.
    found = find_counterexample(machine, hunt_settings(SEARCH_CAP))
    assert machine.first_failure is not None, found or f"no counterexample in {SEARCH_CAP} examples"
    message, result, held, steps = machine.first_failure
    verdict = result.verdict
    assert set(verdict.found()) == {anomaly}, verdict.headline()
    flagged = verdict.ops(anomaly)
    assert flagged
    if variant == "naive-checkback":  # only a transaction still open at the check-back is lost
        assert flagged <= set(held), (flagged, held)
        assert "slow_commit()" in steps
    else:  # a credit whose success DTM never recorded is called, and applied, again
        events = read_ledger(result.run_dir / "ledger").to_pylist()
        branch = [e for e in events if e["src"] == "branch"]
        calls = Counter(e["op"] for e in branch if e["kind"] == Kind.DELIVER)
        credits = Counter(e["op"] for e in branch if e["kind"] == Kind.EFFECT)
        assert all(calls[op] >= 2 and credits[op] >= 2 for op in flagged), (calls, credits)
    # The failure names every flagged operation and carries what replays it.
    check_failure_text(message, anomaly, flagged, steps, result.run_dir)


def test_fixed_variant_holds(txchaos_stack: Endpoints) -> None:
    machine = dtm_machine(machine_spec("fixed"), txchaos_stack)
    holds(machine)
