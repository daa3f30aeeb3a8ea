"""The Spark engine's job: evaluates ``model.py`` on a run's compacted ledger through the DataFrame API.

The job reads ``events.parquet/`` as a table bucketed by ``op_bucket`` (see ``ledger/layout.py``),
so the per-operation summary is computed bucket by bucket with no shuffle, grouping by the integer
``op_id`` and testing the integer ``kind_code``. Only small results reach the driver: per-writer and
per-latency-bucket aggregates, fault events, and the bounded witnesses' op ids, whose events the
driver then looks up in the same files (``checker.witnesses``: Spark's filter runs on every row
it scans, DuckDB's join skips what holds no witness). It uses the DataFrame and SQL
API only, so a local driver and a Spark Connect client run it alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from harness.errors import ConfigError
from harness.ledger.layout import (
    KIND_CODES,
    LAYOUT_VERSION,
    PARQUET_SCHEMA,
    read_layout,
    recorded_requests,
    writer_counts,
)
from harness.ledger.reader import PARQUET_NAME, compact
from harness.ledger.schema import Kind
from harness.verify import assemble, checker, fired, model, sql
from harness.verify.spark.session import Session
from harness.verify.verdict import Witness

KEYS = ["op_bucket", "op_id"]  # the summary's group-by: op_bucket first, so the bucketed scan needs no shuffle
_SPARK_TYPES = {"int8": "tinyint", "int32": "int", "int64": "bigint", "string": "string"}
SPARK_DDL = ", ".join(f"`{f.name}` {_SPARK_TYPES[str(f.type)]}" for f in PARQUET_SCHEMA)


def is_kind(*kinds: Kind) -> Column:
    """Return ``kind in kinds`` as a test of the integer ``kind_code``."""
    codes = [KIND_CODES[str(k)] for k in kinds]
    col: Column = F.col("kind_code") == codes[0] if len(codes) == 1 else F.col("kind_code").isin(*codes)
    return col


def to_spark(pred: model.Pred) -> Column:
    """Translate a model predicate into a Spark Column: the SQL text ``sql.predicate`` gives DuckDB too."""
    return F.expr(sql.predicate(pred))


def load_events(spark: Session, ledger_dir: Path) -> tuple[DataFrame, str, dict[str, Any]]:
    """Return the events as a bucketed table, the temporary table's name to drop afterwards, and
    the layout (``srcs``: ``src_code`` -> ``src``; ``writers``: the counts made at compaction).

    A ledger compacted by an older layout (without ``op_id``) is compacted again from its segments.
    """
    parquet = ledger_dir / PARQUET_NAME
    layout = read_layout(parquet) if parquet.is_dir() else None
    if layout is None or layout.get("layout", 1) < LAYOUT_VERSION or "srcs" not in layout:
        if not (ledger_dir / "segments").is_dir():
            found = "an older compacted layout" if parquet.exists() else "no ledger"
            raise ConfigError(
                f"{ledger_dir} holds {found} and no segments to compact",
                hint="pass a run folder holding ledger/segments, or make a new synthetic one with "
                "`txchaos ledger synth --events N --out DIR`",
            )
        compact(ledger_dir)
        layout = read_layout(parquet)
        assert layout is not None
    # a catalog table is the only way to tell Spark the files are bucketed, so it skips the shuffle
    name = f"ledger_{uuid.uuid4().hex[:12]}"
    spark.sql(
        f"CREATE TABLE {name} ({SPARK_DDL}) USING parquet CLUSTERED BY (op_bucket) "
        f"INTO {int(layout['n_buckets'])} BUCKETS LOCATION '{parquet.resolve().as_uri()}'"
    )
    return spark.table(name), name, layout


def per_key_counts(events: DataFrame) -> DataFrame:
    """Return (op_id, ``model.PER_KEY_COLUMNS``...) from the ledger's per-key view: ``sql.per_key_query``,
    the query the in-process engine runs."""
    view = f"ev_{uuid.uuid4().hex[:12]}"
    events.createOrReplaceTempView(view)
    return events.sparkSession.sql(sql.per_key_query(view, sql.SPARK))


def op_measures(contract: model.FlowContract, d: sql.Dialect = sql.SPARK) -> dict[str, Column]:
    """Return summary column -> its aggregate over one operation's events (unaliased):
    ``sql.measures``, the text the in-process engine runs (a packed dialect's sums for its counts)."""
    return {n: F.expr(m) for n, m in sql.measures(contract, d).items()}


def summarize(
    events: DataFrame,
    contract: model.FlowContract,
    *,
    snapshot: bool = True,
    intact: bool = True,
    rows: int | None = None,
) -> tuple[DataFrame, dict[str, str]]:
    """Return the operation summary with one 0/1 flag column per judged class, and class -> flag column.

    ``rows``: the ledger's event count; when known and small enough, the counts are packed (``sql.SPARK_PACKED``).
    """
    d = sql.SPARK if rows is None else sql.packing(sql.SPARK_PACKED, sql.SPARK, rows)
    aggs = [m.alias(n) for n, m in op_measures(contract, d).items()]
    summary = events.where(F.col("op_id").isNotNull()).groupBy(*KEYS).agg(*aggs)
    if d.packed:  # the counts out of their sums, and the sums the contract leaves out (0)
        after = (F.expr(e).alias(n) for n, e in sql.unpacked(contract, d).items())
        summary = summary.select("*", *after).drop(*sql.packed_counts(d)[0])
    if contract.per_key:  # a join (a shuffle) only for the runs that carry per-key data
        summary = summary.join(per_key_counts(events), "op_id", "left").fillna(0, subset=list(model.PER_KEY_COLUMNS))
    judged = model.judged_rules(contract, snapshot=snapshot, intact=intact)
    flags = {cls: sql.flag_column(cls) for cls in judged}
    for cls, pred in judged.items():
        summary = summary.withColumn(flags[cls], F.expr(f"CASE WHEN {sql.predicate(pred)} THEN 1 ELSE 0 END"))
    lat_us = F.expr(sql.latency_us(sql.SPARK))
    summary = summary.withColumn("lat_us", lat_us).withColumn("lat_bucket", F.expr(sql.latency_bucket("lat_us")))
    diff = F.col("downstream_ns") - F.col("submit_ns")
    return summary.withColumn("skew", F.when(diff < 0, 1).otherwise(0)), flags


CASE_WINDOWS = 64  # up to this many windows, a test per window; beyond, the time-slot join
MASK_W = -1000  # w of an operation's mask row for its first word of windows; the next word's is MASK_W - 1, ...
SLOT_KEY = 1 << 40  # exploded values from here on are time slots (plus this), not window indices
SLOT_MIN_S, SLOT_MAX_S = 1.0, 60.0  # bounds of a time slot's width (the windows' median length)


@dataclass(frozen=True)
class _Slots:
    """Time cut into slots of ``width`` ns from ``t0``: slot 0 takes everything before, slot ``last``
    everything after the last bound a window has, so a window still open at the end touches a
    bounded number of slots. ``rows``: (slot, window index, start, end, the window's first slot)
    for each slot a window touches."""

    t0: int
    width: int
    last: int
    rows: list[tuple[int, int, int, int, int]]

    @classmethod
    def plan(cls, windows: list[assemble.FaultWindow]) -> _Slots:
        """Cut time for ``windows``: a slot is as wide as their median length, within the bounds."""
        starts = [w.start_ns for w in windows]
        bounds = starts + [w.end_ns for w in windows if w.end_ns is not None]
        lengths = sorted(w.end_ns - w.start_ns for w in windows if w.end_ns is not None)
        median_s = lengths[len(lengths) // 2] / 1e9 if lengths else SLOT_MIN_S
        width = int(min(SLOT_MAX_S, max(SLOT_MIN_S, median_s)) * 1e9)
        t0 = min(starts)
        last = (max(bounds) - t0) // width + 1

        def slot(t: int) -> int:
            return min(last, max(0, (t - t0) // width))

        rows = [
            (s, i, w.start_ns, w.end, slot(w.start_ns))
            for i, w in enumerate(windows)
            for s in range(slot(w.start_ns), slot(w.end) + 1)
        ]
        return cls(t0, width, last, rows)

    def of(self, ts: Column) -> Column:
        """Return the slot of the timestamp column ``ts``."""
        slot = F.floor((ts - F.lit(self.t0)) / F.lit(self.width))
        return F.least(F.lit(self.last), F.greatest(F.lit(0), slot)).cast("long")


def _overlaps(rows: DataFrame, slots: _Slots) -> DataFrame:
    """Turn the exploded time-slot rows of ``rows`` into one row per (operation, window it overlaps).

    A broadcast equi-join on the slot finds the windows an operation may overlap; the pair is kept
    where the spans overlap, once: in the first slot both share. A row that is no slot row (the
    base row, an anomaly row) passes through the left join unchanged.
    """
    table = rows.sparkSession.createDataFrame(slots.rows, "_s long, _wi long, _ws long, _we long, _w0 long")
    slot = F.when(F.col("w") >= SLOT_KEY, F.col("w") - SLOT_KEY)
    joined = rows.withColumn("_slot", slot).join(F.broadcast(table), F.col("_slot") == F.col("_s"), "left")
    first, last = F.col("first_ns"), F.col("last_ns")
    shared = F.greatest(slots.of(first), F.col("_w0"))
    pair = (first <= F.col("_we")) & (last >= F.col("_ws")) & (F.col("_slot") == shared)
    kept = joined.where(F.col("_slot").isNull() | pair)
    out = kept.withColumn("w", F.when(F.col("_slot").isNull(), F.col("w")).otherwise(F.col("_wi")))
    return out.drop("_slot", "_s", "_wi", "_ws", "_we", "_w0")


def _is_anomaly_row(w: Column) -> Column:
    return (w <= -2) & (w > MASK_W)


def _aggregate(summary: DataFrame, flags: dict[str, str], windows: list[assemble.FaultWindow]) -> list[dict[str, Any]]:
    """Return the summary aggregated by latency bucket, by fault window, and the witnesses' bitmaps.

    One pass: each operation row is exploded into its base row (w = -1, k = latency bucket), rows
    for the fault windows its span overlaps, and one row per anomaly it shows (w = -2 - class
    index, k = op_id div 64, ``bits`` its bit in that block of 64 operations). Up to
    ``CASE_WINDOWS`` windows, an operation tests each and gives one row per word of
    ``sql.MASK_BITS`` windows it overlaps any of (w = ``MASK_W`` - word, k = the bits of those it
    overlaps): operations group by the set of windows they overlap, few sets for many operations,
    and the driver adds each set's sums to each of its windows (a row per window an operation
    overlapped, from an array of every window's test per operation, made the warm summary of 100M
    events and 60 windows 29-34 s against 17.6-18.1 s). Beyond, ``_overlaps``: one row per
    time slot the span touches, joined to the windows in that slot (w >= 0: the window), whose cost
    follows the overlaps. Everything is summed by (w, k); of each class's anomaly rows only its
    first ``assemble.WITNESSES_PER_CLASS`` blocks in op_id order reach the driver: they hold every
    witness kept, whatever the anomaly count.
    """
    first, last = F.col("first_ns"), F.col("last_ns")
    # -99 is "no row": array_remove drops it in compiled code; a filter lambda is interpreted and
    # array_except builds a hash set per operation (at 60 fault windows: 2.3 s vs 8.7 s per 10M events)
    none = -99
    shows = [F.when(F.col(c) == 1, -2 - model.ANOMALY_CLASSES.index(cls)).otherwise(none) for cls, c in flags.items()]
    few = len(windows) <= CASE_WINDOWS
    words_of = [F.expr(m) for m in sql.window_masks([(w.start_ns, w.end) for w in windows])] if few else []
    masks = [f"_m{j}" for j in range(len(words_of))]
    if masks:
        summary = summary.select("*", *[m.alias(n) for m, n in zip(words_of, masks, strict=True)])
    words = [F.when(F.col(n) != 0, MASK_W - j).otherwise(none) for j, n in enumerate(masks)]
    w_col = F.array(F.lit(-1), *words, *shows)
    if windows and not few:
        slots = _Slots.plan(windows)
        spans = F.sequence(slots.of(first) + SLOT_KEY, slots.of(last) + SLOT_KEY)
        no_span = F.array().cast("array<long>")
        w_col = F.concat(w_col.cast("array<long>"), F.when(first.isNotNull(), spans).otherwise(no_span))
    rows = summary.select(F.explode(F.array_remove(w_col, none)).alias("w"), "*")
    if windows and not few:
        rows = _overlaps(rows, slots)
    w, d = F.col("w"), F.col("deliveries")
    capped = F.least(d, F.lit(model.DELIVERY_HIST_CAP))
    aggs = [F.count(F.lit(1)).alias("ops"), F.sum("events").alias("events")]
    aggs += [F.sum(n).alias(n) for n in model.COUNTS]
    aggs += [F.sum(c).alias(c) for c in flags.values()]
    aggs += [
        F.sum("redeliveries").alias("redeliveries"),
        F.sum(F.when(F.col("redeliveries") > 0, 1).otherwise(0)).alias("redelivered_ops"),
        F.max(d).alias("max_deliveries"),
        F.sum(F.greatest(F.col("downstream") - 1, F.lit(0))).alias("dup_down"),
        F.max("lat_us").alias("lat_max"),
        F.sum("skew").alias("skew"),
    ]
    aggs.append(F.bit_or(F.when(_is_anomaly_row(w), F.expr("shiftleft(1L, int(op_id % 64))"))).alias("bits"))
    key = F.when(w == -1, F.col("lat_bucket")).when(_is_anomaly_row(w), F.expr("op_id div 64"))
    for j, n in enumerate(masks):
        key = key.when(w == MASK_W - j, F.col(n))
    # deliveries per op (capped) is a third key of the base rows, not eleven conditional sums
    grouped = rows.groupBy("w", key.alias("k"), F.when(w == -1, capped).alias("h")).agg(*aggs)
    in_order = Window.partitionBy(w).orderBy("k")  # a block holds at least one witness of its class
    kept = grouped.withColumn("_n", F.row_number().over(in_order)).where(
        ~_is_anomaly_row(w) | (F.col("_n") <= assemble.WITNESSES_PER_CLASS)
    )
    return [r.asDict() for r in kept.drop("_n").collect()]


def _witness_ids(rows_all: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Return each class's first ``assemble.WITNESSES_PER_CLASS`` (class index, op_id) pairs from the
    anomaly rows' bitmaps.

    ``op_id`` orders as the operation ids do, so this is the in-process engine's choice too.
    """
    blocks = sorted((-2 - int(r["w"]), int(r["k"]), int(r["bits"])) for r in rows_all if MASK_W < r["w"] <= -2)
    out: dict[int, list[tuple[int, int]]] = {}
    for cls, block, bits in blocks:
        out.setdefault(cls, []).extend((cls, block * 64 + b) for b in range(64) if bits >> b & 1)
    return [pair for cls in sorted(out) for pair in out[cls][: assemble.WITNESSES_PER_CLASS]]


Writers = dict[tuple[str, int, str, bool], tuple[int, int, int]]  # assemble.Aggregates.writers


def _writers(events: DataFrame, srcs: list[str]) -> Writers:
    """Return (src, pid, kind, True) -> count and lowest and highest seq, grouping by integer codes
    (a ledger compacted before the layout recorded them; ``has_op`` is not told apart)."""
    counts = [F.count(F.lit(1)).alias("n"), F.min("seq").alias("lo"), F.max("seq").alias("hi")]
    rows = events.groupBy("src_code", "pid", "kind_code").agg(*counts).collect()
    names = list(KIND_CODES)
    known = [r for r in rows if r["kind_code"] >= 0]
    out = [r.asDict() | {"src": srcs[r["src_code"]], "kind": names[r["kind_code"]]} for r in known]
    if len(known) < len(rows):  # kinds this version does not know: count them under their own names
        unknown = events.where(F.col("kind_code") < 0).groupBy("src", "pid", "kind")
        out += [r.asDict() for r in unknown.agg(*counts).collect()]
    return {(r["src"], int(r["pid"]), r["kind"], True): (int(r["n"]), int(r["lo"]), int(r["hi"])) for r in out}


def _overlays(rows_all: list[dict[str, Any]], flags: dict[str, str]) -> dict[int, dict[str, int]]:
    """Return window index -> its operations, redelivered operations and anomalies: from a row per
    window (the time-slot join), or added up from the rows of each set of windows (the masks)."""
    sets = []
    for r in rows_all:
        w = int(r["w"])
        if w >= 0:
            hit = [w]
        elif w <= MASK_W:
            hit = sql.mask_bits(int(r["k"]), MASK_W - w)
        else:
            continue
        sums = {"ops": int(r["ops"]), "redelivered_ops": int(r["redelivered_ops"])}
        sets.append((hit, sums | {cls: int(r[c]) for cls, c in flags.items()}))
    return assemble.add_window_sets(sets)


def _combine(
    rows_all: list[dict[str, Any]], flags: dict[str, str], writers: Writers, *, scanned: bool
) -> assemble.Aggregates:
    rows = [r for r in rows_all if r["w"] == -1]

    def total(col: str) -> int:
        return sum(int(r[col] or 0) for r in rows)

    # scanned writers do not tell has_op apart: events of operations are counted per op, and what
    # is left over has no operation id
    without_op = sum(n for n, _, _ in writers.values()) - total("events") if scanned else None
    lat_rows = [r for r in rows if r["k"] is not None]
    hist: dict[int, int] = {}
    latency: dict[int, int] = {}
    for r in rows:
        hist[int(r["h"])] = hist.get(int(r["h"]), 0) + int(r["ops"])
        if r["k"] is not None:
            latency[int(r["k"])] = latency.get(int(r["k"]), 0) + int(r["ops"])
    overlays = _overlays(rows_all, flags)
    return assemble.Aggregates(
        writers=writers,
        operations=total("ops"),
        totals={n: total(n) for n in model.COUNTS},
        anomalies={cls: total(c) for cls, c in flags.items()},
        redeliveries=total("redeliveries"),
        redelivered_ops=total("redelivered_ops"),
        max_deliveries=max((int(r["max_deliveries"]) for r in rows), default=0),
        duplicate_downstream=total("dup_down"),
        deliveries_hist={k: hist[k] for k in sorted(hist) if hist[k]},
        latency_hist=latency,
        latency_max_us=max((int(r["lat_max"]) for r in lat_rows), default=None),
        clock_skew_ops=total("skew"),
        overlays=overlays,
        events_without_op=without_op,
    )


def check_events(
    spark: Session,
    ledger_dir: Path,
    contract: model.FlowContract,
    phases: dict[str, float] | None = None,
    *,
    snapshot: bool = True,
    intact: bool = True,
) -> tuple[assemble.Aggregates, tuple[Witness, ...], list[assemble.FaultWindow], int, list[dict[str, Any]]]:
    """Run the reconciliation job; return aggregates, witnesses, windows, unmatched fault ends and
    the rows of ``fired.KINDS`` (requested faults and their firings).

    ``phases`` (when given) receives the seconds each step took, for the benchmark; ``snapshot``
    and ``intact`` choose the judged classes (``model.judged_rules``).
    """
    lap = assemble.Laps(phases)
    events, table, layout = load_events(spark, ledger_dir)
    try:
        fault_rows = fired.select_rows(
            lambda kinds: [r.asDict() for r in events.where(is_kind(*kinds)).select(*fired.COLUMNS).collect()],
            recorded_requests(layout),  # an unarmed run then needs no pass for its faults
        )
        windows, unmatched = assemble.pair_fault_windows(fault_rows)
        lap("faults_s")
        recorded = writer_counts(layout)
        writers = _writers(events, list(layout["srcs"])) if recorded is None else recorded
        lap("writers_s")
        recorded_events = layout.get("events")
        summary, flags = summarize(
            events,
            contract,
            snapshot=snapshot,
            intact=intact,
            rows=recorded_events if isinstance(recorded_events, int) else None,
        )
        rows = _aggregate(summary, flags, windows)
        agg = _combine(rows, flags, writers, scanned=recorded is None)
        lap("summary_s")
        picks = [(model.ANOMALY_CLASSES[cls], op_id) for cls, op_id in _witness_ids(rows)]
        witnesses = checker.witnesses(ledger_dir, contract, picks, windows)
        lap("chains_s")
        return agg, witnesses, windows, unmatched, fault_rows
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")  # external table: drops the name, keeps the files
