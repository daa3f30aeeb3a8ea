"""Declared effects, invariants and exactly-once output, judged by the in-process engine (issue 15).

Each ledger below is what a run's books would hold; the end-state residue of the declared checks
(``residue_declared``, ``residue_invariant``) is written as ``verify/declared.py`` writes it. The
queries themselves run against real Postgres in tests/integration/test_declared.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.verify.checker import check_run
from harness.verify.cli import contract_of
from harness.verify.model import INVARIANT_OP_PREFIX, FlowContract, Invariant, judged_rules, rules
from harness.verify.verdict import explain

EFFECT_SQL = "SELECT op_id, count(*) AS applied FROM balance_moves GROUP BY op_id"
TOTAL = Invariant(
    "conserved-total", "SELECT sum(balance) AS actual, 1000 AS expected FROM accounts", label="sum(accounts.balance)"
)
DECLARED = FlowContract(effect_sql=EFFECT_SQL, invariants=(TOTAL,))


def _flow(d: LedgerWriter, w: LedgerWriter, op: str, *, applies: int = 1, outputs: int = 1) -> None:
    """Write one operation delivered ``applies`` times (a crash after each DB commit but the last)."""
    d.emit(Kind.SUBMIT, op=op)
    for a in range(1, applies + 1):
        w.emit(Kind.DELIVER, op=op, msg=f"ID:{op}", attempt=a)
        w.emit(Kind.EFFECT, op=op, attempt=a)
        w.emit(Kind.DB_COMMIT, op=op, attempt=a)
        w.emit(Kind.CRASH if a < applies else Kind.BROKER_COMMIT, op=op, attempt=a)
    for _ in range(outputs):
        d.emit(Kind.DOWNSTREAM, op=op)


def _run(tmp: Path, write: dict[str, int], residue: list[tuple[Kind, str | None, dict[str, object]]]) -> Path:
    """Write a closed run: ``write`` op -> times applied, then the residue events."""
    ledger = tmp / "ledger"
    with (
        LedgerWriter(ledger, "driver") as d,
        LedgerWriter(ledger, "worker-0") as w,
        LedgerWriter(ledger, "residue") as r,
    ):
        for op, n in write.items():
            _flow(d, w, op, applies=n)
            # the upsert keeps one row per op whatever it applied: the effect table cannot tell
            r.emit(Kind.RESIDUE_EFFECT, op=op, dest="deposits")
        for kind, op, detail in residue:
            r.emit(kind, op=op, **detail)
    (tmp / "manifest.json").write_text(json.dumps({"complete": True, "contract": {}}))
    return tmp


def _declared(applied: dict[str, int]) -> list[tuple[Kind, str | None, dict[str, object]]]:
    return [(Kind.RESIDUE_DECLARED, op, {"applied": n}) for op, n in applied.items()]


def test_a_double_apply_that_adds_no_row_is_caught_only_by_the_declared_effect(tmp_path: Path) -> None:
    run = _run(tmp_path, {"op-1": 1, "op-2": 2}, _declared({"op-1": 1, "op-2": 2}))
    assert check_run(run, FlowContract()).clean  # one row each: the row count sees nothing
    v = check_run(run, FlowContract(effect_sql=EFFECT_SQL))
    assert v.found() == {"duplicate-effect": 1}
    (w,) = v.witnesses
    assert (w.op, w.summary["applied"], w.summary["effects"]) == ("op-2", 2, 1)


def test_an_op_with_its_row_but_no_declared_effect_is_lost(tmp_path: Path) -> None:
    # op-2 booked its marker row, but its balance move never happened: applied 0 times
    run = _run(tmp_path, {"op-1": 1, "op-2": 1}, _declared({"op-1": 1}))
    assert check_run(run, FlowContract()).clean
    assert check_run(run, FlowContract(effect_sql=EFFECT_SQL)).ops("lost") == {"op-2"}


def _broken_total_run(tmp_path: Path) -> Path:
    """Write a run whose op-2 was applied twice and whose conserved total broke."""
    broken = {
        "invariant": TOTAL.name,
        "label": TOTAL.shown,
        "scope": "global",
        "actual": 1040,
        "expected": 1000,
        "holds": False,
        "applied_twice": ["op-2"],
        "applied_twice_n": 1,
        "not_applied": [],
        "not_applied_n": 0,
    }
    residue = [*_declared({"op-1": 1, "op-2": 2}), (Kind.RESIDUE_INVARIANT, INVARIANT_OP_PREFIX + TOTAL.name, broken)]
    return _run(tmp_path, {"op-1": 1, "op-2": 2}, residue)


def test_a_broken_global_invariant_is_named_in_words(tmp_path: Path) -> None:
    v = check_run(_broken_total_run(tmp_path), DECLARED)
    assert v.found() == {"duplicate-effect": 1, "invariant-broken": 1}
    (w,) = [w for w in v.witnesses if w.anomaly == "invariant-broken"]
    said = "sum(accounts.balance) = 1,040, expected 1,000: op op-2 applied more than once"
    assert explain(w) == said
    assert said in v.headline()


def test_a_holding_invariant_is_recorded_not_judged(tmp_path: Path) -> None:
    holds = {"invariant": TOTAL.name, "label": TOTAL.shown, "scope": "global", "actual": 1000, "expected": 1000}
    run = _run(
        tmp_path, {"op-1": 1}, [*_declared({"op-1": 1}), (Kind.RESIDUE_INVARIANT, None, holds | {"holds": True})]
    )
    v = check_run(run, DECLARED)
    assert v.clean
    assert v.stats["kinds"]["residue_invariant"] == 1


def test_a_per_operation_invariant_names_the_operation(tmp_path: Path) -> None:
    net = Invariant("net-zero", "SELECT op_id, sum(amount) AS actual, 0 AS expected FROM moves GROUP BY 1", scope="op")
    detail = {"invariant": "net-zero", "label": "net-zero", "scope": "op", "actual": 25, "expected": 0, "holds": False}
    run = _run(tmp_path, {"op-1": 1, "op-2": 1}, [(Kind.RESIDUE_INVARIANT, "op-2", detail)])
    v = check_run(run, FlowContract(invariants=(net,)))
    assert v.ops("invariant-broken") == {"op-2"}
    assert explain(v.witnesses[0]) == "net-zero = 25, expected 0 for op op-2"


def test_a_second_output_is_an_anomaly_only_where_one_is_promised(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as d, LedgerWriter(ledger, "worker-0") as w:
        _flow(d, w, "op-1", outputs=2)
        _flow(d, w, "op-2")
        w.emit(Kind.RESIDUE_EFFECT, op="op-1")
        w.emit(Kind.RESIDUE_EFFECT, op="op-2")
    (tmp_path / "manifest.json").write_text(json.dumps({"complete": True, "contract": {}}))
    plain = check_run(tmp_path, FlowContract())
    assert plain.clean
    assert plain.stats["duplicate_downstream_deliveries"] == 1  # a statistic only
    v = check_run(tmp_path, FlowContract(exactly_once_output=True))
    assert v.found() == {"duplicate-output": 1}
    assert explain(v.witnesses[0]) == "op op-1: 2 output messages, the flow promises one"


def test_new_rules_apply_only_to_contracts_that_declare_them() -> None:
    assert not {"duplicate-output", "invariant-broken"} & set(rules(FlowContract()))
    assert {"duplicate-output", "invariant-broken"} <= set(
        rules(FlowContract(exactly_once_output=True, invariants=(TOTAL,)))
    )
    # without the end-state snapshot a broken invariant cannot be seen, so it is not judged
    assert "invariant-broken" not in judged_rules(DECLARED, snapshot=False)


def test_the_contract_round_trips_through_the_manifest(tmp_path: Path) -> None:
    contract = FlowContract(effect_sql=EFFECT_SQL, invariants=(TOTAL,), exactly_once_output=True)
    (tmp_path / "manifest.json").write_text(json.dumps({"spec": {"contract": asdict(contract)}}))
    assert contract_of(tmp_path) == contract


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"invariants": (Invariant("a", "SELECT 1, 1"), Invariant("a", "SELECT 2, 2"))}, "names repeat"),
        ({"effect_sql": "  "}, "effect_sql is empty"),
        ({"invariants": ({"name": "x", "sql": "SELECT 1, 1", "scope": "row"},)}, "scope 'row'"),
        ({"invariants": ({"name": "x y", "sql": "SELECT 1, 1"},)}, "is not a name"),
        ({"invariants": ({"name": "x", "sql": ""},)}, "has no SQL"),
    ],
)
def test_a_bad_declaration_is_refused_with_a_hint(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as info:
        FlowContract(**kwargs)  # type: ignore[arg-type]
    assert info.value.hint


def test_the_report_and_the_timeline_name_the_broken_invariant(tmp_path: Path) -> None:
    from harness.reporting.allure import _summary
    from harness.reporting.plots import render_run

    v = check_run(_broken_total_run(tmp_path), DECLARED)
    said = "invariant-broken: sum(accounts.balance) = 1,040, expected 1,000: op op-2 applied more than once"
    assert v.broken_promises() == [said]
    assert f"broken promises:\n  {said}" in _summary(v)
    v.write(tmp_path / "verdict.json")
    assert render_run(tmp_path) == tmp_path / "timeline.png"  # drawn with the broken invariant under its title
