"""The DTM transfer's pure parts: gids, its scenario specs, and how its ledger events map to verdicts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.errors import ConfigError
from harness.ledger.schema import ARROW_SCHEMA, Kind, empty_row
from harness.patterns.dtm_transfer import POINTS, gid_of, op_of
from harness.run.spec.files import resolve
from harness.run.spec.scenario import Crash, ScenarioSpec, Stage
from harness.verify.checker import check_table
from harness.verify.model import FlowContract
from harness.worker.crash import STAGE_POINTS

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
CONTRACT = FlowContract(expects_downstream=False, max_deliveries=None)  # the scenario's


def _variants(seed: int) -> dict[str, ScenarioSpec]:
    return {s.variant: s for s in resolve("dtm_transfer", seed=seed, directory=SCENARIOS)}


def _chosen(seed: int) -> int:
    (crash,) = _variants(seed)["after-commit"].crashes
    assert crash.op_index is not None
    return crash.op_index


def test_gid_round_trips_to_the_op() -> None:
    op = "naive-checkback-s3-op00004"
    assert op_of(gid_of(op, "ab12cd34")) == op
    assert gid_of(op, "a") != gid_of(op, "b")  # two runs on one DTM store never share a gid


def test_every_variant_validates_and_aims_at_the_seeds_operation() -> None:
    for seed in range(4):
        specs = _variants(seed)
        assert {s.flow.name for s in specs.values()} == {"dtm"}
        assert {s.contract for s in specs.values()} == {CONTRACT}
        for spec in specs.values():
            assert all(c.op_index == _chosen(seed) for c in spec.crashes)
            assert spec.options.get("slow_commits", [_chosen(seed)]) == [_chosen(seed)]
    assert _variants(0)["naive-checkback"].expect == {"lost"}
    assert _variants(0)["branch-crash-naive"].expect == {"duplicate-effect"}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"crashes": (Crash("after_db_commit", op_index=0),)}, "unknown crash point 'after_db_commit'"),
        ({"crashes": (Crash("after_local_commit", op_index=0, action="nack"),)}, "unknown crash action 'nack'"),
        ({"chain": (Stage("next", "m:f"),)}, "a DTM scenario with chain"),
        ({"workers": 2}, "a DTM scenario with chain"),
    ],
)
def test_dtm_spec_refuses_what_its_run_cannot_do(change: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        replace(_variants(0)["after-commit"], **change)
    assert named in str(info.value)
    assert "Hint:" in str(info.value)
    assert not set(STAGE_POINTS) & set(POINTS)


def _ledger(events: list[tuple[str, Kind]]) -> pa.Table:
    rows = []
    for seq, (op, kind) in enumerate(events):
        row = empty_row() | {"ts_ns": 1_000 + seq, "src": "t", "pid": 1, "seq": seq, "kind": str(kind), "op": op}
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)


# The events a run leaves per operation (service, check-back, branch, then the books).
DELIVERED = [Kind.DELIVER, Kind.PREPARE, Kind.EFFECT, Kind.DB_COMMIT, Kind.SUBMIT, Kind.RESIDUE_EFFECT]
ROLLED_BACK = [Kind.DELIVER, Kind.PREPARE, Kind.EFFECT, Kind.ABORT_PREPARED]
NAIVE = [Kind.DELIVER, Kind.PREPARE, Kind.EFFECT, Kind.ABORT_PREPARED, Kind.DB_COMMIT, Kind.SUBMIT]


@pytest.mark.parametrize(
    ("events", "found"),
    [
        (DELIVERED, {}),
        (ROLLED_BACK, {}),  # refused before its commit: it owes nothing
        ([Kind.DELIVER, Kind.ERROR], {}),  # DTM refused the prepare
        (NAIVE, {"lost": 1}),  # a debit whose message DTM dropped
        ([*DELIVERED, Kind.RESIDUE_EFFECT], {"duplicate-effect": 1}),  # credited twice
        ([*ROLLED_BACK, Kind.RESIDUE_EFFECT], {"orphan-effect": 1}),  # a credit without a debit
        ([Kind.DELIVER, Kind.PREPARE, Kind.SUBMIT, Kind.RESIDUE_QUEUE], {"stuck": 1}),  # DTM never decided
        ([Kind.DELIVER, Kind.PREPARE], {"in-doubt": 1}),  # prepared, no debit, nobody aborted
    ],
)
def test_dtm_contract_names_each_anomaly(events: list[Kind], found: dict[str, int]) -> None:
    verdict = check_table(_ledger([("op-1", k) for k in events]), CONTRACT)
    assert verdict.found() == found
    for cls in found:
        assert verdict.ops(cls) == {"op-1"}


def test_the_dtm_contract_is_not_the_queue_default() -> None:
    # With the queue default a delivered transfer reads as lost: no outgoing message comes out.
    assert check_table(_ledger([("op-1", k) for k in DELIVERED]), FlowContract()).found() == {"lost": 1}
