"""A verdict you can trust on damaged and incomplete run folders (issue 12, findings 1-4, 6, 7).

Folders are built with the real ``LedgerWriter`` (no services): an interrupted run (no end-state
snapshot), torn and corrupt segment lines, a missing manifest, a damaged compacted part. Each is
verified through the CLI entry point, and the Spark engine must agree with the in-process one.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.errors import EXIT_INCOMPLETE, ConfigError, IncompleteEvidence
from harness.ledger import synth
from harness.ledger.reader import PARQUET_NAME, compact, read_segments
from harness.ledger.schema import Kind
from harness.ledger.tail import LedgerTail
from harness.ledger.writer import LedgerWriter
from harness.run.core.folder import RunFolder
from harness.verify import checker
from harness.verify.assemble import compare_verdicts
from harness.verify.cli import synth_main, verify_main
from harness.verify.model import FlowContract, judged_rules, rules
from harness.verify.verdict import Verdict

OPS = [f"op-{i:02d}" for i in range(20)]
DUP = "op-07"  # crashed after its DB commit: applied twice


def _manifest(run: Path, *, complete: bool | None, contract: FlowContract | None = None) -> None:
    """Write a manifest as a live run's folder holds it (``RunFolder.start``)."""
    meta: dict[str, Any] = {
        "run_id": run.name,
        "scenario": "trust",
        "variant": "naive",
        "seed": 1,
        "spec": {"contract": asdict(contract or FlowContract())},
        "started": "2026-11-23T16:00:00+0000",
        "steps": [],
    }
    if complete is not None:
        meta["complete"] = complete
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps(meta))


def _run(run: Path, *, snapshot: bool, ops: list[str] = OPS, external_calls: bool = True) -> Path:
    """Write the ledger of a 1PC run where every op reached downstream and ``DUP`` was applied twice.

    Without ``snapshot`` the run was stopped (Ctrl-C) after the flow and before its effect-table
    snapshot: its RUN_END is there (the heal path writes it), the residue is not.
    """
    ledger = run / "ledger"
    with (
        LedgerWriter(ledger, "driver") as driver,
        LedgerWriter(ledger, "worker-0") as worker,
        LedgerWriter(ledger, "sink") as sink,
        LedgerWriter(ledger, "residue") as residue,
    ):
        driver.emit(Kind.RUN_START, scenario="trust")
        for op in ops:
            driver.emit(Kind.SUBMIT, op=op, dest="orders")
            applied = 2 if op == DUP else 1
            for attempt in range(1, applied + 1):
                worker.emit(Kind.DELIVER, op=op, msg=f"ID:{op}", attempt=attempt)
                if external_calls:
                    worker.emit(Kind.EXTERNAL_CALL, op=op, msg=f"ID:{op}", attempt=attempt)
                worker.emit(Kind.EFFECT, op=op, msg=f"ID:{op}", attempt=attempt)
                worker.emit(Kind.DB_COMMIT, op=op, msg=f"ID:{op}", attempt=attempt)
                if attempt < applied:
                    worker.emit(Kind.CRASH, op=op, point="after_db_commit", attempt=attempt)
            worker.emit(Kind.BROKER_COMMIT, op=op, attempt=applied)
            sink.emit(Kind.DOWNSTREAM, op=op, msg=f"ID:out-{op}")
        if snapshot:
            for op in ops:
                for _ in range(2 if op == DUP else 1):
                    residue.emit(Kind.RESIDUE_EFFECT, op=op, dest="orders")
        driver.emit(Kind.RUN_END, took_s=1.0)
    return run


# -- finding 1: an interrupted run is incomplete, not 20 lost operations ----------------------
def test_interrupted_run_verifies_incomplete_with_exit_4_not_lost(tmp_path: Path, capsys: Any) -> None:
    run = _run(tmp_path / "run", snapshot=False)
    _manifest(run, complete=False)
    assert verify_main([str(run), "--engine", "in-process"]) == EXIT_INCOMPLETE == 4
    out = capsys.readouterr().out
    assert out.startswith("INCOMPLETE: the run never closed its books")
    saved = json.loads((run / "verdict.json").read_text())
    assert saved["outcome"] == "incomplete"
    assert saved["clean"] is False
    assert saved["anomalies"]["lost"] == 0
    assert {"lost", "duplicate-effect", "stuck", "dead-lettered"} <= set(saved["unjudged"])
    # an external call per delivery: two for the op applied twice, a presence the ledger proves
    assert saved["anomalies"]["duplicate-external-call"] == 1
    assert "duplicate-external-call" not in saved["unjudged"]


