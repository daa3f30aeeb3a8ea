"""The numbers behind a soak run's plot: per-second throughput and latency, faults, anomalies, crashes.

A soak ledger holds up to a million operations and several million events, so no event is walked
in Python: the compacted ledger's parts are read one at a time, a few columns and only the kinds
the plot needs (every event of an operation is in one part, ``ledger/layout.py``), and reduced to
one row per operation with pyarrow's group-by; the per-second series are numpy counts over those
rows. What comes out is plain data (frozen dataclasses of tuples), so the aggregation can be
tested exactly and ``soak_plots.py`` only draws it.

When an operation completes follows the verification model (``verify/model.py``): at its first
``downstream`` event (``FIRST_TS``, the event the verdict's latency runs to), or, in a flow without
downstream output (the ledger holds no ``downstream`` event at all), at its last commit (DB or
broker). Latency runs from the operation's first submit to its completion; an operation completed
before it was submitted has clocks that disagree and gets no latency, as in the verdict. An
operation the flow started itself (a saga's step: its submit recorded at the close, after its
commits) is left out of the series and counted apart (``by_flow``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.ledger.layout import KIND_CODES, kind_codes
from harness.ledger.reader import PARQUET_NAME, read_ledger
from harness.ledger.schema import Kind
from harness.reporting.plots import FaultWindow, fault_windows
from harness.verify.model import ANOMALY_CLASSES, FIRST_TS, SPAN_EXCLUDED

__all__ = ["AnomalyMarks", "SoakData", "SoakSeries", "Ticks", "op_times", "per_second", "place_anomalies", "soak_data"]

I64 = npt.NDArray[np.int64]
NS = 1_000_000_000
MAX_BUCKETS = 20_000  # a run longer than this many seconds gets wider buckets: the series stays small
TICK_SLOTS = 4_000  # crashes (restarts) closer than the plotted span / TICK_SLOTS make one tick
PERCENTILES = (50, 99)


def _codes(*kinds: Kind) -> pa.Array:
    return pa.array([KIND_CODES[str(k)] for k in kinds], pa.int8())


SUBMIT = _codes(Kind.SUBMIT)
DOWNSTREAM = _codes(FIRST_TS["downstream_ns"])
COMMITS = _codes(Kind.DB_COMMIT, Kind.BROKER_COMMIT)
SPANNED = _codes(*(k for k in Kind if k not in SPAN_EXCLUDED))  # the kinds an operation's first_ns reads
FAULTS = _codes(Kind.FAULT_START, Kind.FAULT_END)
# A restart is the supervisor's ``worker_exit``: it writes one for every process it starts again
# (txchaos's workers and a service's instances alike), so the plot counts what ``restarts`` counts,
# also for a worker that died before it could write its own ``worker_start``.
RUN_START, CRASH, WORKER_EXIT = _codes(Kind.RUN_START), _codes(Kind.CRASH), _codes(Kind.WORKER_EXIT)
CONTROL = pa.concat_arrays([RUN_START, CRASH, WORKER_EXIT, FAULTS])
OP_KINDS = pa.concat_arrays([SUBMIT, DOWNSTREAM, COMMITS])
SCANNED = pa.concat_arrays([OP_KINDS, CONTROL])
SCAN_COLUMNS = ("ts_ns", "kind_code", "op_id", "src_code", "point")
KIND_NAMES = pa.array(list(KIND_CODES), pa.string())


@dataclass(frozen=True)
class SoakSeries:
    """Operations per time bucket (``bucket_s`` seconds, 1 unless the run is very long).

    ``seconds`` are each bucket's start in seconds since the run started; ``submitted`` counts the
    operations first submitted in it, ``completed`` those completed in it, and ``p50_ms``/``p99_ms``
    are the nearest-rank percentiles of the latencies of the operations completed in it (None
    without one). ``skewed``: completed operations left out of the latencies (completed before
    they were submitted, by the writers' clocks).
    """

    seconds: tuple[int, ...]
    bucket_s: int
    submitted: tuple[int, ...]
    completed: tuple[int, ...]
    p50_ms: tuple[float | None, ...]
    p99_ms: tuple[float | None, ...]
    skewed: int = 0


@dataclass(frozen=True)
class AnomalyMarks:
    """Where one anomaly class's operations sit on the time axis: each flagged operation at its
    completion, or at its first event when it never completed (seconds since the run started, in
    order). ``unplaced``: flagged ids with no event in the run's span (a global invariant's id)."""

    cls: str
    seconds: tuple[float, ...]
    unplaced: int = 0

    @property
    def count(self) -> int:
        """Return how many operations the class flagged."""
        return len(self.seconds) + self.unplaced


@dataclass(frozen=True)
class Ticks:
    """Moments of one kind of event (seconds since the run started), merged when closer than the
    plot can show apart; ``total`` counts the events themselves."""

    seconds: tuple[float, ...] = ()
    total: int = 0


@dataclass(frozen=True)
class SoakData:
    """Everything the soak plot draws. ``completed_by`` names the event that completes an
    operation (``downstream`` or ``commit``); ``x_range`` spans the series and the fault windows."""

    t0_ns: int
    completed_by: str
    operations: int
    series: SoakSeries
    windows: tuple[FaultWindow, ...]
    anomalies: tuple[AnomalyMarks, ...]
    crashes: Ticks
    restarts: Ticks
    x_range: tuple[float, float]
    by_flow: int = 0  # operations the flow started itself, left out of ``operations`` and the series


def _np(values: pa.Array | pa.ChunkedArray) -> I64:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)


def op_times(events: pa.Table, key: str) -> pa.Table:
    """Reduce events (``ts_ns``, ``kind_code``, ``key``) to one row per ``key``: its first submit
    ``submit_ns``, first downstream ``down_ns``, last commit ``commit_ns`` and first event outside
    the model's ``SPAN_EXCLUDED`` kinds ``first_ns`` (each null when the operation has none)."""
    kind, ts, none = events["kind_code"], events["ts_ns"], pa.scalar(None, pa.int64())

    def when(codes: pa.Array) -> pa.ChunkedArray:
        return pc.if_else(pc.is_in(kind, value_set=codes), ts, none)

    table = pa.table(
        {
            "key": events[key],
            "submit_ns": when(SUBMIT),
            "down_ns": when(DOWNSTREAM),
            "commit_ns": when(COMMITS),
            "first_ns": when(SPANNED),
        }
    ).filter(pc.is_valid(events[key]))
    aggs = [("submit_ns", "min"), ("down_ns", "min"), ("commit_ns", "max"), ("first_ns", "min")]
    grouped = table.group_by("key", use_threads=False).aggregate(aggs)  # one thread: half the memory, faster
    return pa.table({key: grouped["key"], **{c: grouped[f"{c}_{how}"] for c, how in aggs}})


