"""A transfer by DTM 2-phase message: crashes around prepare and submit, a naive check-back, a retried branch.

Six transfers per run. The business service (debit) and the credit branch are worker processes
(``harness.patterns.dtm_transfer``); the DTM server and Postgres are real and reached through
Toxiproxy. The operation a fault hits is chosen from the seed.

- ``after-commit``: the service is killed after its debit commit, before submit -> DTM checks
  back, the barrier answers SUCCESS, the credit is made once: clean
- ``before-commit``: killed with the debit written but not committed -> Postgres rolls it back,
  the check-back claims the barrier and answers FAILURE: no debit, no credit: clean
- ``naive-checkback``: a check-back that only SELECTs, and a local transaction still open when
  DTM asks (held until DTM checks back) -> FAILURE, then the debit commits: a debit without a
  credit: lost
- ``slow-commit``: the same held transaction with the barrier check-back -> its insert waits on
  the row lock, reads ``msg`` and answers SUCCESS: clean
- ``branch-crash``: the branch is killed after its credit commit, before answering DTM -> DTM
  retries and the branch barrier skips the repeat: clean
- ``branch-crash-naive``: the same without the branch barrier -> credited twice: duplicate-effect
- ``dtm-latency`` / ``dtm-reset`` / ``dtm-partition`` / ``postgres-reset`` / ``dtm-restart``:
  network faults on the service's way to DTM (or to Postgres) and a kill -9 of DTM while
  transfers run (each local transaction lasts 0.5 s, so the fault meets them before their
  submit), with the fixed variant: clean, and the money balances

Run it: ``txchaos run dtm_transfer[:VARIANT] --seed N`` or ``pytest scenarios/dtm_transfer_scenario.py``.
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from harness import Crash, Endpoints, FlowContract, Helper, Kind, ScenarioSpec, read_ledger
from harness.clients import db
from harness.faults import KillBroker, Latency, Partition, ResetPeer
from harness.patterns import dtm_transfer
from harness.run.spec.kit import op_name, seeded_op
from harness.run.spec.scenario import FaultWindow

NAME = "dtm_transfer"
pytestmark = [pytest.mark.integration, pytest.mark.dtm]
MESSAGES = 6
# A debit must be followed by one credit; a transfer refused before its commit owes nothing.
CONTRACT = FlowContract(expects_downstream=False, max_deliveries=None)


def chosen(seed: int) -> int:
    """Return the operation number the fault hits, for ``seed``."""
    return seeded_op(seed, MESSAGES)


def _spec(
    variant: str,
    seed: int,
    expect: set[str] = frozenset(),  # type: ignore[assignment]
    *,
    crashes: tuple[Crash, ...] = (),
    checkback: str = "barrier",
    branch_barrier: bool = True,
    slow: bool = False,
    faults: tuple[FaultWindow, ...] = (),
) -> ScenarioSpec:
    branch = Helper("branch", "harness.patterns.dtm_transfer:branch", port=True, options={"barrier": branch_barrier})
    options: dict[str, object] = {"checkback": checkback}
    if slow:
        options |= {"slow_commits": [chosen(seed)], "hold_s": 6.0}
    if faults:  # every local transaction lasts 0.5 s: the fault meets transfers before their submit
        options |= {"local_tx_s": 0.5}
    return ScenarioSpec(
        name=NAME,
        variant=variant,
        handler="harness.patterns.dtm_transfer:service",
        schema="dtm_transfer",
        effect_table="dtm_credits",
        messages=MESSAGES,
        crashes=crashes,
        seed=seed,
        timeout_s=45,
        settle_s=0.3,
        options=options,
        helpers=(branch,),
        points=dtm_transfer.POINTS,
        contract=CONTRACT,
        expect=frozenset(expect),
        faults=faults,
        flow="dtm",
    )


def variants(seed: int = 0) -> dict[str, ScenarioSpec]:
    """Return the scenario's variants at ``seed``."""
    a = chosen(seed)
    branch_crash = (Crash("branch_after_commit", op_index=a, worker="branch"),)
    half = MESSAGES // 2
    specs = [
        _spec("after-commit", seed, crashes=(Crash("after_local_commit", op_index=a),)),
        _spec("before-commit", seed, crashes=(Crash("before_local_commit", op_index=a),)),
        _spec("naive-checkback", seed, {"lost"}, checkback="naive", slow=True),
        _spec("slow-commit", seed, slow=True),
        _spec("branch-crash", seed, crashes=branch_crash),
        _spec("branch-crash-naive", seed, {"duplicate-effect"}, crashes=branch_crash, branch_barrier=False),
        _spec("dtm-latency", seed, faults=(FaultWindow(Latency(300, jitter_ms=50), half, 2.0, "dtm"),)),
        _spec("dtm-reset", seed, faults=(FaultWindow(ResetPeer(), half, 1.0, "dtm"),)),
        _spec("dtm-partition", seed, faults=(FaultWindow(Partition(), half, 2.0, "dtm"),)),
        _spec("postgres-reset", seed, faults=(FaultWindow(ResetPeer(), half, 1.0, "postgres"),)),
        _spec("dtm-restart", seed, faults=(FaultWindow(KillBroker("dtm"), half, 1.0),)),
    ]
    return {s.variant: s for s in specs}


