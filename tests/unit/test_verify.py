"""The in-process engine on hand-built edge cases, the verdict file, and the verify CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.errors import ConfigError
from harness.ledger.reader import compact
from harness.ledger.schema import Kind
from harness.ledger.synth import synth_run
from harness.ledger.writer import LedgerWriter
from harness.verify import checker, model, sql
from harness.verify.assemble import MAX_WITNESS_EVENTS, compare_verdicts, pair_fault_windows, percentiles
from harness.verify.checker import check_run
from harness.verify.cli import contract_of, synth_main, verify_main
from harness.verify.model import FlowContract, latency_bucket_us
from harness.verify.verdict import Verdict


def _flow(w: LedgerWriter, op: str, *, effects: int = 1, downstream: bool = True) -> None:
    w.emit(Kind.SUBMIT, op=op)
    w.emit(Kind.DELIVER, op=op, attempt=1)
    for _ in range(effects):
        w.emit(Kind.RESIDUE_EFFECT, op=op)
    if downstream:
        w.emit(Kind.DOWNSTREAM, op=op)


def test_checker_names_each_anomaly_and_nothing_else(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as w:
        _flow(w, "ok-1")
        _flow(w, "dup", effects=2)
        _flow(w, "stopped", downstream=False)
        w.emit(Kind.SUBMIT, op="never-delivered")
        w.emit(Kind.RESIDUE_EFFECT, op="orphan")
        w.emit(Kind.PREPARE, op="in-doubt")
        w.emit(Kind.PREPARE, op="aborted")
        w.emit(Kind.ABORT_PREPARED, op="aborted")
    v = check_run(tmp_path, FlowContract())
    assert v.found() == {"lost": 2, "duplicate-effect": 1, "orphan-effect": 1, "in-doubt": 1}
    assert v.ops("lost") == {"stopped", "never-delivered"}
    assert v.ops("duplicate-effect") == {"dup"}
    lenient = check_run(tmp_path, FlowContract(expects_downstream=False))
    assert lenient.ops("lost") == {"never-delivered"}


def test_witness_carries_the_fault_active_during_the_duplicate(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as w:
        w.emit(Kind.SUBMIT, op="op-1")
        w.emit(Kind.FAULT_START, point="latency:activemq")
        w.emit(Kind.DELIVER, op="op-1", attempt=1)
        w.emit(Kind.FAULT_END, point="latency:activemq")
        w.emit(Kind.DELIVER, op="op-1", attempt=2)
        w.emit(Kind.RESIDUE_EFFECT, op="op-1")
        w.emit(Kind.RESIDUE_EFFECT, op="op-1")
        w.emit(Kind.DOWNSTREAM, op="op-1")
    v = check_run(tmp_path, FlowContract())
    (wit,) = v.witnesses
    assert [f["fault"] for f in wit.faults] == ["latency:activemq"]
    assert [e.get("faults") for e in wit.events if e["kind"] == "deliver"] == [["latency:activemq"], None]
    assert v.stats["redeliveries"] == 1
    assert v.stats["fault_windows"][0]["anomalies"] == {"duplicate-effect": 1}


def test_fault_windows_pair_first_in_first_out_and_count_strays() -> None:
    rows = [
        {"ts_ns": t, "src": "faults", "seq": i, "kind": k, "point": p}
        for i, (t, k, p) in enumerate(
            [
                (1, "fault_start", "a"),
                (2, "fault_start", "a"),
                (3, "fault_end", "a"),
                (4, "fault_end", "b"),
                (5, "fault_start", "c"),
            ]
        )
    ]
    windows, stray = pair_fault_windows(rows)
    assert [(w.fault, w.start_ns, w.end_ns) for w in windows] == [("a", 1, 3), ("a", 2, None), ("c", 5, None)]
    assert stray == 1


def test_latency_buckets_and_percentiles() -> None:
    assert [latency_bucket_us(v) for v in (0, 999, 1234, 98765, 5_432_100)] == [0, 999, 1230, 98700, 5_430_000]
    hist = {1000: 50, 2000: 45, 9000: 5}
    assert percentiles(hist, 9500) == {"count": 100, "p50": 2.0, "p95": 2.0, "p99": 9.0, "max": 9.5}


def test_verdict_roundtrips_and_compares(tmp_path: Path) -> None:
    run = synth_run(tmp_path / "r", 30_000, seed=5, anomaly_rate=0.02)
    v = check_run(run, FlowContract())
    again = Verdict.load(v.write(tmp_path / "verdict.json"))
    assert compare_verdicts(v, again) == []
    assert again == v  # every field, the witnesses' events and faults included
    written = json.loads((tmp_path / "verdict.json").read_text())
    fields = {"anomaly", "op", "msg_ids", "summary", "events", "faults"}
    assert written["witnesses"]
    assert set(written["witnesses"][0]) == fields
    assert {"clean", "outcome", "unfired"} <= set(written)
    assert written["anomalies"]["lost"] == v.anomalies["lost"]
    changed = Verdict(dict(v.anomalies, lost=v.anomalies["lost"] + 1), v.witnesses, v.stats, "other")
    assert compare_verdicts(v, changed)


def test_synth_ground_truth_is_what_the_checker_finds(tmp_path: Path) -> None:
    run = synth_run(tmp_path / "r", 200_000, seed=11, anomaly_rate=0.01)
    truth = json.loads((run / "manifest.json").read_text())["ground_truth"]
    v = check_run(run, contract_of(run))  # the synthetic flow promises one output and a net of zero
    assert v.found() == {k: n for k, n in truth.items() if n}
    assert v.stats["seq_missing"] == 0


def test_the_benchmark_floor_counts_what_the_engine_finds(tmp_path: Path) -> None:
    # the floor is the same SQL summary and rules without the rest: it must count the same anomalies
    run = synth_run(tmp_path / "r", 100_000, seed=5, anomaly_rate=0.01)
    truth = {k: n for k, n in json.loads((run / "manifest.json").read_text())["ground_truth"].items() if n}
    floor = checker.floor_counts(run, contract_of(run))
    assert {k: n for k, n in floor.items() if n} == truth == check_run(run, contract_of(run)).found()


def _summaries_differ(run: Path, contract: FlowContract) -> tuple[int, dict[str, int]]:
    """Return how many summary rows the packed and the plain DuckDB queries disagree on, and the packed sums."""
    counts = list(sql.packed_counts(sql.DUCKDB_PACKED)[1])
    with checker.connect() as con:
        checker._source(con, run / "ledger")
        plain, packed = (
            sql.summary_query("ev", contract, d, keys="op_id", judged={}) for d in (sql.DUCKDB, sql.DUCKDB_PACKED)
        )
        cols = ", ".join(c[0] for c in con.execute(f"SELECT * FROM ({plain}) LIMIT 0").description or ())
        (differ,) = con.execute(
            f"SELECT count(*) FROM ((SELECT {cols} FROM ({plain}) EXCEPT ALL SELECT {cols} FROM ({packed})) "
            f"UNION ALL (SELECT {cols} FROM ({packed}) EXCEPT ALL SELECT {cols} FROM ({plain})))"
        ).fetchone() or (None,)
        sums = con.execute(f"SELECT {', '.join(f'sum({c})' for c in counts)} FROM ({packed})").fetchone() or ()
    return int(differ or 0), dict(zip(counts, map(int, sums), strict=True))


def test_the_packed_counts_are_the_plain_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the engine adds its counts up four to a 128-bit sum; every row of its summary must be the
    # plain query's, a count past 16 bits (one operation's 70,000 redeliveries) included
    run = synth_run(tmp_path / "synth", 100_000, seed=5, anomaly_rate=0.02)
    differ, sums = _summaries_differ(run, contract_of(run))
    assert differ == 0
    assert min(sums["redeliveries"], sums["crashes"], sums["dead_letters"]) > 0
    hand = tmp_path / "hand"
    with LedgerWriter(hand / "ledger", "driver") as w:
        for counted in (*model.COUNTS.values(), Kind.ALERT, Kind.RESIDUE_OUTBOX):
            w.emit(counted, op="every-kind", attempt=1)
        with w.batch():
            for _ in range(70_000):
                w.emit(Kind.DELIVER, op="redelivered", attempt=2)
    contract = FlowContract()
    differ, sums = _summaries_differ(hand, contract)
    assert differ == 0
    picked = ("redeliveries", "deliveries", "alerts", "outbox_pending", "invariant_breaks")
    assert {n: sums[n] for n in picked} == dict(zip(picked, (70_000, 70_001, 2, 2, 1), strict=True))
    # a ledger whose counts might not fit a slot is judged with the plain query
    used: list[str] = []
    real = sql.summary_query
    monkeypatch.setattr(sql, "summary_query", lambda *a, **k: used.append(a[2].name) or real(*a, **k))
    packed = check_run(run, contract_of(run))
    monkeypatch.setattr(sql, "PACKED_MAX_ROWS", 1_000)
    assert compare_verdicts(check_run(run, contract_of(run)), packed) == []
    assert used == ["duckdb-packed", "duckdb-packed", "duckdb", "duckdb-packed"]


def test_the_window_masks_count_what_the_range_join_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # up to MASK_WINDOWS windows the in-process engine adds up sets of windows from one streaming
    # pass; past it, a range join over the stored summary. The two must give the same verdict.
    run = synth_run(tmp_path / "r", 50_000, seed=7, anomaly_rate=0.02, windows=60)
    masked = check_run(run, contract_of(run))
    monkeypatch.setattr(checker, "MASK_WINDOWS", 0)
    joined = check_run(run, contract_of(run))
    assert len(masked.stats["fault_windows"]) == 60
    assert sum(w["ops"] for w in masked.stats["fault_windows"]) > 0
    assert any(w["anomalies"] for w in masked.stats["fault_windows"])
    assert compare_verdicts(masked, joined) == []
    assert masked.stats["fault_windows"] == joined.stats["fault_windows"]
    assert masked.witnesses == joined.witnesses


def test_the_witness_lookup_gives_each_witness_its_events_and_figures(tmp_path: Path) -> None:
    # the Spark job looks its witnesses up with this query; a ledger not compacted is refused
    run = synth_run(tmp_path / "r", 30_000, seed=5, anomaly_rate=0.02)
    verdict = check_run(run, contract_of(run))
    ops = pq.read_table(run / "ledger" / "events.parquet", columns=["op", "op_id"]).to_pylist()
    op_ids = {r["op"]: r["op_id"] for r in ops}
    events_of = Counter(r["op"] for r in ops)
    chosen = verdict.witnesses[::7]
    assert len(chosen) > 5
    windows, _ = pair_fault_windows([])
    picks = [(w.anomaly, op_ids[w.op]) for w in chosen]
    found = checker.witnesses(run / "ledger", contract_of(run), picks, windows)
    assert [(w.anomaly, w.op) for w in found] == [(w.anomaly, w.op) for w in chosen]
    for got, w in zip(found, chosen, strict=True):
        assert {e["op"] for e in got.events} == {w.op}
        assert len(got.events) == events_of[w.op] == len(w.events)
        assert got.summary == w.summary
        assert [e["seq"] for e in got.events] == [e["seq"] for e in w.events]
    raw = tmp_path / "raw" / "ledger"
    with LedgerWriter(raw, "driver") as lw:
        lw.emit(Kind.SUBMIT, op="loop")
        for attempt in range(1, MAX_WITNESS_EVENTS + 30):
            lw.emit(Kind.DELIVER, op="loop", attempt=attempt)
    with pytest.raises(ConfigError, match="holds no compacted ledger"):
        checker.witnesses(raw, FlowContract(), [("lost", 0)], windows)
    compact(raw)
    (loop,) = checker.witnesses(raw, FlowContract(), [("lost", 0)], windows)  # the run's only operation
    assert len(loop.events) == MAX_WITNESS_EVENTS  # a chain is cut, its figures are not
    assert [e["seq"] for e in loop.events] == list(range(MAX_WITNESS_EVENTS))
    assert loop.summary["deliveries"] == MAX_WITNESS_EVENTS + 29
    with checker.connect() as con:  # cut in the query already, not after all of them reached Python
        checker._source(con, raw)
        _, chains = checker._witness_rows(con, FlowContract(), [0])
    assert sorted(e["seq"] for e in chains[0]) == list(range(MAX_WITNESS_EVENTS))


def test_the_in_process_engine_spills_instead_of_growing(tmp_path: Path) -> None:
    # the buffer pool is bounded: a summary past it goes to the temporary folder, not to RSS
    with checker.connect() as con:
        limit = con.execute("SELECT current_setting('memory_limit')").fetchone()
        spill = con.execute("SELECT current_setting('temp_directory')").fetchone()
        assert limit is not None
        assert spill is not None
        assert limit[0].replace(" ", "").upper() in ("384.0MIB", "366.2MIB", "384MB", "366.2MB")
        assert Path(spill[0]).is_dir()
    assert not Path(spill[0]).exists()  # removed with the connection


def test_spark_driver_logs_errors_only_unless_verbose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.verify import spark

    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path))
    quiet = spark.session._java_options(verbose=False)
    config = spark.quiet_log_config()
    assert f"-Dlog4j2.configurationFile={config.as_uri()}" in quiet
    assert "rootLogger.level = error" in config.read_text()
    assert "logger.repl.level = error" in config.read_text()  # else PySpark, a "shell", announces WARN
    assert "log4j2" not in spark.session._java_options(verbose=True)
    # only a driver that runs one verification skips the optimizing compiler
    assert spark.ONE_SHOT_JVM_OPTIONS in spark.session._java_options(one_shot=True)
    assert spark.ONE_SHOT_JVM_OPTIONS not in spark.session._java_options()


def test_verify_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert synth_main(["--events", "2e4", "--out", str(tmp_path / "s"), "--seed", "2", "--anomaly-rate", "0.05"]) == 0
    assert verify_main([str(tmp_path / "s"), "--engine", "in-process"]) == 1
    assert Verdict.load(tmp_path / "s" / "verdict.json").engine == "in-process"
    clean = tmp_path / "clean"
    with LedgerWriter(clean / "ledger", "driver") as w:
        _flow(w, "op-1")
    # A folder without its manifest has no contract to judge by: refused, never guessed (issue 12).
    assert verify_main([str(clean), "--engine", "in-process"]) == 2
    assert "manifest.json" in capsys.readouterr().err
    (clean / "manifest.json").write_text(json.dumps({"complete": True, "contract": {"expects_downstream": True}}))
    assert verify_main([str(clean), "--engine", "in-process"]) == 0
    assert "CLEAN" in capsys.readouterr().out


def test_latency_is_submit_to_first_downstream_in_ms_whatever_the_epoch() -> None:
    # Real timestamps are ~1.8e18 ns: a precedence slip (a - b // 1000) once made p50 ~1.8e15 ms.
    import pyarrow as pa

    from harness.ledger.schema import ARROW_SCHEMA, Kind, empty_row
    from harness.run.spec.scenario import FlowContract
    from harness.verify.checker import check_table

    epoch = 1_795_592_496_840_498_896
    rows = []
    for n, took_ms in enumerate((150, 250, 350)):
        op = f"op-{n}"
        for seq, (kind, at) in enumerate(((Kind.SUBMIT, 0), (Kind.DOWNSTREAM, took_ms), (Kind.DOWNSTREAM, 5_000))):
            fields = {"ts_ns": epoch + at * 1_000_000, "src": f"w{n}", "pid": n + 1, "seq": seq}
            rows.append(empty_row() | fields | {"kind": str(kind), "op": op})
    verdict = check_table(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), FlowContract(), snapshot=False)
    latency = verdict.stats["latency_ms"]
    assert (latency["count"], latency["p50"], latency["max"]) == (3, 250.0, 350.0), latency


def test_a_kind_test_is_one_range_for_a_run_of_codes_and_a_list_otherwise() -> None:
    """Both engines run these texts: a run of codes (the residue kinds) is BETWEEN, anything else IN."""
    from harness.ledger.layout import KIND_CODES
    from harness.ledger.schema import RESIDUE_KINDS
    from harness.verify.sql import is_kind

    codes = sorted(KIND_CODES[str(k)] for k in RESIDUE_KINDS)
    assert codes == list(range(codes[0], codes[-1] + 1))  # the schema keeps the residue kinds together
    assert is_kind(*RESIDUE_KINDS) == f"kind_code BETWEEN {codes[0]} AND {codes[-1]}"
    submit, deliver = KIND_CODES[str(Kind.SUBMIT)], KIND_CODES[str(Kind.DELIVER)]
    assert is_kind(Kind.DELIVER, Kind.SUBMIT) == f"kind_code IN ({submit}, {deliver})"
    assert is_kind(Kind.SUBMIT) == f"kind_code = {submit}"


def test_a_cold_spark_verify_keeps_the_optimizing_compiler_for_a_long_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-shot driver's C1-only JIT pays off on short jobs only: the ledger's size decides."""
    import harness.verify.spark as spark_engine
    from harness.verify.spark import ONE_SHOT_MAX_EVENTS, SEGMENT_BYTES_PER_EVENT, ledger_events

    asked: list[bool] = []

    def session_for(master: str | None, *, verbose: bool, one_shot: bool) -> tuple[object, str]:
        asked.append(one_shot)
        return object(), "local[*]"

    monkeypatch.setattr(spark_engine, "session_for", session_for)
    monkeypatch.setattr(spark_engine.SparkSession, "getActiveSession", staticmethod(lambda: None))
    spark_engine._session(None, None, False, ONE_SHOT_MAX_EVENTS)
    spark_engine._session(None, None, False, ONE_SHOT_MAX_EVENTS + 1)
    assert asked == [True, False]

    run = tmp_path / "synth"
    synth_run(run, events=20_000, seed=1)
    events = ledger_events(run / "ledger")
    assert 20_000 <= events <= 25_000  # the compacted layout's own count
    segments = tmp_path / "raw" / "ledger" / "segments"
    segments.mkdir(parents=True)
    (segments / "driver-1.jsonl").write_bytes(b"x" * SEGMENT_BYTES_PER_EVENT * 1000)
    (segments / "driver-1.jsonl.gz").write_bytes(b"x" * SEGMENT_BYTES_PER_EVENT * 500)  # a user's copy aside
    assert ledger_events(segments.parent) == 1000  # not compacted yet: estimated from the segments' bytes
    assert ledger_events(tmp_path / "nothing") == 0


def test_txchaos_verify_imports_no_run_flow(tmp_path: Path) -> None:
    """A cold `txchaos verify` pays for no flow it does not run: importing the flows (SQLAlchemy,
    the brokers' clients) took 0.5 s of its start, which a bare PySpark start does not pay."""
    run = synth_run(tmp_path / "r", 2_000, seed=3)
    code = (
        "import sys; from harness.cli import main; code = main(['verify', '--engine', 'in-process', sys.argv[1]]); "
        "print(sorted(m for m in sys.modules if m.startswith(('harness.run', 'sqlalchemy', 'stomp')))); "
        "sys.exit(code)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=False)
    assert out.returncode not in (2, 3), out.stderr  # a verdict, whichever (a synthetic run may be unfired)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
