"""The in-process engine: evaluates ``model.py`` on a ledger with DuckDB; the only duckdb importer.

It runs the SQL that ``sql.py`` generates from the model (the text Spark runs too) straight over
the compacted ledger's Parquet parts, streaming: the events are never loaded whole, and the
operation summary is held only by the aggregate it feeds (``_one_pass``; stored once, in DuckDB's
compressed temporary storage, when more fault windows than ``MASK_WINDOWS`` need a range join);
both spill to disk past ``MEMORY_LIMIT``, so a ledger larger than RAM verifies in bounded memory.
A folder with only live segments (or an older layout) is read through ``read_ledger`` into Arrow
first when they are small; past ``COMPACT_ABOVE_BYTES`` they are compacted first (as the Spark engine does: the
compaction streams), so a run whose closing compaction never happened still verifies in bounded
memory. Everything after the small aggregates is ``assemble.py``, shared with the Spark engine.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from harness.errors import ConfigError
from harness.interrupts import interruptible
from harness.ledger.layout import LAYOUT_VERSION, kind_codes, read_layout, recorded_requests, writer_counts
from harness.ledger.reader import PARQUET_NAME, compact, read_ledger, segments_bytes, with_op_bucket
from harness.ledger.schema import COLUMNS
from harness.verify import fired, sql
from harness.verify.assemble import (
    CHAIN_ORDER,
    MAX_WITNESS_EVENTS,
    WITNESS_COLUMNS,
    WITNESSES_PER_CLASS,
    Aggregates,
    FaultWindow,
    Laps,
    add_window_sets,
    build_witnesses,
    make_verdict,
    pair_fault_windows,
)
from harness.verify.evidence import gather
from harness.verify.model import COUNTS, DELIVERY_HIST_CAP, FlowContract, judged_rules
from harness.verify.verdict import Verdict

__all__ = [
    "MAX_WITNESS_EVENTS",
    "WITNESSES_PER_CLASS",
    "check_events",
    "check_run",
    "check_table",
    "connect",
    "floor_counts",
    "witnesses",
]

# DuckDB's own buffer pool; past it the summary and the sorts spill to a temporary folder. The
# process's whole footprint stays under 1 GB at 100M events (docs/benchmarks.md).
MEMORY_LIMIT = "384MB"
# Segments larger than this (all together) are compacted before they are judged, not read whole:
# an event read into Arrow takes about 200 bytes, in JSON about 300.
COMPACT_ABOVE_BYTES = 64 << 20
D = sql.DUCKDB_PACKED  # the floor (``floor_counts``) is the plain ``sql.DUCKDB``
CHAIN_COLUMNS = ", ".join(f'e."{c}"' for c in COLUMNS)  # "offset" is a keyword


@contextmanager
def connect(threads: int | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """Yield an in-memory DuckDB connection with bounded memory that spills to a temporary folder
    (removed on exit)."""
    with tempfile.TemporaryDirectory(prefix="txchaos-duckdb-") as spill:
        config: dict[str, Any] = {
            "memory_limit": MEMORY_LIMIT,
            "temp_directory": spill,
            "threads": threads or os.cpu_count() or 2,
            "preserve_insertion_order": False,
        }
        con = duckdb.connect(config=config)
        con.execute("SET enable_progress_bar = false")  # a verification prints its verdict, not progress
        try:
            with interruptible(con.interrupt):  # a termination stops the query running, not after it
                yield con
        finally:
            con.close()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


Writers = dict[tuple[str, int, str, bool], tuple[int, int, int]]  # Aggregates.writers


def _source(con: duckdb.DuckDBPyConnection, ledger_dir: Path) -> dict[str, Any]:
    """Make the view ``ev``: the compacted Parquet parts when they have the current layout, else
    ``read_ledger``'s table with the derived columns the SQL reads; return the layout when the
    parts are read (what it recorded at compaction need not be selected again), else {}."""
    parquet = ledger_dir / PARQUET_NAME
    layout = read_layout(parquet) if parquet.is_dir() else None
    current = layout is not None and layout.get("layout", 1) >= LAYOUT_VERSION
    if not current and segments_bytes(ledger_dir) > COMPACT_ABOVE_BYTES:
        compact(ledger_dir)
        layout, current = read_layout(parquet), True
    if layout is not None and current:
        parts = sorted(str(p) for p in parquet.glob("*.parquet"))
        if parts:
            files = "[" + ", ".join(_quote(p) for p in parts) + "]"
            con.execute(f"CREATE VIEW ev AS SELECT * FROM read_parquet({files})")
            return layout
    _register(con, read_ledger(ledger_dir))
    return {}


def _register(con: duckdb.DuckDBPyConnection, events: pa.Table) -> None:
    """Register an Arrow table of ``COLUMNS`` as ``ev``, with ``op_bucket``, ``op_id`` and ``kind_code``."""
    table = with_op_bucket(events.select(list(COLUMNS)))
    table = table.append_column("kind_code", kind_codes(table["kind"]))
    con.register("ev_arrow", table)
    con.execute("CREATE VIEW ev AS SELECT * FROM ev_arrow")


def _dicts(con: duckdb.DuckDBPyConnection, query: str) -> list[dict[str, Any]]:
    cur = con.execute(query)
    names = [c[0] for c in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _windows_table(con: duckdb.DuckDBPyConnection, windows: list[FaultWindow]) -> None:
    rows = ", ".join(f"({i}, {w.start_ns}, {w.end})" for i, w in enumerate(windows))
    con.execute("CREATE TEMP TABLE win (i INTEGER, s BIGINT, e BIGINT)")
    if rows:
        con.execute(f"INSERT INTO win VALUES {rows}")


def _writers(con: duckdb.DuckDBPyConnection) -> Writers:
    rows = con.execute(
        "SELECT src, pid, kind, op IS NOT NULL AS has_op, count(*), min(seq), max(seq) FROM ev GROUP BY ALL"
    ).fetchall()
    return {(s, int(p), k, bool(h)): (int(n), int(lo), int(hi)) for s, p, k, h, n, lo, hi in rows}


# Up to this many fault windows the summary is never stored: one query streams it into every
# figure, the windows' included (a mask word per 63 windows, ``sql.window_masks``). Past it the
# summary is stored once and the windows are a range join over it, whose cost follows the overlaps.
MASK_WINDOWS = 64


def _one_pass(con: duckdb.DuckDBPyConnection, summary: str, flags: dict[str, str], masks: list[str]) -> dict[str, Any]:
    """Return every figure of the verdict over ``summary`` (a relation of operation rows) in one
    aggregate: totals, histograms (DuckDB's ``histogram``), each judged class's first
    ``WITNESSES_PER_CLASS`` op ids (``min(op_id, n)``) and, per mask word, the operations counted
    by (the windows they overlap, redelivered or not, the classes they show)."""
    sums = ", ".join(f"sum({n}) AS {n}" for n in COUNTS)
    hits = "".join(f", sum({f}) AS {f}" for f in flags.values())
    picks = "".join(f", min(op_id, {WITNESSES_PER_CLASS}) FILTER (WHERE {f} = 1) AS p_{f}" for f in flags.values())
    shows = " + ".join(f"{f} * {1 << i}" for i, f in enumerate(flags.values())) or "0"
    redelivered = "CAST(redeliveries > 0 AS INT)"
    sets = "".join(
        f", histogram(struct_pack(m := _m{j}, r := {redelivered}, f := _f)) FILTER (WHERE _m{j} <> 0) AS o{j}"
        for j in range(len(masks))
    )
    words = "".join(f", {m} AS _m{j}" for j, m in enumerate(masks))
    return _dicts(
        con,
        f"SELECT count(*) AS ops, {sums}{hits}, sum(redeliveries) AS redeliveries, "
        f"count(*) FILTER (WHERE redeliveries > 0) AS redelivered_ops, max(deliveries) AS max_d, "
        "sum(greatest(downstream - 1, 0)) AS dup_down, max(lat_us) AS lat_max, sum(skew) AS skew, "
        f"histogram(least(deliveries, {DELIVERY_HIST_CAP})) AS hist, "
        f"histogram(lat_bucket) FILTER (WHERE lat_us IS NOT NULL) AS lat{picks}{sets} "
        f"FROM (SELECT *, {shows} AS _f{words} FROM {summary}) s",
    )[0]


def _mask_overlays(top: dict[str, Any], flags: dict[str, str], words: int) -> dict[int, dict[str, int]]:
    """Return window index -> its figures, added up from ``_one_pass``'s sets of windows."""
    sets = []
    for j in range(words):
        found = top[f"o{j}"] or {"key": [], "value": []}  # a MAP of STRUCT keys comes as two lists
        for key, n in zip(found["key"], found["value"], strict=True):
            sums = {"ops": n, "redelivered_ops": n * key["r"]}
            sums |= {cls: n * (key["f"] >> i & 1) for i, cls in enumerate(flags)}
            sets.append((sql.mask_bits(int(key["m"]), j), sums))
    return add_window_sets(sets)


def _joined_overlays(
    con: duckdb.DuckDBPyConnection, summary: str, flags: dict[str, str], windows: list[FaultWindow]
) -> dict[int, dict[str, int]]:
    """Return window index -> its figures: a range join of the stored summary with the windows."""
    hits = "".join(f", sum({f}) AS {f}" for f in flags.values())
    _windows_table(con, windows)
    rows = _dicts(
        con,
        "SELECT w.i AS i, count(*) AS ops, count(*) FILTER (WHERE redeliveries > 0) AS redelivered_ops"
        f"{hits} FROM {summary} JOIN win w ON first_ns <= w.e AND last_ns >= w.s GROUP BY w.i",
    )
    return {
        int(r["i"]): {"ops": int(r["ops"]), "redelivered_ops": int(r["redelivered_ops"])}
        | {cls: int(r[f]) for cls, f in flags.items()}
        for r in rows
    }


def _aggregates(
    con: duckdb.DuckDBPyConnection, summary_sql: str, judged: list[str], windows: list[FaultWindow], writers: Writers
) -> tuple[Aggregates, list[tuple[str, int]]]:
    """Return the aggregates and each judged class's witnesses (class, op_id), first in op_id order."""
    flags = {cls: sql.flag_column(cls) for cls in judged}
    few = len(windows) <= MASK_WINDOWS
    if few:
        summary = f"({summary_sql})"
        masks = sql.window_masks([(w.start_ns, w.end) for w in windows])
    else:
        con.execute(f"CREATE TEMP TABLE summary AS {summary_sql}")
        summary, masks = "summary", []
    top = _one_pass(con, summary, flags, masks)
    overlays = _mask_overlays(top, flags, len(masks)) if few else _joined_overlays(con, summary, flags, windows)

    def num(name: str) -> int:
        return int(top[name] or 0)

    agg = Aggregates(
        writers=writers,
        operations=num("ops"),
        totals={n: num(n) for n in COUNTS},
        anomalies={cls: num(f) for cls, f in flags.items()},
        redeliveries=num("redeliveries"),
        redelivered_ops=num("redelivered_ops"),
        max_deliveries=num("max_d"),
        duplicate_downstream=num("dup_down"),
        deliveries_hist={int(h): int(n) for h, n in sorted((top["hist"] or {}).items())},
        latency_hist={int(b): int(n) for b, n in sorted((top["lat"] or {}).items())},
        latency_max_us=None if top["lat_max"] is None else int(top["lat_max"]),
        clock_skew_ops=num("skew"),
        overlays=overlays,
    )
    picks = [(cls, i) for cls, f in flags.items() for i in sorted(int(i) for i in top[f"p_{f}"] or ())]
    return agg, picks


def _witness_rows(
    con: duckdb.DuckDBPyConnection, contract: FlowContract, ids: list[int]
) -> tuple[dict[int, dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Return op_id -> the operation's summary figures (``WITNESS_COLUMNS``) and op_id -> its first
    ``MAX_WITNESS_EVENTS`` events in ``CHAIN_ORDER`` (``COLUMNS``, in no order), for the operations
    ``ids`` of the view ``ev``.

    Their events are fetched once; the figures are the summary's own SQL run over them alone.
    """
    if not ids:
        return {}, {}
    # A join with a table of the ids, not an IN list: DuckDB pushes the join's filter into the
    # Parquet scan, and at 10M events the fetch took 0.30 s against 0.72 s for the IN list.
    con.execute(f"CREATE OR REPLACE TEMP TABLE wit AS SELECT unnest([{', '.join(map(str, ids))}])::BIGINT AS i")
    con.execute("CREATE OR REPLACE TEMP TABLE wit_ev AS SELECT e.* FROM ev e JOIN wit ON e.op_id = wit.i")
    cols = ", ".join(WITNESS_COLUMNS)
    measured = sql.summary_query("wit_ev", contract, D, keys="op_id", judged={})
    figures = {int(r.pop("op_id")): r for r in _dicts(con, f"SELECT op_id, {cols} FROM ({measured}) s")}
    # only the events a chain shows: a poison message redelivered without end has millions
    first = f"row_number() OVER (PARTITION BY op_id ORDER BY {', '.join(CHAIN_ORDER)}) AS _n"
    chain = f"SELECT * FROM (SELECT *, {first} FROM wit_ev) e WHERE _n <= {MAX_WITNESS_EVENTS}"
    chains: dict[int, list[dict[str, Any]]] = {}
    for e in _dicts(con, f"SELECT e.op_id, {CHAIN_COLUMNS} FROM ({chain}) e"):
        chains.setdefault(int(e.pop("op_id")), []).append(e)
    return figures, chains


def _witnesses(
    con: duckdb.DuckDBPyConnection, contract: FlowContract, picks: list[tuple[str, int]], windows: list[FaultWindow]
) -> tuple[Any, ...]:
    """Return the witnesses of ``picks`` (class, op_id) of the view ``ev``, in (class, op) order,
    with their chains. ``op_id`` orders as the operation ids do, so both engines pick alike."""
    figures, chains = _witness_rows(con, contract, sorted({i for _, i in picks}))
    flagged = [figures[i] | {"anomaly": cls, "op": chains[i][0]["op"]} for cls, i in picks]
    return build_witnesses(flagged, {events[0]["op"]: events for events in chains.values()}, windows)


def witnesses(
    ledger_dir: Path, contract: FlowContract, picks: list[tuple[str, int]], windows: list[FaultWindow]
) -> tuple[Any, ...]:
    """Return ``_witnesses`` of ``picks`` from the compacted ledger in ``ledger_dir``: for the Spark
    engine, whose witnesses are a point lookup in files its driver reads too (a lookup Spark's scan
    cannot skip to: its filter runs on every row, 1.7 s at 10M events against DuckDB's 0.3 s, whose
    join filter skips the row groups and rows of no witness)."""
    layout = read_layout(ledger_dir / PARQUET_NAME)
    if layout is None or layout.get("layout", 1) < LAYOUT_VERSION:
        raise ConfigError(
            f"{ledger_dir} holds no compacted ledger of layout {LAYOUT_VERSION}",
            hint="compact it first (`harness.ledger.reader.compact`; the Spark job's `load_events` does)",
        )
    with connect() as con:
        _source(con, ledger_dir)
        return _witnesses(con, contract, picks, windows)


def check_events(
    con: duckdb.DuckDBPyConnection,
    contract: FlowContract,
    *,
    snapshot: bool = True,
    intact: bool = True,
    phases: dict[str, float] | None = None,
    layout: dict[str, Any] | None = None,
) -> tuple[Aggregates, tuple[Any, ...], list[FaultWindow], int, list[dict[str, Any]]]:
    """Run the reconciliation over the view ``ev``; return aggregates, witnesses, windows, unmatched
    fault ends and the fault rows (``fired``). ``phases`` (when given) receives each step's seconds;
    ``layout``: the compacted ledger's, whose writer counts and fault requests are taken as recorded."""
    lap = Laps(phases)
    layout = layout or {}
    writers = writer_counts(layout)
    fault_rows = _fault_rows(con, recorded_requests(layout))
    windows, unmatched = pair_fault_windows(fault_rows)
    lap("faults_s")
    judged = judged_rules(contract, snapshot=snapshot, intact=intact)
    per_key = ""
    if contract.per_key:
        con.execute(f"CREATE TEMP TABLE per_key AS {sql.per_key_query('ev', D)}")
        per_key = "per_key"
    (rows,) = con.execute("SELECT count(*) FROM ev").fetchone() or (0,)  # Parquet: from the footers
    d = sql.packing(D, sql.DUCKDB, rows)
    summary = sql.summary_query("ev", contract, d, keys="op_id", judged=judged, per_key=per_key)
    agg, picks = _aggregates(con, summary, list(judged), windows, _writers(con) if writers is None else writers)
    lap("summary_s")
    witnesses = _witnesses(con, contract, picks, windows)
    lap("chains_s")
    return agg, witnesses, windows, unmatched, fault_rows


def _fault_rows(con: duckdb.DuckDBPyConnection, recorded: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    cols = ", ".join(fired.COLUMNS)
    return fired.select_rows(lambda kinds: _dicts(con, f"SELECT {cols} FROM ev WHERE {sql.is_kind(*kinds)}"), recorded)


def _verdict(
    con: duckdb.DuckDBPyConnection,
    contract: FlowContract,
    scenario: str,
    seed: int | None,
    snapshot: bool,
    intact: bool,
    layout: dict[str, Any] | None = None,
) -> Verdict:
    started = time.perf_counter()
    phases: dict[str, float] = {}
    agg, witnesses, windows, unmatched, fault_rows = check_events(
        con, contract, snapshot=snapshot, intact=intact, phases=phases, layout=layout
    )
    timing = {"job_s": round(time.perf_counter() - started, 4), **phases}
    return make_verdict(
        agg,
        witnesses,
        windows,
        unmatched,
        engine="in-process",
        scenario=scenario,
        seed=seed,
        timing=timing,
        fault_rows=fault_rows,
    )


def floor_counts(run_dir: Path, contract: FlowContract) -> dict[str, int]:
    """Return anomaly class -> count from one plain DuckDB query of the rules over ``run_dir``'s ledger.

    The benchmark's floor for this engine: the same summary and rules written plainly (``sql.DUCKDB``,
    not the engine's packed counts), with no statistics, fault overlay, writer check or witness chains.
    """
    judged = judged_rules(contract)
    flags = ", ".join(f"sum({sql.flag_column(c)}) AS {sql.flag_column(c)}" for c in judged)
    with connect() as con:
        _source(con, run_dir / "ledger")
        query = sql.summary_query("ev", contract, sql.DUCKDB, keys="op_id", judged=judged)
        row = _dicts(con, f"SELECT {flags} FROM ({query}) s")[0]
    return {c: int(row[sql.flag_column(c)] or 0) for c in judged}


def check_table(
    events: pa.Table,
    contract: FlowContract,
    *,
    scenario: str = "",
    seed: int | None = None,
    snapshot: bool = True,
    intact: bool = True,
) -> Verdict:
    """Return the verdict for a ledger table, judging the classes ``model.judged_rules`` allows."""
    with connect() as con:
        _register(con, events)
        return _verdict(con, contract, scenario, seed, snapshot, intact)


def check_run(run_dir: Path, contract: FlowContract, *, scenario: str = "", seed: int | None = None) -> Verdict:
    """Return the verdict for the ledger in ``run_dir/ledger``; an incomplete or damaged folder gets an
    ``incomplete`` verdict that judges only what its evidence can decide (see ``evidence.py``)."""
    evidence = gather(run_dir)
    with connect() as con:
        layout = _source(con, run_dir / "ledger")
        verdict = _verdict(con, contract, scenario, seed, evidence.closed, evidence.intact, layout)
    return evidence.apply(verdict, contract)
