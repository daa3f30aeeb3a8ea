"""Differential test: the in-process and Spark engines agree, and both find every injected anomaly.

Hypothesis builds small ledgers from operations with a known class (or none), fault windows and
edge cases (never delivered, effect without submission, duplicates inside and across fault
windows, a sink clock running behind), writes them as segments, compacts them, and runs both
engines. Each injected operation must be named under its class, by both engines.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.ledger import layout
from harness.ledger.layout import read_layout
from harness.ledger.reader import compact
from harness.ledger.schema import COLUMNS, RESIDUE_KINDS, Kind
from harness.ledger.synth import synth_run
from harness.ledger.writer import LedgerWriter
from harness.verify import checker, sql
from harness.verify.assemble import MAX_WITNESS_EVENTS, WITNESSES_PER_CLASS, compare_verdicts
from harness.verify.cli import contract_of
from harness.verify.model import INVARIANT_OP_PREFIX, FlowContract, Invariant, rules
from harness.verify.verdict import explain

pytestmark = pytest.mark.spark

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
# class -> the classes the verdict must name for that operation
EXPECT: dict[str, set[str]] = {
    "normal": set(),
    "redelivered": set(),
    "aborted-2pc": set(),
    "lost": {"lost"},
    "never-delivered": {"lost"},
    "lost-no-downstream": {"lost"},
    "duplicate-effect": {"duplicate-effect"},
    "duplicate-external-call": {"duplicate-external-call"},
    "orphan-effect": {"orphan-effect"},
    "stuck": {"stuck"},
    "dead-lettered": {"dead-lettered"},
    "flagged-dead-letter": set(),
    "orphan-outbox": {"orphan-outbox"},
    "dead-lettered-with-effect": {"dead-lettered-with-effect"},
    "never-dead-lettered-poison": {"never-dead-lettered-poison", "stuck"},
    "in-doubt": {"in-doubt"},
}


@dataclass(frozen=True)
class Op:
    cls: str
    skew: bool  # the sink's clock runs 5 s behind: downstream before submit


@dataclass(frozen=True)
class Window:
    name: str
    first_op: int  # starts half-way through this op ...
    last_op: int  # ... and ends half-way through this one
    closed: bool = True  # False: still open when the run ended (no fault_end)


def _events(i: int, op: Op) -> list[tuple[int, str, Kind, dict[str, Any]]]:
    """Return (ts, src, kind, columns) for operation ``i``; attempts at 100 ms and 700 ms into its second."""
    name, base = f"op-{i:04d}", T0 + i * S
    ev: list[tuple[int, str, Kind, dict[str, Any]]] = []

    def add(offset_ms: int, src: str, kind: Kind, **cols: Any) -> None:
        ev.append((base + offset_ms * MS, src, kind, {"op": name, **cols}))

    c = op.cls
    if c == "orphan-effect":
        pass
    elif c in ("in-doubt", "aborted-2pc"):
        add(0, "driver", Kind.PREPARE)
        if c == "aborted-2pc":
            add(50, "driver", Kind.ABORT_PREPARED)
        return ev
    else:
        add(0, "driver", Kind.SUBMIT, dest="orders")
    if c == "never-delivered":
        return ev
    attempts = {
        "redelivered": 2,
        "duplicate-effect": 2,
        "duplicate-external-call": 2,
        "never-dead-lettered-poison": 12,
    }.get(c, 1)
    for a in range(1, attempts + 1):
        t = 100 if a == 1 else 700 + a
        msg = f"ID:{name}"
        add(t, "worker-0", Kind.DELIVER, msg=msg, stage="s0", attempt=a)
        if c == "never-dead-lettered-poison":
            add(t + 1, "worker-0", Kind.CRASH, msg=msg, point="before_db_commit", attempt=a)
            continue
        if c == "duplicate-external-call":
            add(t + 1, "worker-0", Kind.EXTERNAL_CALL, msg=msg, attempt=a)
        if c == "flagged-dead-letter":  # the stage diverted it on purpose, with an alert
            add(t + 1, "worker-0", Kind.ALERT, msg=msg, attempt=a)
            continue
        if a < attempts and c == "redelivered":
            add(t + 2, "worker-0", Kind.CRASH, msg=msg, point="before_db_commit", attempt=a)
            continue
        add(t + 3, "worker-0", Kind.EFFECT, msg=msg, attempt=a)
        add(t + 4, "worker-0", Kind.DB_COMMIT, msg=msg, attempt=a)
        if a < attempts:  # crash after the DB commit: the effect is applied, the message redelivered
            add(t + 5, "worker-0", Kind.CRASH, msg=msg, point="after_db_commit", attempt=a)
        else:
            add(t + 6, "worker-0", Kind.BROKER_COMMIT, msg=msg, attempt=a)
    sink_t = 900 - (5000 if op.skew else 0)
    tail = {
        "lost": [],
        "lost-no-downstream": [Kind.RESIDUE_EFFECT],
        "duplicate-effect": [Kind.DOWNSTREAM, Kind.RESIDUE_EFFECT, Kind.RESIDUE_EFFECT],
        "stuck": [Kind.RESIDUE_QUEUE],
        "never-dead-lettered-poison": [Kind.RESIDUE_QUEUE],
        "dead-lettered": [Kind.DEAD_LETTER],
        "flagged-dead-letter": [Kind.DEAD_LETTER],
        "orphan-outbox": [Kind.RESIDUE_EFFECT, Kind.RESIDUE_OUTBOX],
        "dead-lettered-with-effect": [Kind.DEAD_LETTER, Kind.RESIDUE_EFFECT],
    }.get(c, [Kind.DOWNSTREAM, Kind.RESIDUE_EFFECT])
    for k in tail:
        if k in (Kind.DOWNSTREAM, Kind.DEAD_LETTER):
            add(sink_t, "sink", k)
        else:  # residue is drained after the run, far later
            ev.append((T0 + 10_000 * S + i, "residue", k, {"op": name}))
    return ev


def write_ledger(run: Path, ops: list[Op], windows: list[Window]) -> None:
    """Write the operations and windows as JSON-lines segments (one per writer) and compact them."""
    rows = [e for i, op in enumerate(ops) for e in _events(i, op)]
    for w in windows:
        rows.append((T0 + w.first_op * S + 500 * MS, "faults", Kind.FAULT_START, {"point": w.name}))
        if w.closed:
            rows.append((T0 + w.last_op * S + 500 * MS, "faults", Kind.FAULT_END, {"point": w.name}))
    seg = run / "ledger" / "segments"
    seg.mkdir(parents=True)
    by_src: dict[str, list[dict[str, Any]]] = {}
    for ts, src, kind, cols in rows:
        out = by_src.setdefault(src, [])
        row = (
            dict.fromkeys(COLUMNS)
            | {"ts_ns": ts, "src": src, "pid": 100 + len(src), "seq": len(out), "kind": str(kind), "detail": "{}"}
            | cols
        )
        out.append(row)
    for src, out in by_src.items():
        (seg / f"{src}-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    compact(run / "ledger")


def _bounds(w: Window) -> tuple[int, int]:
    return T0 + w.first_op * S + 500 * MS, T0 + w.last_op * S + 500 * MS if w.closed else 2**63 - 1


def expected_faults(i: int, op: Op, windows: list[Window]) -> set[str]:
    """Return the fault names overlapping operation ``i``'s span: its events but the snapshot the close
    writes (an output or dead letter the sink read while the run went on ends the span)."""
    snapshot = RESIDUE_KINDS - {Kind.DOWNSTREAM, Kind.DEAD_LETTER}
    span = [ts for ts, _src, k, _c in _events(i, op) if k not in snapshot]
    if not span:
        return set()
    return {w.name for w in windows if min(span) <= _bounds(w)[1] and max(span) >= _bounds(w)[0]}


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[list[Op], list[Window]]:
    ops = draw(st.lists(st.builds(Op, st.sampled_from(sorted(EXPECT)), st.booleans()), min_size=1, max_size=14))
    n = len(ops)
    spans = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 2)), max_size=3))
    windows = [Window(f"fault-{j}", a, min(n, a + d)) for j, (a, d) in enumerate(spans)]
    return ops, windows


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=ledgers())
def test_engines_agree_and_find_every_injected_anomaly(
    case: tuple[list[Op], list[Window]], spark_engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ops, windows = case
    run = tmp_path_factory.mktemp("run")
    write_ledger(run, ops, windows)
    contract = FlowContract()
    spark, session = spark_engine
    local = checker.check_run(run, contract)
    remote = spark.check_run(run, contract, spark=session)
    assert compare_verdicts(local, remote) == []
    assert remote.engine == "spark"
    assert {"jvm_start_s", "job_s"} <= set(remote.timing)
    for cls in rules(contract):
        injected = {f"op-{i:04d}" for i, op in enumerate(ops) if cls in EXPECT[op.cls]}
        for v in (local, remote):
            assert v.anomalies[cls] == len(injected), cls
            assert v.ops(cls) == injected, cls
    both_ends = {"normal", "redelivered", "duplicate-effect", "duplicate-external-call"}
    assert local.stats["clock_skew_ops"] == sum(op.skew for op in ops if op.cls in both_ends)
    assert local.stats["seq_missing"] == 0
    assert local.stats["redeliveries"] == sum(
        {"redelivered": 1, "duplicate-effect": 1, "duplicate-external-call": 1, "never-dead-lettered-poison": 11}.get(
            op.cls, 0
        )
        for op in ops
    )
    assert len(local.stats["fault_windows"]) == len(windows)
    for w in local.witnesses:
        i = int(w.op.split("-")[1])
        # the overlay: every fault window overlapping the operation, and on each event the ones active
        assert {f["fault"] for f in w.faults} == expected_faults(i, ops[i], windows)
        for e in w.events:
            active = {x.name for x in windows if _bounds(x)[0] <= e["ts_ns"] <= _bounds(x)[1]}
            assert set(e.get("faults", ())) == active
        assert len(w.events) == len(_events(i, ops[i]))
        order = [(e["ts_ns"], e["src"], e["seq"]) for e in w.events]
        assert order == sorted(order)


def test_engines_agree_past_the_witness_and_chain_caps(
    spark_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More anomalies than witnesses, and a witness with more events than a chain shows.

    Written in small row groups, so each bucket has several files (``layout.WRITE_LANES``) and the
    long chain is split over two of them: Spark's bucketed scan reads a bucket's files as one."""
    monkeypatch.setattr(layout, "_SORTED_SLICE", 61)
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as d, LedgerWriter(ledger, "worker-1") as w:
        for i in range(WITNESSES_PER_CLASS + 100):  # orphan effects: applied, never submitted
            w.emit(Kind.RESIDUE_EFFECT, op=f"orphan-{i:05d}")
        d.emit(Kind.SUBMIT, op="dup-loop")
        for attempt in range(1, MAX_WITNESS_EVENTS + 50):
            w.emit(Kind.DELIVER, op="dup-loop", attempt=attempt)
        w.emit(Kind.RESIDUE_EFFECT, op="dup-loop")
        w.emit(Kind.RESIDUE_EFFECT, op="dup-loop")
        d.emit(Kind.DOWNSTREAM, op="dup-loop")
    parts = compact(ledger)
    assert len(list(parts.glob("*.parquet"))) > (read_layout(parts) or {})["n_buckets"]
    spark, session = spark_engine
    local = checker.check_run(tmp_path, FlowContract())
    remote = spark.check_run(tmp_path, FlowContract(), spark=session)
    assert compare_verdicts(local, remote) == []
    assert remote.anomalies["orphan-effect"] == WITNESSES_PER_CLASS + 100
    assert len(remote.witnesses) == 1 + WITNESSES_PER_CLASS  # the one duplicate, the cap of orphans
    (loop,) = [x for x in remote.witnesses if x.op == "dup-loop"]
    assert loop.anomaly == "duplicate-effect"
    assert loop.summary["deliveries"] == MAX_WITNESS_EVENTS + 49  # counted over every event, not the cut chain
    assert len(loop.events) == MAX_WITNESS_EVENTS
    # each class's first in op order, the classes in their order: duplicate-effect, then orphan-00000 on
    assert remote.witnesses[0] == loop
    assert [x.op for x in remote.witnesses[1:]] == [f"orphan-{i:05d}" for i in range(WITNESSES_PER_CLASS)]