def completion(times: pa.Table, completed_by: str) -> pa.ChunkedArray:
    """Return each operation's completion timestamp from ``op_times`` (null: never completed)."""
    column: pa.ChunkedArray = times["down_ns" if completed_by == "downstream" else "commit_ns"]
    return column


def per_second(ops: pa.Table, t0_ns: int) -> SoakSeries:
    """Count submissions and completions per second since ``t0_ns`` and take the latency
    percentiles per completion second, from one row per operation (``submit_ns``, ``done_ns``,
    both nullable). Seconds without either are present with zero counts, so a stall shows."""
    submit, done = ops["submit_ns"], ops["done_ns"]
    sub_s = (_np(submit.drop_null()) - t0_ns) // NS
    finished = ops.filter(pc.is_valid(done))
    done_ns = _np(finished["done_ns"])
    done_s = (done_ns - t0_ns) // NS
    every = np.concatenate([sub_s, done_s])
    if not len(every):
        return SoakSeries((), 1, (), (), (), ())
    lo, hi = int(every.min()), int(every.max())
    bucket = max(1, -(-(hi - lo + 1) // MAX_BUCKETS))
    n = (hi - lo) // bucket + 1
    done_b = (done_s - lo) // bucket
    submitted = np.bincount((sub_s - lo) // bucket, minlength=n)
    completed = np.bincount(done_b, minlength=n)
    # latencies: only operations with a submit at or before their completion
    sub_of_done = finished["submit_ns"]
    has_sub = np.asarray(pc.is_valid(sub_of_done).to_numpy(zero_copy_only=False), dtype=bool)
    lat = done_ns - np.asarray(pc.fill_null(sub_of_done, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    ok = has_sub & (lat >= 0)
    pcts = _percentiles(done_b[ok], lat[ok], n)
    return SoakSeries(
        seconds=tuple(range(lo, lo + n * bucket, bucket)),
        bucket_s=bucket,
        submitted=tuple(submitted.tolist()),
        completed=tuple(completed.tolist()),
        p50_ms=pcts[50],
        p99_ms=pcts[99],
        skewed=int((has_sub & (lat < 0)).sum()),
    )


def _percentiles(buckets: I64, lat_ns: I64, n: int) -> dict[int, tuple[float | None, ...]]:
    """Return percentile -> per bucket the nearest-rank latency in ms (as ``plots.plot_latency``'s
    markers), computed with one sort: latencies ordered within buckets, then indexed."""
    order = np.lexsort((lat_ns, buckets))
    lat_sorted = lat_ns[order]
    counts = np.bincount(buckets, minlength=n)
    starts = np.cumsum(counts) - counts
    out: dict[int, tuple[float | None, ...]] = {}
    for p in PERCENTILES:
        if not len(lat_sorted):
            out[p] = (None,) * n
            continue
        rank = np.maximum((p * counts + 99) // 100 - 1, 0)  # ceil(p% of count) - 1, in integers
        picked = lat_sorted[np.minimum(starts + rank, len(lat_sorted) - 1)]  # clipped: empty buckets
        out[p] = tuple(v / 1e6 if c else None for v, c in zip(picked.tolist(), counts.tolist(), strict=True))
    return out


def place_anomalies(
    times: pa.Table, anomalies: Mapping[str, Iterable[str]], completed_by: str, t0_ns: int
) -> tuple[AnomalyMarks, ...]:
    """Place each flagged operation (``times``: ``op_times`` keyed by ``op``) at its completion, or
    at its first event when it never completed; classes in the verdict's order, unknown ones after."""
    at = pc.coalesce(completion(times, completed_by), times["first_ns"])
    placed = pa.table({"op": times["op"], "at": at}).filter(pc.is_valid(at))
    known = [c for c in ANOMALY_CLASSES if c in anomalies]
    marks = []
    for cls in known + sorted(set(anomalies) - set(known)):
        ops = pa.array(sorted(set(anomalies[cls])), pa.string())
        hit = placed.filter(pc.is_in(placed["op"], value_set=ops))
        seconds = np.sort(_np(hit["at"]) - t0_ns) / NS
        marks.append(AnomalyMarks(cls, tuple(seconds.tolist()), unplaced=len(ops) - hit.num_rows))
    return tuple(m for m in marks if m.count)


def ticks(ts_ns: I64, t0_ns: int, resolution_s: float) -> Ticks:
    """Return the moments of ``ts_ns`` in seconds since ``t0_ns``, merged to ``resolution_s``."""
    if not len(ts_ns):
        return Ticks()
    slots = np.unique(np.floor((ts_ns - t0_ns) / NS / resolution_s))
    return Ticks(tuple((slots * resolution_s).tolist()), len(ts_ns))


def _with_codes(events: pa.Table) -> pa.Table:
    """Add the compacted layout's integer columns (``layout.py``) to a table ``read_ledger`` read
    from segments or an older layout, so both kinds of ledger reduce with the same code."""
    ops, srcs = events["op"].unique().drop_null(), events["src"].unique()
    return (
        events.append_column("kind_code", kind_codes(events["kind"]))
        .append_column("op_id", pc.index_in(events["op"], value_set=ops).cast(pa.int64()))
        .append_column("src_code", pc.index_in(events["src"], value_set=srcs).cast(pa.int32()))
    )


Part = tuple[pa.Table, int | None, int | None]


def _parts(ledger_dir: Path, columns: Sequence[str], keep: Callable[[pa.Table], pa.ChunkedArray]) -> Iterator[Part]:
    """Yield per part of the ledger the rows ``keep`` selects (``columns``, which hold ``ts_ns``)
    and the first and last timestamps of all its rows. A compacted ledger is read a part at a time
    in record batches, only the selected rows kept; a ledger of segments or of an older layout
    (small) is read whole by ``read_ledger``."""
    parquet = ledger_dir / PARQUET_NAME
    parts = sorted(parquet.glob("*.parquet")) if parquet.is_dir() else []
    if not parts or not {*SCAN_COLUMNS, "op"} <= set(pq.read_schema(parts[0]).names):
        events = _with_codes(read_ledger(ledger_dir))
        yield events.filter(keep(events)).select(list(columns)), *_span([events])
        return
    for part in parts:
        kept, seen = [], []
        for batch in pq.ParquetFile(part).iter_batches(columns=list(columns)):
            table = pa.Table.from_batches([batch])
            seen.append(_ends(table))
            kept.append(table.filter(keep(table)))
        if kept:
            yield pa.concat_tables(kept), *_span(seen)


def _ends(table: pa.Table) -> pa.Table:
    """Return ``table``'s earliest and latest ``ts_ns`` as a two-row table (what ``_span`` reads)."""
    ends = pc.min_max(table["ts_ns"]).as_py()
    return pa.table({"ts_ns": pa.array([ends["min"], ends["max"]], pa.int64())})


def _span(tables: list[pa.Table]) -> tuple[int | None, int | None]:
    """Return the first and last ``ts_ns`` over ``tables`` (None, None when they have no row)."""
    ends = pc.min_max(pa.chunked_array([t["ts_ns"] for t in tables], pa.int64())).as_py()
    return ends["min"], ends["max"]


def _of(table: pa.Table, codes: pa.Array) -> pa.Table:
    return table.filter(pc.is_in(table["kind_code"], value_set=codes))


def _fault_events(control: pa.Table, first: int, last: int) -> pa.Table:
    """Return the fault rows as ``fault_windows`` reads them, with a row at the ledger's first and
    last timestamps: a fault never healed lasts to the run's last event, as ``plot_timeline`` draws."""
    faults = _of(control, FAULTS)
    ends = pa.table({"ts_ns": [first, last], "kind": [str(Kind.RUN_START), str(Kind.RUN_END)], "point": [None, None]})
    kinds = pc.take(KIND_NAMES, faults["kind_code"])
    rows = pa.table({"ts_ns": faults["ts_ns"], "kind": kinds, "point": faults["point"]})
    return pa.concat_tables([ends.cast(rows.schema), rows])


def _flagged(ledger_dir: Path, anomalies: Mapping[str, Iterable[str]]) -> pa.Table | None:
    """Return ``op_times`` keyed by ``op`` for the flagged operations, from their own events
    (a second pass over the ledger that keeps only their rows), or None when none is flagged."""
    wanted = pa.array(sorted({op for ops in anomalies.values() for op in ops}), pa.string())
    if not len(wanted):
        return None

    def keep(table: pa.Table) -> pa.ChunkedArray:
        return pc.is_in(table["op"], value_set=wanted)

    rows = [part for part, _, _ in _parts(ledger_dir, ("op", "ts_ns", "kind_code"), keep)]
    return op_times(pa.concat_tables(rows), "op") if rows else None


def _scanned(table: pa.Table) -> pa.ChunkedArray:
    return pc.is_in(table["kind_code"], value_set=SCANNED)


def soak_data(ledger_dir: Path, anomalies: Mapping[str, Iterable[str]] | None = None) -> SoakData:
    """Read a run's ledger and return what the soak plot draws; ``anomalies`` maps an anomaly class
    to the ids of the operations it flagged (a verdict's), placed by their own events.

    Seconds count from the run's ``run_start`` event (the ledger's first event without one).
    """
    times, control, firsts, lasts = [], [], [], []
    for rows, first, last in _parts(ledger_dir, SCAN_COLUMNS, _scanned):
        times.append(op_times(_of(rows, OP_KINDS), "op_id"))
        control.append(_of(rows, CONTROL))
        firsts += [] if first is None else [first]
        lasts += [] if last is None else [last]
    if not firsts:
        empty = per_second(pa.table({"submit_ns": pa.array([], pa.int64()), "done_ns": pa.array([], pa.int64())}), 0)
        return SoakData(0, "downstream", 0, empty, (), (), Ticks(), Ticks(), (0.0, 1.0))
    ops, ctl = pa.concat_tables(times), pa.concat_tables(control)
    # The driver writes an operation's submit before it sends it. An operation whose submit comes
    # after all its commits and output was started by the flow (a saga's step) and recorded as
    # submitted at the close: it was never submitted then, so the series count the driver's own.
    # (A writer whose clock runs behind puts one event early, not every one: that is skew.)
    ended = pc.max_element_wise(ops["commit_ns"], ops["down_ns"], skip_nulls=True)
    by_flow = pc.fill_null(pc.greater(ops["submit_ns"], ended), False)
    n_by_flow = int(pc.sum(by_flow).as_py() or 0)
    ops = ops.filter(pc.invert(by_flow)) if n_by_flow else ops
    # a flow without output ends at its commits; a ledger with neither is judged by the usual rule
    no_output = not pc.any(pc.is_valid(ops["down_ns"])).as_py() and pc.any(pc.is_valid(ops["commit_ns"])).as_py()
    completed_by = "commit" if no_output else "downstream"
    run_starts = _of(ctl, RUN_START)["ts_ns"]
    t0: int = pc.min(run_starts).as_py() if len(run_starts) else min(firsts)
    series = per_second(pa.table({"submit_ns": ops["submit_ns"], "done_ns": completion(ops, completed_by)}), t0)
    windows = tuple(fault_windows(_fault_events(ctl, min(firsts), max(lasts))))
    crash_ns, restart_ns = _np(_of(ctl, CRASH)["ts_ns"]), _np(_of(ctl, WORKER_EXIT)["ts_ns"])
    moments = (np.concatenate([crash_ns, restart_ns]) - t0) / NS
    lo = float(min(0.0, *series.seconds[:1], moments.min(initial=0.0)))
    ends = [(w.end_ns - t0) / NS for w in windows]
    hi = float(max(lo + 1.0, *ends, moments.max(initial=0.0), *(s + series.bucket_s for s in series.seconds[-1:])))
    resolution = max(0.001, (hi - lo) / TICK_SLOTS)
    flagged = _flagged(ledger_dir, anomalies or {})
    marks = () if flagged is None else place_anomalies(flagged, anomalies or {}, completed_by, t0)
    return SoakData(
        t0_ns=t0,
        completed_by=completed_by,
        operations=ops.num_rows,
        series=series,
        windows=windows,
        anomalies=marks,
        crashes=ticks(crash_ns, t0, resolution),
        restarts=ticks(restart_ns, t0, resolution),
        x_range=(lo, hi),
        by_flow=n_by_flow,
    )