def _books(endpoints: Endpoints) -> tuple[Counter[str], Counter[str], tuple[int, int]]:
    engine = db.engine(endpoints.postgres_url, pool_size=1)
    try:
        debits = Counter(db.column_values(engine, "dtm_debits", "op_id"))
        credits = Counter(db.column_values(engine, "dtm_credits", "op_id"))
        return debits, credits, dtm_transfer.money(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("variant", list(variants()))
def test_dtm_transfer(txchaos_run, txchaos_stack, variant: str) -> None:  # type: ignore[no-untyped-def]
    seed = 0
    spec = variants(seed)[variant]
    result = txchaos_run(spec)
    verdict = result.verdict
    hit = op_name(variant, seed, chosen(seed))
    assert verdict.found() == dict.fromkeys(spec.expect, 1), verdict.headline()
    for anomaly in spec.expect:
        assert verdict.ops(anomaly) == {hit}, verdict.headline()
    assert verdict.stats["crashes"] == len(spec.crashes)
    debits, credits, (debited, credited) = _books(txchaos_stack)
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    by_checkback = {e["op"]: e["kind"] for e in events if '"checkback"' in (e["detail"] or "")}
    ops = [op_name(variant, seed, n) for n in range(MESSAGES)]
    if variant == "naive-checkback":  # the debit of the held transaction has no credit
        assert (debits[hit], credits[hit]) == (1, 0)
        assert by_checkback[hit] == Kind.ABORT_PREPARED
        assert debited - credited == 1 + chosen(seed) % 7
        return
    if variant == "branch-crash-naive":
        assert (debits[hit], credits[hit]) == (1, 2)
        return
    assert debited == credited, f"money not conserved: debited {debited}, credited {credited}"
    for op in ops:  # every committed debit has exactly one credit, and no credit lacks its debit
        assert credits[op] == debits[op] <= 1, f"{op}: {debits[op]} debit(s), {credits[op]} credit(s)"
    if variant in ("after-commit", "slow-commit"):
        assert (debits[hit], credits[hit]) == (1, 1)
        assert by_checkback[hit] == Kind.BROKER_COMMIT  # delivered by the check-back's SUCCESS
    elif variant == "before-commit":
        assert (debits[hit], credits[hit]) == (0, 0)
        assert by_checkback[hit] == Kind.ABORT_PREPARED
    elif variant == "branch-crash":
        skips = [e for e in events if e["kind"] == Kind.SKIP and e["op"] == hit]
        assert (credits[hit], len(skips)) == (1, 1)
    else:  # faults: most transfers still go through, and the fault did meet some in flight
        assert sum(debits.values()) >= MESSAGES // 2
        errors = sum(e["kind"] == Kind.ERROR for e in events)
        retried = sum(e["kind"] == Kind.DELIVER and e["src"] == "branch" for e in events) - sum(credits.values())
        if variant != "dtm-latency":
            assert errors + retried > 0, "the fault met no transfer in flight: it proves nothing"
    assert result.as_expected


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["run", NAME, *sys.argv[1:]]))