@pytest.mark.parametrize("case_windows", [0, 1000], ids=["time-slot join", "window masks"])
def test_engines_measure_every_fault_window_of_a_long_run(
    spark_engine: Any, tmp_path: Path, case_windows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A soak opens hundreds of windows: each gets its operation count and its fired flag, from
    both engines alike, by either of Spark's ways of finding them. Windows nest, one lasts no time,
    one is still open at the end, one opens before the first operation and one after the last
    (neither fires), and operations whose sink clock runs 5 s behind span several time slots."""
    import random

    from harness.verify.spark import job

    monkeypatch.setattr(job, "CASE_WINDOWS", case_windows)

    rng = random.Random(7)
    kinds = ["normal", "normal", "redelivered", "duplicate-effect", "lost", "stuck"]
    ops = [Op(kinds[i % len(kinds)], skew=i % 7 == 0) for i in range(300)]
    windows = [Window(f"w{j:03d}", a, a + rng.choice((0, 1, 1, 2, 3, 8))) for j, a in enumerate(range(2, 290, 2))]
    windows += [Window("nested", 40, 41), Window("open", 250, 0, closed=False)]
    windows += [Window("before", -20, -10), Window("after", 400, 402)]
    assert len(windows) > 64  # more than the verdicts before this measured
    write_ledger(tmp_path, ops, windows)
    spark, session = spark_engine
    local = checker.check_run(tmp_path, FlowContract())
    remote = spark.check_run(tmp_path, FlowContract(), spark=session)
    assert compare_verdicts(local, remote) == []
    expected = {w.name: sum(w.name in expected_faults(i, op, windows) for i, op in enumerate(ops)) for w in windows}
    assert expected["before"] == expected["after"] == 0
    assert expected["open"] == 49  # ops 251-299; op 250 ("lost") ends before its half-second
    for verdict in (local, remote):
        measured = {e["fault"]: e["ops"] for e in verdict.stats["fault_windows"]}
        assert measured == expected
        fired = {e["name"]: e["fired"] for e in verdict.faults if e["type"] == "fault"}
        assert fired == {name: n > 0 for name, n in expected.items()}
        idle = {name for name, n in expected.items() if n == 0}  # "before", "after", short ones between ops
        assert {"before", "after"} < idle
        assert set(verdict.unfired) == {
            f"fault {n} never fired: no operation was in flight while it was open" for n in idle
        }


def _fake_jdk(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    (home / "release").write_text(f'IMPLEMENTOR="test"\nJAVA_VERSION="{version}"\n')
    return home


@pytest.mark.parametrize(
    ("version", "suffix", "use", "record"),
    [
        ("17.0.15", ".jsa", "SharedArchiveFile", "ArchiveClassesAtExit"),
        ("25.0.3", ".aot", "AOTCache", "AOTCacheOutput"),
    ],
)
def test_driver_jvm_maps_the_class_archive_once_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, suffix: str, use: str, record: str
) -> None:
    spark = pytest.importorskip("harness.verify.spark")
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path))
    monkeypatch.setenv("JAVA_HOME", str(_fake_jdk(tmp_path / "jvm", "jdk", version)))
    monkeypatch.delenv(spark.CDS_DUMP_ENV, raising=False)
    archive = spark.class_archive()
    assert archive.parent == tmp_path / "spark"
    assert archive.suffix == suffix  # a JDK 25+ keeps an AOT cache, an older one a class-data archive
    assert use not in spark.session._java_options()  # none recorded yet: plain JVM
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"recorded")
    assert f"-XX:{use}={archive}" in spark.session._java_options()
    monkeypatch.setenv(spark.CDS_DUMP_ENV, str(tmp_path / f"training{suffix}"))  # the training run records
    assert f"-XX:{record}={tmp_path / f'training{suffix}'}" in spark.session._java_options()


def test_a_local_driver_runs_on_the_newest_aot_capable_jdk_unless_java_home_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark = pytest.importorskip("harness.verify.spark")
    session = spark.session
    monkeypatch.setattr(session, "JDK_ROOT", tmp_path)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    _fake_jdk(tmp_path, "java-17-openjdk-amd64", "17.0.15")
    assert session.driver_java_home() is None  # no JDK 25+: the java on PATH
    newest = _fake_jdk(tmp_path, "temurin-26-jdk-amd64", "26.0.1")
    _fake_jdk(tmp_path, "temurin-25-jdk-amd64", "25.0.3")
    assert session.driver_java_home() == session.driver_java_home("local[2]") == newest
    assert session.driver_java_home("spark://127.0.0.1:7077") is None  # executors run their hosts' JVM
    with session._driver_java(None):
        assert os.environ["JAVA_HOME"] == str(newest)  # what spark-submit runs
    assert "JAVA_HOME" not in os.environ  # and the process's own is back
    chosen = tmp_path / "java-17-openjdk-amd64"
    monkeypatch.setenv("JAVA_HOME", str(chosen))
    assert session.driver_java_home() == session.driver_java_home("spark://h:7077") == chosen


# Declared checks (issue 15): class -> the classes the verdict must name under DECLARED_CONTRACT.
DECLARED_EXPECT: dict[str, set[str]] = {
    "normal": set(),
    "double-apply": {"duplicate-effect"},  # applied twice, one row in the effect table
    "declared-lost": {"lost"},  # its row is there, its declared effect is not
    "dup-output": {"duplicate-output"},
    "net-broken": {"invariant-broken"},
}
TOTAL = Invariant("conserved-total", "SELECT sum(balance) AS actual, 1000 AS expected FROM accounts")
NET = Invariant("net-zero", "SELECT op_id, sum(amount) AS actual, 0 AS expected FROM moves GROUP BY 1", scope="op")
DECLARED_CONTRACT = FlowContract(
    effect_sql="SELECT op_id, count(*) AS applied FROM moves GROUP BY 1",
    invariants=(TOTAL, NET),
    exactly_once_output=True,
)


def _declared_events(i: int, cls: str) -> list[tuple[int, str, Kind, dict[str, Any]]]:
    name, late = f"op-{i:04d}", T0 + 10_000 * S + 1000 + i
    ev = _events(i, Op("normal", False))
    if cls == "dup-output":
        ev.append((T0 + i * S + 950 * MS, "sink", Kind.DOWNSTREAM, {"op": name}))
    applied = {"double-apply": 2, "declared-lost": 0}.get(cls, 1)
    if applied:
        ev.append((late, "residue", Kind.RESIDUE_DECLARED, {"op": name, "detail": json.dumps({"applied": applied})}))
    if cls == "net-broken":
        detail = {"invariant": "net-zero", "scope": "op", "actual": 5, "expected": 0, "holds": False}
        ev.append((late, "residue", Kind.RESIDUE_INVARIANT, {"op": name, "detail": json.dumps(detail)}))
    return ev


def _write_rows(run: Path, rows: list[tuple[int, str, Kind, dict[str, Any]]]) -> None:
    seg = run / "ledger" / "segments"
    seg.mkdir(parents=True)
    by_src: dict[str, list[dict[str, Any]]] = {}
    for ts, src, kind, cols in rows:
        out = by_src.setdefault(src, [])
        base = {"ts_ns": ts, "src": src, "pid": 100 + len(src), "seq": len(out), "kind": str(kind), "detail": "{}"}
        out.append(dict.fromkeys(COLUMNS) | base | cols)
    for src, out in by_src.items():
        (seg / f"{src}-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    compact(run / "ledger")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(classes=st.lists(st.sampled_from(sorted(DECLARED_EXPECT)), min_size=1, max_size=10), total_broken=st.booleans())
def test_engines_agree_on_declared_effects_invariants_and_outputs(
    classes: list[str], total_broken: bool, spark_engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run = tmp_path_factory.mktemp("declared")
    rows = [e for i, c in enumerate(classes) for e in _declared_events(i, c)]
    total = {"invariant": TOTAL.name, "scope": "global", "actual": 1040, "expected": 1000, "holds": not total_broken}
    op = INVARIANT_OP_PREFIX + TOTAL.name if total_broken else None
    rows.append((T0 + 10_000 * S, "residue", Kind.RESIDUE_INVARIANT, {"op": op, "detail": json.dumps(total)}))
    _write_rows(run, rows)
    spark, session = spark_engine
    local = checker.check_run(run, DECLARED_CONTRACT)
    remote = spark.check_run(run, DECLARED_CONTRACT, spark=session)
    assert compare_verdicts(local, remote) == []
    for cls in rules(DECLARED_CONTRACT):
        injected = {f"op-{i:04d}" for i, c in enumerate(classes) if cls in DECLARED_EXPECT[c]}
        if cls == "invariant-broken" and total_broken:
            injected.add(INVARIANT_OP_PREFIX + TOTAL.name)
        for v in (local, remote):
            assert v.ops(cls) == injected, cls
            assert v.anomalies[cls] == len(injected), cls
    applied = {"double-apply": 2, "declared-lost": 0}
    for w in remote.witnesses:  # the declared value reaches the witness in both engines
        if w.op.startswith("op-"):
            assert w.summary["applied"] == applied.get(classes[int(w.op[3:])], 1)


def test_engines_agree_on_a_synthetic_ledger_with_injected_invariant_breaks(spark_engine: Any, tmp_path: Path) -> None:
    run = synth_run(tmp_path / "synth", 60_000, seed=5, anomaly_rate=0.03)
    truth = json.loads((run / "manifest.json").read_text())["ground_truth"]
    assert truth["invariant-broken"] > 0
    assert truth["duplicate-output"] > 0
    contract = contract_of(run)
    spark, session = spark_engine
    local = checker.check_run(run, contract)
    remote = spark.check_run(run, contract, spark=session)
    assert compare_verdicts(local, remote) == []
    assert remote.found() == {k: n for k, n in truth.items() if n}
    (w,) = [w for w in remote.witnesses if w.anomaly == "invariant-broken"][:1]
    assert explain(w) == f"net of the op's moves = 1, expected 0 for op {w.op}"


def test_the_spark_summary_packed_is_the_plain_one(spark_engine: Any, tmp_path: Path) -> None:
    """Spark adds its counts up two to a 64-bit sum: every row must be the plain summary's, a count
    past 16 bits included (one operation's 70,000 redeliveries)."""
    from pyspark.sql import functions as F

    from harness.verify import model
    from harness.verify.spark import job

    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as d, LedgerWriter(ledger, "worker-1") as w, w.batch():
        for counted in (*model.COUNTS.values(), Kind.ALERT, Kind.RESIDUE_OUTBOX):
            w.emit(counted, op="every-kind", attempt=1)
        for _ in range(70_000):
            w.emit(Kind.DELIVER, op="redelivered", attempt=2)
        for i in range(100):
            d.emit(Kind.SUBMIT, op=f"op-{i}")
            w.emit(Kind.DELIVER, op=f"op-{i}", attempt=1 + i % 3)
            w.emit(Kind.RESIDUE_EFFECT, op=f"op-{i}")
            d.emit(Kind.DOWNSTREAM, op=f"op-{i}")
    compact(ledger)
    _, session = spark_engine
    events, table, layout = job.load_events(session, ledger)
    try:
        plain, _ = job.summarize(events, FlowContract())
        packed, _ = job.summarize(events, FlowContract(), rows=int(layout["events"]))
        assert sorted(packed.columns) == sorted(plain.columns)
        packed = packed.select(*plain.columns)
        assert packed.exceptAll(plain).count() == 0
        assert plain.exceptAll(packed).count() == 0
        counts = list(sql.packed_counts(sql.SPARK_PACKED)[1])
        sums = packed.agg(*(F.sum(c).alias(c) for c in counts)).collect()[0].asDict()
        assert sums["redeliveries"] == 70_000 + 66  # i % 3 > 0 for 66 of the 100
        assert {c for c, n in sums.items() if not n} == set()  # every count has events to count
    finally:
        session.sql(f"DROP TABLE IF EXISTS {table}")
