"""Every requested fault is accounted for: fired or not, when, on which operation and worker.

A ledger with arms that fire and arms that never do, and fault windows over busy and idle
stretches of the flow; both engines must account for each the same way (``verify/fired.py``),
and a verdict with an unfired fault is neither clean nor anomalous.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.errors import EXIT_UNFIRED
from harness.ledger.schema import Kind
from harness.verify import checker
from harness.verify.assemble import compare_verdicts
from harness.verify.model import FlowContract
from harness.verify.verdict import OUTCOMES, Verdict
from tests.unit.test_engines_agree import MS, T0, Op, S, _events, _write_rows

Row = tuple[int, str, Kind, dict[str, Any]]


def _arm(ts: int, arm: str, point: str, via: str, **detail: Any) -> Row:
    d = {"arm": arm, "via": via, "action": "kill", "target_op": None, "nth": None, "worker": None} | detail
    return (ts, "driver", Kind.ARM, {"point": point, "detail": json.dumps(d)})


def _ledger(run: Path) -> None:
    rows: list[Row] = [e for i in range(5) for e in _events(i, Op("normal", False))]
    before = T0 - S
    rows += [
        _arm(before, "arm-0", "after_db_commit", "crash", target_op="op-0001"),
        _arm(before + 1, "arm-1", "stomp_before_commit", "trap", target_op="op-0003"),
        _arm(before + 2, "arm-2", "pg_after_commit", "trap", target_op="op-0002"),
        _arm(before + 3, "arm-3", "before_ack", "crash", nth=5, worker="relay"),
        # arm-0 fired in a worker (the event names the arm); arm-2's trap fired on its op (no arm id)
        (
            T0 + S + 105 * MS,
            "worker-0",
            Kind.CRASH,
            {"op": "op-0001", "point": "after_db_commit", "detail": json.dumps({"arm": "arm-0", "worker": "worker-0"})},
        ),
        (
            T0 + 2 * S + 104 * MS,
            "driver",
            Kind.CRASH,
            {"op": "op-0002", "point": "pg_after_commit", "detail": json.dumps({"worker": "svc-0", "action": "kill"})},
        ),
        # a window over op 2's work, and one long after the last operation finished
        (T0 + 2 * S, "driver", Kind.FAULT_START, {"point": "latency:postgres"}),
        (T0 + 2 * S + 500 * MS, "driver", Kind.FAULT_END, {"point": "latency:postgres"}),
        (T0 + 50 * S, "driver", Kind.FAULT_START, {"point": "reset_peer:dtm"}),
        (T0 + 51 * S, "driver", Kind.FAULT_END, {"point": "reset_peer:dtm"}),
    ]
    _write_rows(run, rows)


def _by_name(v: Verdict) -> dict[str, dict[str, Any]]:
    return {str(e["name"]): e for e in v.faults}


def test_each_requested_fault_is_accounted_for_with_when_and_where(tmp_path: Path) -> None:
    _ledger(tmp_path)
    v = checker.check_run(tmp_path, FlowContract())
    got = _by_name(v)
    assert set(got) == {
        "after_db_commit",
        "stomp_before_commit",
        "pg_after_commit",
        "before_ack",
        "latency:postgres",
        "reset_peer:dtm",
    }
    crash = got["after_db_commit"]
    assert (crash["fired"], crash["fired_op"], crash["fired_worker"]) == (True, "op-0001", "worker-0")
    assert crash["fired_ns"] == T0 + S + 105 * MS
    assert (got["pg_after_commit"]["fired"], got["pg_after_commit"]["fired_op"]) == (True, "op-0002")
    assert got["latency:postgres"]["fired"] is True
    assert got["latency:postgres"]["ops_in_window"] == 1
    assert v.unfired == (
        "trap stomp_before_commit on op op-0003 never fired: the service sent no STOMP COMMIT",
        "crash before_ack on hit #5 in relay never fired: before_ack was reached fewer than 5 times",
        "fault reset_peer:dtm never fired: no operation was in flight while it was open",
    )
    assert (v.stats["faults_fired"], v.stats["faults_requested"]) == (3, 6)
    judged = replace(v, incomplete=())  # the folder has no manifest; the accounting does not depend on it
    assert judged.outcome == "unfired"
    assert not judged.clean
    assert judged.anomaly_free
    assert judged.exit_code == EXIT_UNFIRED == 6
    assert judged.headline().startswith("UNFIRED: trap stomp_before_commit on op op-0003 never fired")
    assert Verdict.from_dict(json.loads(json.dumps(judged.to_dict()))) == judged


@pytest.mark.spark
def test_both_engines_account_for_faults_alike(spark_engine: Any, tmp_path: Path) -> None:
    _ledger(tmp_path)
    spark, session = spark_engine
    local = checker.check_run(tmp_path, FlowContract())
    remote = spark.check_run(tmp_path, FlowContract(), spark=session)
    assert compare_verdicts(local, remote) == []
    assert local.faults == remote.faults
    assert len(remote.unfired) == 3


def test_a_run_without_requests_or_with_anomalies_is_judged_as_before() -> None:
    base = Verdict({"lost": 0}, (), {}, "in-process")
    assert base.outcome == "clean"
    assert base.headline() == "CLEAN: no anomaly"
    assert base.exit_code == 0
    unfired = ({"type": "crash", "name": "p", "fired": False, "why": "crash p on op x never fired: ..."},)
    found = replace(base, anomalies={"lost": 1}, faults=unfired)
    assert found.outcome == "anomalies"
    assert found.exit_code == 1
    assert "also unfired: crash p" in found.headline()
    unmeasured = replace(base, faults=({"type": "fault", "name": "f", "fired": None},))
    assert unmeasured.clean, "a window an older verdict did not measure is never called unfired"
    assert set(OUTCOMES) == {"clean", "anomalies", "incomplete", "unfired"}


def test_txchaos_verify_exits_6_on_an_unfired_fault(tmp_path: Path) -> None:
    from harness.verify.cli import exit_code

    _ledger(tmp_path)
    verdict = replace(checker.check_run(tmp_path, FlowContract()), incomplete=())
    assert exit_code(verdict) == EXIT_UNFIRED
    assert exit_code(replace(verdict, faults=())) == 0


def test_every_trap_point_says_what_the_service_did_not_do() -> None:
    # an unfired trap's headline names what was missing; a new protocol's points must say it too
    from harness.traps.base import POINTS, UNREACHED

    assert set(UNREACHED) == set(POINTS)
    # The table of protocols makes every point carry a wording; it must also say what was missing.
    assert all(" no " in UNREACHED[p] for p in POINTS), UNREACHED


def test_what_compaction_records_gives_the_verdict_a_scan_gives(tmp_path: Path) -> None:
    # the engines take the fault requests and the writer counts from _layout.json instead of a pass
    # over the ledger: a ledger compacted before they were recorded must get the very same verdict
    from harness.ledger.layout import LAYOUT_NAME, read_layout
    from harness.ledger.reader import PARQUET_NAME, compact

    _ledger(tmp_path)
    parts = compact(tmp_path / "ledger")
    layout = read_layout(parts) or {}
    assert [r["kind"] for r in layout["requests"]].count(str(Kind.ARM)) == 4
    recorded = checker.check_run(tmp_path, FlowContract())
    (parts / LAYOUT_NAME).write_text(json.dumps({k: v for k, v in layout.items() if k not in ("requests", "writers")}))
    scanned = checker.check_run(tmp_path, FlowContract())
    assert compare_verdicts(recorded, scanned) == []
    assert recorded.faults == scanned.faults
    assert recorded.stats == scanned.stats
    fired = sorted(str(e["name"]) for e in recorded.faults if e["fired"])
    assert fired == ["after_db_commit", "latency:postgres", "pg_after_commit"]  # arm-0, arm-2, the busy window
    # and the recorded rows are what the engine reads: a window only _layout.json holds shows up
    extra = [
        {"ts_ns": T0 + 60 * S, "src": "driver", "seq": 900, "kind": str(k), "op": None, "point": "pause:kafka"}
        | {"detail": None}
        for k in (Kind.FAULT_START, Kind.FAULT_END)
    ]
    (parts / LAYOUT_NAME).write_text(json.dumps(layout | {"requests": layout["requests"] + extra}))
    assert "pause:kafka" in _by_name(checker.check_run(tmp_path, FlowContract()))
    assert (tmp_path / "ledger" / PARQUET_NAME).is_dir()


def test_segments_past_the_threshold_are_compacted_then_judged_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a folder whose closing compaction never ran (the driver was killed) is read whole only when
    # small; past COMPACT_ABOVE_BYTES the in-process engine compacts it first: the same verdict
    from harness.ledger.reader import PARQUET_NAME

    _ledger(tmp_path)
    shutil.rmtree(tmp_path / "ledger" / PARQUET_NAME)  # only the segments, as a killed driver leaves them
    in_memory = checker.check_run(tmp_path, FlowContract())
    assert not (tmp_path / "ledger" / PARQUET_NAME).exists()  # small: read whole, nothing written
    monkeypatch.setattr(checker, "COMPACT_ABOVE_BYTES", 0)
    compacted = checker.check_run(tmp_path, FlowContract())
    assert (tmp_path / "ledger" / PARQUET_NAME / "_layout.json").is_file()
    assert compare_verdicts(in_memory, compacted) == []
    assert in_memory.faults == compacted.faults
    assert in_memory.stats == compacted.stats


def test_a_service_operation_is_in_flight_from_its_submission_to_its_output(tmp_path: Path) -> None:
    # A service writes no event of its own: the ledger holds the driver's submission, the sink's
    # output and the close's snapshot. A broker kill between the two, with no submission inside
    # it, held every such operation; it was judged unfired while the outputs were not in the span.
    out = {"dest": "svc.out"}
    rows: list[Row] = []
    for n in range(3):
        op = {"op": f"op-{n:04d}"}
        rows += [
            (T0 + n * MS, "driver", Kind.SUBMIT, {**op, "dest": "svc.in"}),
            (T0 + 10 * S + n * MS, "sink", Kind.DOWNSTREAM, {**op, **out}),
            (T0 + 60 * S, "driver", Kind.RESIDUE_EFFECT, {**op, "dest": "svc_effects"}),
        ]
    rows += [
        (T0 + 2 * S, "driver", Kind.FAULT_START, {"point": "kill9:activemq"}),
        (T0 + 8 * S, "driver", Kind.FAULT_END, {"point": "kill9:activemq"}),
        # after every output, before the close's snapshot: nothing was in flight
        (T0 + 20 * S, "driver", Kind.FAULT_START, {"point": "latency:postgres"}),
        (T0 + 21 * S, "driver", Kind.FAULT_END, {"point": "latency:postgres"}),
    ]
    _write_rows(tmp_path, rows)
    got = _by_name(checker.check_run(tmp_path, FlowContract()))
    assert (got["kill9:activemq"]["fired"], got["kill9:activemq"]["ops_in_window"]) == (True, 3)
    assert got["latency:postgres"]["fired"] is False