def test_a_manifest_of_a_run_from_before_the_marker_is_not_taken_as_complete(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", snapshot=False)
    _manifest(run, complete=None)  # a live run's manifest that never said "complete"
    verdict = checker.check_run(run, FlowContract())
    assert verdict.outcome == "incomplete"
    assert verdict.found() == {"duplicate-external-call": 1}


def test_closed_books_give_the_full_verdict(tmp_path: Path, capsys: Any) -> None:
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=False)
    folder = RunFolder(run, manifest=json.loads((run / "manifest.json").read_text()))
    folder.close_books()  # what each runner calls right after its end-state snapshot
    assert json.loads((run / "manifest.json").read_text())["complete"] is True
    assert verify_main([str(run), "--engine", "in-process"]) == 1
    verdict = Verdict.load(run / "verdict.json")
    assert verdict.outcome == "anomalies"
    assert verdict.found() == {"duplicate-effect": 1, "duplicate-external-call": 1}
    assert verdict.ops("duplicate-effect") == {DUP}
    assert verdict.unjudged == ()
    assert verdict.incomplete == ()
    assert "ANOMALIES: duplicate-effect=1 [op-07]" in capsys.readouterr().out


def test_a_run_that_doubts_its_evidence_verifies_incomplete_naming_why(tmp_path: Path, capsys: Any) -> None:
    """A soak whose driver stopped on an error closes its books, but its verdict may not read as full."""
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=False)
    folder = RunFolder(run, manifest=json.loads((run / "manifest.json").read_text()))
    folder.doubt("the soak's driver stopped on HarnessError: no RECEIPT")
    folder.close_books()
    assert verify_main([str(run), "--engine", "in-process"]) == EXIT_INCOMPLETE
    verdict = Verdict.load(run / "verdict.json")
    assert verdict.outcome == "incomplete"
    assert verdict.incomplete == ("the soak's driver stopped on HarnessError: no RECEIPT",)
    assert verdict.ops("duplicate-effect") == {DUP}  # what it found, it still names
    assert capsys.readouterr().out.startswith("INCOMPLETE: the soak's driver stopped on HarnessError")


def test_judged_rules_keep_only_what_partial_evidence_can_prove() -> None:
    contract = FlowContract(per_key=True)
    assert judged_rules(contract) == rules(contract)
    damaged = judged_rules(contract, intact=False)
    assert {"duplicate-effect", "dead-lettered-with-effect", "duplicate-external-call"} <= set(damaged)
    assert not {"lost", "orphan-effect", "stuck", "dead-lettered", "in-doubt"} & set(damaged)
    assert set(judged_rules(contract, snapshot=False)) == {"duplicate-external-call"}


