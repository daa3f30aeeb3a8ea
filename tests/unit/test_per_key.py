"""The per-key rules (resurrected, out-of-order) on synthetic CQRS ledgers, in both engines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.ledger.reader import compact
from harness.ledger.schema import COLUMNS, Kind
from harness.verify import checker
from harness.verify.assemble import compare_verdicts
from harness.verify.model import ANOMALY_CLASSES, UNRULED_CLASSES, FlowContract

T0 = 1_700_000_000_000_000_000
CONTRACT = FlowContract(expects_downstream=False, per_key=True)

# key -> the versions submitted (True: a tombstone)
SOURCE = {
    "A": [(1, False), (2, False), (3, True)],
    "B": [(1, False), (2, True)],
    "C": [(1, False), (2, False), (3, False)],
    "D": [(1, False), (2, True)],
}
# The naive replica's journal: A's delete and the updates before it redelivered (re-created after
# the delete, then deleted again), B's tombstone applied then B's create again (alive at the
# end), C's v2 applied after v3 (no delete: out of order only), D clean.
NAIVE_JOURNAL = [("A", 1), ("A", 2), ("A", 3), ("A", 1), ("A", 2), ("A", 3), ("B", 1), ("B", 2), ("B", 1)]
NAIVE_JOURNAL += [("C", 1), ("C", 3), ("C", 2), ("D", 1), ("D", 2)]
NAIVE_ROWS = [("B", 1, False), ("C", 2, False)]  # (key, version, deleted) at quiescence
# The versioned replica: every event applied once, in order; tombstones kept as marker rows.
CLEAN_JOURNAL = [(k, v) for k, events in SOURCE.items() for v, _ in events]
CLEAN_ROWS = [("A", 3, True), ("B", 2, True), ("C", 3, False), ("D", 2, True)]


def op(key: str, version: int) -> str:
    return f"{key}-v{version}"


def write_ledger(run: Path, journal: list[tuple[str, int]], rows: list[tuple[str, int, bool]]) -> None:
    """Write a CQRS run's ledger: submits, one delivery each, the journal and the replica rows."""
    events: list[tuple[str, Kind, str, dict[str, Any]]] = []
    for key, versions in SOURCE.items():
        for v, tomb in versions:
            events.append(("driver", Kind.SUBMIT, op(key, v), {"key": key, "version": v, "tombstone": tomb}))
            events.append(("worker-0", Kind.DELIVER, op(key, v), {}))
    tombstones = {(k, v) for k, versions in SOURCE.items() for v, t in versions if t}
    for n, (key, v) in enumerate(journal):
        detail = {"key": key, "version": v, "tombstone": (key, v) in tombstones, "n": n}
        events.append(("residue", Kind.RESIDUE_APPLY, op(key, v), detail))
    for key, v in dict.fromkeys(journal):
        events.append(("residue", Kind.RESIDUE_EFFECT, op(key, v), {}))
    for key, v, deleted in rows:
        events.append(("residue", Kind.RESIDUE_ENTITY, op(key, v), {"key": key, "version": v, "deleted": deleted}))
    seg = run / "ledger" / "segments"
    seg.mkdir(parents=True)
    by_src: dict[str, list[dict[str, Any]]] = {}
    for i, (src, kind, op_id, detail) in enumerate(events):
        out = by_src.setdefault(src, [])
        row = dict.fromkeys(COLUMNS) | {
            "ts_ns": T0 + i * 1_000_000,
            "src": src,
            "pid": 100 + len(src),
            "seq": len(out),
            "kind": str(kind),
            "op": op_id,
            "detail": json.dumps(detail),
        }
        if kind == Kind.DELIVER:
            row["attempt"] = 1
        out.append(row)
    for src, out in by_src.items():
        (seg / f"{src}-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    compact(run / "ledger")


@pytest.fixture
def naive_run(tmp_path: Path) -> Path:
    write_ledger(tmp_path / "naive", NAIVE_JOURNAL, NAIVE_ROWS)
    return tmp_path / "naive"


@pytest.fixture
def clean_run(tmp_path: Path) -> Path:
    write_ledger(tmp_path / "clean", CLEAN_JOURNAL, CLEAN_ROWS)
    return tmp_path / "clean"


def test_every_anomaly_class_has_a_rule() -> None:
    assert not UNRULED_CLASSES
    assert {"resurrected", "out-of-order"} <= set(ANOMALY_CLASSES)


def test_per_key_rules_name_exactly_the_resurrecting_and_regressing_events(naive_run: Path) -> None:
    v = checker.check_run(naive_run, CONTRACT)
    # A's create and update re-applied after its delete; B's create alive although B was deleted.
    assert v.ops("resurrected") == {"A-v1", "A-v2", "B-v1"}
    # A's create and update after v3, B's create after the tombstone v2, C's v2 after v3.
    assert v.ops("out-of-order") == {"A-v1", "A-v2", "B-v1", "C-v2"}
    assert v.anomalies["resurrected"] == 3
    assert v.anomalies["out-of-order"] == 4
    assert {c for c, n in v.anomalies.items() if n} == {"resurrected", "out-of-order"}


def test_per_key_rules_are_silent_on_a_versioned_replica(clean_run: Path) -> None:
    v = checker.check_run(clean_run, CONTRACT)
    assert v.clean, v.found()


def test_runs_without_per_key_contract_are_not_judged_by_key(naive_run: Path) -> None:
    # Other patterns' contracts leave per_key off: the same ledger gets no per-key verdict.
    v = checker.check_run(naive_run, FlowContract(expects_downstream=False))
    assert v.anomalies["resurrected"] == 0
    assert v.anomalies["out-of-order"] == 0


@pytest.mark.spark
def test_spark_agrees_on_the_per_key_rules(naive_run: Path, clean_run: Path, spark_engine: Any) -> None:
    spark, session = spark_engine
    for run in (naive_run, clean_run):
        for contract in (CONTRACT, FlowContract(expects_downstream=False)):
            local = checker.check_run(run, contract)
            remote = spark.check_run(run, contract, spark=session)
            assert compare_verdicts(local, remote) == [], (run.name, contract)
    assert spark.check_run(naive_run, CONTRACT, spark=session).ops("resurrected") == {"A-v1", "A-v2", "B-v1"}
