"""Engine-independent assembly: fault windows, percentiles, witnesses, stats, engine comparison.

Each engine computes the operation summary and a few small aggregates (``Aggregates``) its own
way; everything after that is this module's plain Python, so two engines that agree on the
aggregates produce byte-identical verdicts.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.jsontext import loads
from harness.ledger.schema import Kind
from harness.verify import fired
from harness.verify.model import ANOMALY_CLASSES, COUNTS, DELIVERY_HIST_CAP, SUMS
from harness.verify.verdict import Verdict, Witness

MAX_WITNESS_EVENTS = 200  # per witness: enough to read the story, bounded for huge redelivery loops
CHAIN_ORDER = ("ts_ns", "src", "seq", "pid")  # a chain's events in time, ties in a stable order
_CHAIN_KEY = operator.itemgetter(*CHAIN_ORDER)
# Counts stay exact; each class keeps its first examples in op order, so every class found has some
# (one cap over all classes left the later ones none once the first ones had thousands).
WITNESSES_PER_CLASS = 100
FOREVER_NS = 2**63 - 1  # end of a fault window still open when the run ended
# A witness's own summary figures, beside its chain: what ``build_witnesses`` reads of each flagged row.
WITNESS_COLUMNS = (*COUNTS, *SUMS, "first_ns", "last_ns")


class Laps:
    """Record the seconds each step of a verification took, for the benchmark: ``lap("summary_s")``
    after each step writes into ``phases`` (a fresh dict when None)."""

    def __init__(self, phases: dict[str, float] | None = None) -> None:
        self.phases = {} if phases is None else phases
        self._clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self._clock, 3)
        self._clock = now


@dataclass(frozen=True)
class FaultWindow:
    """One fault, active from ``start_ns`` to ``end_ns`` inclusive (None: until the run ended)."""

    fault: str
    start_ns: int
    end_ns: int | None

    @property
    def end(self) -> int:
        return FOREVER_NS if self.end_ns is None else self.end_ns

    def to_dict(self) -> dict[str, Any]:
        dur = None if self.end_ns is None else round((self.end_ns - self.start_ns) / 1e6, 3)
        return {"fault": self.fault, "start_ns": self.start_ns, "end_ns": self.end_ns, "duration_ms": dur}


def add_window_sets(sets: list[tuple[list[int], dict[str, int]]]) -> dict[int, dict[str, int]]:
    """Return window index -> its figures, added up from (the windows a set of operations overlaps,
    that set's figures): both engines count operations by the set of windows they overlap."""
    out: dict[int, dict[str, int]] = {}
    for hit, sums in sets:
        for i in hit:
            into = out.setdefault(i, dict.fromkeys(sums, 0))
            for name, n in sums.items():
                into[name] += n
    return dict(sorted(out.items()))


def pair_fault_windows(rows: list[dict[str, Any]]) -> tuple[list[FaultWindow], int]:
    """Pair fault_start/fault_end events by fault name (``point``), first in first out.

    Returns the windows in (start, fault) order and the number of ends that had no start.
    """
    rows = sorted(rows, key=lambda r: (r["ts_ns"], r["src"], r["seq"]))
    open_: dict[str, list[int]] = {}
    windows: list[FaultWindow] = []
    unmatched = 0
    for r in rows:
        name = str(r.get("point") or "?")
        if r["kind"] not in (Kind.FAULT_START, Kind.FAULT_END):
            continue  # the rows of ``fired.KINDS`` also hold arms and firings
        if r["kind"] == Kind.FAULT_START:
            open_.setdefault(name, []).append(int(r["ts_ns"]))
        elif open_.get(name):
            windows.append(FaultWindow(name, open_[name].pop(0), int(r["ts_ns"])))
        else:
            unmatched += 1
    windows += [FaultWindow(n, s, None) for n, starts in open_.items() for s in starts]
    return sorted(windows, key=lambda w: (w.start_ns, w.fault, w.end)), unmatched


def percentiles(hist: dict[int, int], max_us: int | None) -> dict[str, float]:
    """Return nearest-rank p50/p95/p99 (ms) of a latency histogram {bucket_us: ops}, and the exact max."""
    n = sum(hist.values())
    if not n or max_us is None:
        return {"count": 0}
    buckets = sorted(hist.items())
    out: dict[str, float] = {"count": n}
    for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
        rank, seen = int(q * (n - 1) + 0.5), 0
        for value, count in buckets:
            seen += count
            if seen > rank:
                out[name] = round(value / 1000, 3)
                break
    out["max"] = round(max_us / 1000, 3)
    return out


@dataclass
class Aggregates:
    """What an engine computes over the whole ledger; small, whatever the ledger's size."""

    # (src, pid, kind, has_op) -> [events, min seq, max seq]
    writers: dict[tuple[str, int, str, bool], tuple[int, int, int]]
    operations: int
    totals: dict[str, int]  # sum of every COUNTS column over operations
    anomalies: dict[str, int]
    redeliveries: int
    redelivered_ops: int
    max_deliveries: int
    duplicate_downstream: int
    deliveries_hist: dict[int, int]  # min(deliveries, DELIVERY_HIST_CAP) -> operations
    latency_hist: dict[int, int]  # latency bucket (us) -> operations
    latency_max_us: int | None
    clock_skew_ops: int  # downstream seen before submit: writers' clocks disagree
    overlays: dict[int, dict[str, int]] = field(default_factory=dict)  # window index -> counts
    events_without_op: int | None = None  # engines that group writers without has_op say it here


def _writer_stats(writers: dict[tuple[str, int, str, bool], tuple[int, int, int]]) -> dict[str, Any]:
    per_writer: dict[tuple[str, int], list[int]] = {}
    kinds: dict[str, int] = {}
    without_op = 0
    for (src, pid, kind, has_op), (n, lo, hi) in writers.items():
        kinds[kind] = kinds.get(kind, 0) + n
        without_op += 0 if has_op else n
        acc = per_writer.setdefault((src, pid), [0, lo, hi])
        acc[0] += n
        acc[1], acc[2] = min(acc[1], lo), max(acc[2], hi)
    # seq runs 0..n-1 per writer process; anything short of that is a lost event
    missing = sum(max(0, hi + 1 - n) for n, _lo, hi in per_writer.values())
    return {
        "events": sum(kinds.values()),
        "events_without_op": without_op,
        "writers": len(per_writer),
        "seq_missing": missing,
        "kinds": dict(sorted(kinds.items())),
    }


def build_stats(agg: Aggregates, windows: list[FaultWindow], unmatched_ends: int) -> dict[str, Any]:
    """Return the verdict's statistics from an engine's aggregates (identical for every engine)."""
    stats = _writer_stats(agg.writers)
    if agg.events_without_op is not None:
        stats["events_without_op"] = agg.events_without_op
    cap = f"{DELIVERY_HIST_CAP}+"
    hist = {str(k) if k < DELIVERY_HIST_CAP else cap: v for k, v in sorted(agg.deliveries_hist.items())}
    overlay = []
    for i, w in enumerate(windows):
        entry = w.to_dict()
        counts = agg.overlays.get(i, {})
        entry["ops"] = counts.get("ops", 0)
        entry["redelivered_ops"] = counts.get("redelivered_ops", 0)
        entry["anomalies"] = {c: counts[c] for c in ANOMALY_CLASSES if counts.get(c)}
        overlay.append(entry)
    stats.update(
        operations=agg.operations,
        submitted=agg.totals.get("submitted", 0),
        deliveries=agg.totals.get("deliveries", 0),
        redeliveries=agg.redeliveries,
        redelivered_ops=agg.redelivered_ops,
        max_deliveries_per_op=agg.max_deliveries,
        deliveries_per_op=hist,
        duplicate_downstream_deliveries=agg.duplicate_downstream,
        crashes=stats["kinds"].get(str(Kind.CRASH), 0),
        worker_restarts=stats["kinds"].get(str(Kind.WORKER_START), 0),
        latency_ms=percentiles(agg.latency_hist, agg.latency_max_us),
        clock_skew_ops=agg.clock_skew_ops,
        fault_windows=overlay,
        unmatched_fault_ends=unmatched_ends,
    )
    return stats


class _WindowIndex:
    """The fault windows as arrays, so the windows active at an event's time, or overlapping a
    witness's span, are one vectorized test: a soak has hundreds of windows, its witnesses'
    chains thousands of events (500 windows and 11,800 chain events: 1.2 s of Python loops)."""

    def __init__(self, windows: list[FaultWindow]) -> None:
        self.windows = windows
        self.starts = np.array([w.start_ns for w in windows], dtype=np.int64)
        self.ends = np.array([w.end for w in windows], dtype=np.int64)

    def overlapping(self, first_ns: int | None, last_ns: int | None) -> list[FaultWindow]:
        """Return the windows that overlap ``first_ns``..``last_ns`` (both ends inclusive), in order;
        none for an operation with no span."""
        if first_ns is None or last_ns is None or not self.windows:
            return []
        hit = np.flatnonzero((self.starts <= last_ns) & (self.ends >= first_ns))
        return [self.windows[i] for i in hit.tolist()]

    def active_at(self, times: list[int]) -> list[list[str]]:
        """Return, per timestamp, the faults of the windows active then (in window order): one
        test over every (time, window) pair of a chain, not one per event."""
        active: list[list[str]] = [[] for _ in times]
        if not self.windows:
            return active
        at = np.array(times, dtype=np.int64)[:, None]
        for t, i in zip(*np.nonzero((self.starts <= at) & (self.ends >= at)), strict=True):
            active[t].append(self.windows[i].fault)
        return active


def _chain_event(row: dict[str, Any], active: list[str]) -> dict[str, Any]:
    """Return a chain's event: ``row`` without its empty columns, its detail parsed, the faults active then."""
    out = {k: v for k, v in row.items() if v is not None}  # the columns are scalars: only the detail is a dict
    detail = loads(row.get("detail") or "{}")
    if detail is None or detail == {}:
        out.pop("detail", None)
    else:
        out["detail"] = detail  # in the column's place
    if active:
        out["faults"] = active
    return out


def _chain(events: list[dict[str, Any]], index: _WindowIndex) -> tuple[dict[str, Any], ...]:
    """Return an operation's first ``MAX_WITNESS_EVENTS`` events in ``CHAIN_ORDER`` as a witness shows them."""
    raw = sorted(events, key=_CHAIN_KEY)[:MAX_WITNESS_EVENTS]
    active = index.active_at([r["ts_ns"] for r in raw])
    return tuple(_chain_event(r, a) for r, a in zip(raw, active, strict=True))


def build_witnesses(
    flagged: list[dict[str, Any]], chains: dict[str, list[dict[str, Any]]], windows: list[FaultWindow]
) -> tuple[Witness, ...]:
    """Return witnesses for flagged summary rows (``anomaly``, ``op``, COUNTS, SUMS, ``first_ns``, ``last_ns``)."""
    index = _WindowIndex(windows)
    out = []
    made: dict[str, tuple[dict[str, Any], ...]] = {}  # an operation flagged in two classes: its chain once
    for row in flagged:
        chain = made.get(row["op"])
        if chain is None:
            chain = made[row["op"]] = _chain(chains.get(row["op"], []), index)
        msg_ids = tuple(dict.fromkeys(str(e["msg"]) for e in chain if e.get("msg")))
        counts = {k: int(row[k]) for k in (*COUNTS, *SUMS)}
        faults = tuple(w.to_dict() for w in index.overlapping(row.get("first_ns"), row.get("last_ns")))
        out.append(Witness(row["anomaly"], row["op"], msg_ids, counts, chain, faults))
    return tuple(sorted(out, key=lambda w: (ANOMALY_CLASSES.index(w.anomaly), w.op)))


def make_verdict(
    agg: Aggregates,
    witnesses: tuple[Witness, ...],
    windows: list[FaultWindow],
    unmatched_ends: int,
    *,
    engine: str,
    scenario: str,
    seed: int | None,
    timing: dict[str, float],
    fault_rows: list[dict[str, Any]] | None = None,
) -> Verdict:
    """Return the verdict an engine reports.

    ``fault_rows`` are the ledger's rows of ``fired.KINDS`` (columns ``fired.COLUMNS``): with them
    the verdict accounts for every requested crash, trap and fault window (``Verdict.faults``).
    """
    anomalies = {c: int(agg.anomalies.get(c, 0)) for c in ANOMALY_CLASSES}
    stats = build_stats(agg, windows, unmatched_ends)
    faults = fired.account(fault_rows or [], windows, agg.overlays)
    stats["faults_fired"], stats["faults_requested"] = fired.fired_count(faults)
    return Verdict(anomalies, witnesses, stats, engine, scenario, seed, timing=timing, faults=faults)


def compare_verdicts(a: Verdict, b: Verdict) -> list[str]:
    """Return the differences between two engines' verdicts (empty: they agree).

    Compared: counts per class, the (anomaly, op) witness sets and each witness's chain and fault
    overlay, every statistic, and what each says it could not judge (gaps, unjudged classes,
    damaged lines). Not compared: engine, timing, notes (only the first engine repairs a ledger).
    """
    diffs: list[str] = []
    for name in ("incomplete", "unjudged", "damaged_lines", "faults"):
        if getattr(a, name) != getattr(b, name):
            diffs.append(f"{name}: {getattr(a, name)!r} != {getattr(b, name)!r}")
    for c in ANOMALY_CLASSES:
        if a.anomalies.get(c, 0) != b.anomalies.get(c, 0):
            diffs.append(f"anomalies[{c}]: {a.anomalies.get(c, 0)} != {b.anomalies.get(c, 0)}")
    wa = {(w.anomaly, w.op): w for w in a.witnesses}
    wb = {(w.anomaly, w.op): w for w in b.witnesses}
    if set(wa) != set(wb):
        diffs.append(
            f"witnesses only in {a.engine}: {sorted(set(wa) - set(wb))[:5]}; "
            f"only in {b.engine}: {sorted(set(wb) - set(wa))[:5]}"
        )
    for key in sorted(set(wa) & set(wb)):
        if wa[key] != wb[key]:
            diffs.append(f"witness {key} differs")
    for k in sorted(set(a.stats) | set(b.stats)):
        if a.stats.get(k) != b.stats.get(k):
            diffs.append(f"stats[{k}]: {a.stats.get(k)!r} != {b.stats.get(k)!r}")
    return diffs