# -- finding 2: a torn or corrupt line is counted and skipped alone --------------------------
def _tear(segment: Path) -> int:
    """Damage a segment the way a dying writer does; return how many events were made unreadable."""
    lines = segment.read_bytes().splitlines(keepends=True)
    # line 3 torn mid-write, the next event glued to it; line 6 overwritten by garbage; last line torn
    lines[3] = lines[3][: len(lines[3]) // 2] + lines[4]
    del lines[4]
    lines[6] = b"\x00\x00\x00 not json\n"
    lines[-1] = lines[-1][:-9]
    segment.write_bytes(b"".join(lines))
    return 3


def test_torn_lines_are_counted_and_skipped_alone(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=True)
    seg = next((run / "ledger" / "segments").glob("worker-0-*.jsonl"))
    whole = read_segments(run / "ledger").num_rows
    lost_events = _tear(seg)
    events = read_segments(run / "ledger")
    assert events.num_rows == whole - lost_events  # the lines after each tear are all read
    verdict = checker.check_run(run, FlowContract())
    assert verdict.damaged_lines == {seg.name: 3}
    assert verdict.outcome == "incomplete"
    assert "3 damaged ledger line(s) skipped in " + seg.name in verdict.headline()
    assert verdict.found() == {"duplicate-effect": 1, "duplicate-external-call": 1}
    assert "lost" in verdict.unjudged  # an absence proves nothing when lines are missing
    compact(run / "ledger")  # the compacted ledger keeps the count for the Spark engine
    layout = json.loads((run / "ledger" / PARQUET_NAME / "_layout.json").read_text())
    assert layout["damaged_lines"] == {seg.name: 3}
    assert checker.check_run(run, FlowContract()).damaged_lines == {seg.name: 3}


def test_the_live_tail_skips_a_damaged_line_and_keeps_following(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", snapshot=True)
    seg = next((run / "ledger" / "segments").glob("worker-0-*.jsonl"))
    whole = len(seg.read_bytes().splitlines())
    lines = seg.read_bytes().splitlines(keepends=True)
    lines[2] = b"\x00\x00 torn\n"
    seg.write_bytes(b"".join(lines))
    tail = LedgerTail(run / "ledger")
    assert sum(1 for e in tail.new() if e["src"] == "worker-0") == whole - 1
    assert tail.damaged == 1


# -- finding 3: never guess a contract -------------------------------------------------------
def test_a_missing_manifest_is_refused_not_verified_with_a_default_contract(tmp_path: Path, capsys: Any) -> None:
    # a send-money flow: an operation without its external call is lost, whatever it booked
    run = _run(tmp_path / "run", snapshot=True, external_calls=False, ops=["op-01"])
    _manifest(run, complete=True, contract=FlowContract(min_external_calls=1))
    assert verify_main([str(run), "--engine", "in-process"]) == 1
    assert Verdict.load(run / "verdict.json").found() == {"lost": 1}
    capsys.readouterr()
    (run / "manifest.json").unlink()
    assert verify_main([str(run), "--engine", "in-process"]) == 2
    err = capsys.readouterr().err
    assert "manifest.json is missing" in err
    assert "Hint: restore manifest.json" in err
    (run / "manifest.json").write_text(json.dumps({"scenario": "trust", "complete": True}))
    assert verify_main([str(run), "--engine", "in-process"]) == 2
    assert "records no flow contract" in capsys.readouterr().err


# -- finding 4: a damaged compacted part is rebuilt from the segments ------------------------
def _damage_part(run: Path) -> Path:
    parts = sorted((run / "ledger" / PARQUET_NAME).glob("*.parquet"), key=lambda p: p.stat().st_size)
    part = parts[-1]
    data = part.read_bytes()
    part.write_bytes(data[:-40] + b"\xff" * 40)  # the footer and its length: "Couldn't deserialize thrift"
    return part


def test_a_damaged_compacted_part_is_rebuilt_from_its_segments(tmp_path: Path, capsys: Any) -> None:
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=True)
    compact(run / "ledger")
    before = checker.check_run(run, FlowContract())
    _damage_part(run)
    assert verify_main([str(run), "--engine", "in-process"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("note: rebuilt ")
    assert "kept as events.parquet.damaged-" in out
    after = Verdict.load(run / "verdict.json")
    assert compare_verdicts(before, after) == []
    kept = list((run / "ledger").glob(PARQUET_NAME + ".damaged-*"))
    assert len(kept) == 1
    assert any(kept[0].glob("*.parquet"))


def test_a_damaged_compacted_ledger_without_segments_is_one_clear_error(tmp_path: Path, capsys: Any) -> None:
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=True)
    compact(run / "ledger")
    shutil.rmtree(run / "ledger" / "segments")
    _damage_part(run)
    with pytest.raises(IncompleteEvidence, match="no segment to rebuild it from"):
        checker.check_run(run, FlowContract())
    assert verify_main([str(run), "--engine", "in-process"]) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert err.startswith("txchaos: IncompleteEvidence: ")  # as every subcommand says its errors
    assert "Traceback" not in err
    assert len(err.splitlines()) == 2


# -- finding 6: synth never writes into what exists, and is bounded --------------------------
def test_synth_refuses_a_non_empty_folder_and_a_file(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert synth_main(["--events", "1000", "--out", str(out)]) == 2
    assert "is a folder that is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file.txt"
    a_file.write_text("mine")
    assert synth_main(["--events", "1000", "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert synth_main(["--events", "1000", "--out", str(empty)]) == 0
    assert json.loads((empty / "manifest.json").read_text())["complete"] is True


@pytest.mark.parametrize("events", ["1e20", "inf"])
def test_synth_bounds_the_event_count(events: str, tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        synth_main(["--events", events, "--out", str(tmp_path / "s")])
    assert exit_.value.code == 2
    assert "--events" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_synth_checks_free_disk_and_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(synth.shutil, "disk_usage", lambda _p: SimpleNamespace(total=10**9, used=10**9, free=10**6))
    with pytest.raises(ConfigError, match="need about"):
        synth.synth_run(tmp_path / "s", 1_000_000, seed=1)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    def boom(*_a: object, **_k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(synth, "_run_rows", boom)
    with pytest.raises(OSError, match="disk full"):
        synth.synth_run(tmp_path / "s", 5000, seed=1)
    assert list(tmp_path.iterdir()) == []


# -- finding 7: a Spark master that is not there is refused at once --------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("master", ["yarn", "spark://127.0.0.1", "spark://127.0.0.1:0", "local[0]"])
def test_verify_refuses_a_malformed_master(master: str, tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("pyspark")
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=True)
    assert verify_main([str(run), "--master", master]) == 2
    assert "Hint: use spark://HOST:PORT" in capsys.readouterr().err


def test_verify_refuses_a_master_that_does_not_answer(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("pyspark")
    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=True)
    port = _closed_port()
    started = time.monotonic()
    assert verify_main([str(run), "--master", f"spark://127.0.0.1:{port}"]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert f"no Spark master answers at 127.0.0.1:{port}" in err
    assert "omit --master to run local[*]" in err
    assert not (run / "verdict-spark.json").exists()


# -- both engines: the same verdict on incomplete and damaged folders ------------------------
@pytest.mark.spark
@pytest.mark.parametrize("case", ["interrupted", "torn", "damaged-part", "doubted"])
def test_engines_agree_on_incomplete_and_damaged_folders(case: str, spark_engine: Any, tmp_path: Path) -> None:
    spark, session = spark_engine
    run = _run(tmp_path / "run", snapshot=case != "interrupted")
    _manifest(run, complete=case != "interrupted")
    if case == "doubted":
        RunFolder(run, manifest=json.loads((run / "manifest.json").read_text())).doubt("the driver stopped")
    if case == "torn":
        _tear(next((run / "ledger" / "segments").glob("worker-0-*.jsonl")))
    compact(run / "ledger")
    if case == "damaged-part":
        _damage_part(run)
    remote = spark.check_run(run, FlowContract(), spark=session)  # rebuilds the part first: no Java trace
    local = checker.check_run(run, FlowContract())
    assert compare_verdicts(local, remote) == []
    expected = {"interrupted": "incomplete", "torn": "incomplete", "damaged-part": "anomalies", "doubted": "incomplete"}
    expected = expected[case]
    assert remote.outcome == local.outcome == expected
    assert remote.anomalies["lost"] == 0
    if case == "damaged-part":
        assert remote.notes
        assert remote.notes[0].startswith("rebuilt ")
        assert remote.ops("duplicate-effect") == {DUP}


@pytest.mark.parametrize("announce_bytes", [0, 1 << 40])
def test_judging_a_large_ledger_says_what_the_close_is_doing(
    announce_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.resources import scenarios_dir
    from harness.run.core import outcome
    from harness.run.spec.files import resolve

    run = _run(tmp_path / "run", snapshot=True)
    _manifest(run, complete=False)
    folder = RunFolder(run, manifest=json.loads((run / "manifest.json").read_text()))
    folder.close_books()
    (spec,) = resolve("onepc_crash_gap:naive", 1, scenarios_dir())
    monkeypatch.setattr(outcome, "ANNOUNCE_BYTES", announce_bytes)
    said: list[str] = []
    result = outcome.judge_folder(folder, spec, said.append)
    assert result.verdict.found() == {"duplicate-effect": 1, "duplicate-external-call": 1}
    if announce_bytes:
        assert said == []  # a small ledger's close stays quiet
    else:
        events = len(read_segments(run / "ledger"))
        assert said[0].startswith("judging the run: compacting 0 MB of ledger segments")
        assert said[1].startswith(f"compacted {events:,} events in ")
