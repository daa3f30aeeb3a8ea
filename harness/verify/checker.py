"""The in-process engine: evaluates ``model.py`` on a ledger table with pyarrow, inside a test."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.verify import fired
from harness.verify.assemble import (
    MAX_OVERLAY_WINDOWS,
    MAX_WITNESS_EVENTS,
    MAX_WITNESSES,
    Aggregates,
    FaultWindow,
    build_witnesses,
    make_verdict,
    pair_fault_windows,
)
from harness.verify.evidence import gather
from harness.verify.model import (
    ANOMALY_CLASSES,
    ATTEMPT_COUNTS,
    COUNTS,
    DELIVERY_HIST_CAP,
    FIRST_TS,
    LATENCY_SCALES,
    LATENCY_TOP_SCALE,
    PER_KEY_COLUMNS,
    SPAN_EXCLUDED,
    SUMS,
    AllOf,
    Cmp,
    FlowContract,
    Pred,
    judged_rules,
    summed,
)
from harness.verify.verdict import Verdict

__all__ = ["MAX_WITNESSES", "MAX_WITNESS_EVENTS", "check_run", "check_table", "summarize", "to_arrow"]

I64 = npt.NDArray[np.int64]


def to_arrow(pred: Pred) -> pc.Expression:
    """Translate a model predicate into a pyarrow compute expression."""
    if isinstance(pred, Cmp):
        left = pc.field(pred.column)
        right = pc.field(pred.value) if isinstance(pred.value, str) else pc.scalar(pred.value)
        ops = {
            "==": left == right,
            "!=": left != right,
            ">": left > right,
            ">=": left >= right,
            "<": left < right,
            "<=": left <= right,
        }
        return ops[pred.op]
    exprs = [to_arrow(p) for p in pred.parts]
    out = exprs[0]
    for e in exprs[1:]:
        out = (out & e) if isinstance(pred, AllOf) else (out | e)
    return out


def summarize(events: pa.Table, contract: FlowContract | None = None) -> pa.Table:
    """Group events by ``op``: each COUNTS kind counted, SUMS summed (those ``model.summed`` names for
    ``contract``, the others 0), FIRST_TS minima, the span; one row per op."""
    computed = summed(contract or FlowContract())
    with_op = events.filter(pc.is_valid(events["op"]))
    kind, ts = with_op["kind"], with_op["ts_ns"]
    cols: dict[str, Any] = {"op": with_op["op"]}
    for name, k in COUNTS.items():
        cols[name] = pc.cast(pc.equal(kind, str(k)), pa.int64())
    for name, (k, above) in ATTEMPT_COUNTS.items():
        late = pc.fill_null(pc.and_(pc.equal(kind, str(k)), pc.greater(with_op["attempt"], above)), False)
        cols[name] = pc.cast(late, pa.int64())
    for name, (k, key) in SUMS.items():
        values = _detail_ints(with_op, kind, k, key) if name in computed else np.zeros(with_op.num_rows, np.int64)
        cols[name] = pa.array(values, pa.int64())
    for name, k in FIRST_TS.items():
        cols[name] = pc.if_else(pc.equal(kind, str(k)), ts, None)
    in_span = pc.invert(pc.is_in(kind, value_set=pa.array(sorted(str(k) for k in SPAN_EXCLUDED))))
    cols["span_ns"] = pc.if_else(in_span, ts, None)
    aggs = [(n, "sum") for n in [*COUNTS, *ATTEMPT_COUNTS, *SUMS]] + [(n, "min") for n in FIRST_TS]
    grouped = pa.table(cols).group_by("op").aggregate([*aggs, ("span_ns", "min"), ("span_ns", "max")])
    rename = {f"{n}_{f}": n for n, f in aggs} | {"span_ns_min": "first_ns", "span_ns_max": "last_ns"}
    return grouped.rename_columns([rename.get(c, c) for c in grouped.column_names])


def _detail_ints(events: pa.Table, kind: pa.ChunkedArray, k: Kind, key: str) -> I64:
    """Return, per event, the integer ``detail[key]`` of events of kind ``k`` and 0 for the others."""
    out = np.zeros(events.num_rows, dtype=np.int64)
    where = np.flatnonzero(np.asarray(pc.equal(kind, str(k)).to_numpy(zero_copy_only=False)))
    if where.size:
        details = events["detail"].take(pa.array(where)).to_pylist()
        out[where] = [int(json.loads(d or "{}").get(key) or 0) for d in details]
    return out


def per_key_counts(events: pa.Table) -> dict[str, dict[str, int]]:
    """Return op -> ``PER_KEY_COLUMNS`` counts from the ledger's per-key view (see ``model.py``)."""
    kinds = pa.array([str(Kind.SUBMIT), str(Kind.RESIDUE_APPLY), str(Kind.RESIDUE_ENTITY)])
    rows = events.filter(pc.is_in(events["kind"], value_set=kinds)).select(["kind", "op", "detail"]).to_pylist()
    out: dict[str, dict[str, int]] = {}

    def bump(op: str, col: str) -> None:
        out.setdefault(op, dict.fromkeys(PER_KEY_COLUMNS, 0))[col] += 1

    last: dict[str, tuple[int, bool]] = {}  # key -> (highest submitted version, is it a tombstone)
    applies: list[tuple[str, int, str, int, bool]] = []
    entities: list[tuple[str, str, bool]] = []
    for r in rows:
        d = json.loads(r["detail"] or "{}")
        if "key" not in d or r["op"] is None:
            continue
        key, op = str(d["key"]), str(r["op"])
        if r["kind"] == Kind.SUBMIT:
            last[key] = max(last.get(key, (-(2**62), False)), (int(d["version"]), bool(d["tombstone"])))
        elif r["kind"] == Kind.RESIDUE_APPLY:
            applies.append((key, int(d["n"]), op, int(d["version"]), bool(d["tombstone"])))
        else:
            entities.append((key, op, bool(d["deleted"])))
    seen: dict[str, int] = {}  # key -> highest version applied so far
    tomb: dict[str, int] = {}  # key -> highest tombstone version applied so far
    for key, _n, op, version, tombstone in sorted(applies):
        if key in seen and version < seen[key]:
            bump(op, "regressions")
        if not tombstone and key in tomb and version < tomb[key]:
            bump(op, "resurrections")
        seen[key] = max(seen.get(key, version), version)
        if tombstone:
            tomb[key] = max(tomb.get(key, version), version)
    for key, op, deleted in entities:
        if not deleted and last.get(key, (0, False))[1]:
            bump(op, "resurrections")
    return out


def _with_per_key(summary: pa.Table, events: pa.Table) -> pa.Table:
    counts = per_key_counts(events)
    ops = summary["op"].to_pylist()
    for col in PER_KEY_COLUMNS:
        summary = summary.append_column(col, pa.array([counts.get(o, {}).get(col, 0) for o in ops], pa.int64()))
    return summary


def _np(col: pa.ChunkedArray | pa.Array, fill: int = 0) -> I64:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _latency_buckets(lat_us: I64) -> I64:
    scale = np.full(lat_us.shape, LATENCY_TOP_SCALE, dtype=np.int64)
    for below, s in reversed(LATENCY_SCALES):  # smallest threshold wins, so apply it last
        scale[lat_us < below] = s
    return lat_us - lat_us % scale


def _hist(values: I64) -> dict[int, int]:
    keys, counts = np.unique(values, return_counts=True)
    return {int(k): int(c) for k, c in zip(keys, counts, strict=True)}


def _overlap(first: I64, last: I64, valid: npt.NDArray[np.bool_], w: FaultWindow) -> npt.NDArray[np.bool_]:
    return valid & (first <= w.end) & (last >= w.start_ns)


def _writers(events: pa.Table) -> dict[tuple[str, int, str, bool], tuple[int, int, int]]:
    t = pa.table(
        {
            "src": events["src"],
            "pid": events["pid"],
            "kind": events["kind"],
            "has_op": pc.is_valid(events["op"]),
            "seq": events["seq"],
        }
    )
    g = t.group_by(["src", "pid", "kind", "has_op"]).aggregate([("seq", "count"), ("seq", "min"), ("seq", "max")])
    return {
        (r["src"], r["pid"], r["kind"], r["has_op"]): (r["seq_count"], r["seq_min"], r["seq_max"])
        for r in g.to_pylist()
    }


def aggregate(events: pa.Table, summary: pa.Table, hits: dict[str, pa.Table], windows: list[FaultWindow]) -> Aggregates:
    """Return the engine-independent aggregates of a ledger and its operation summary."""
    d, redelivered = _np(summary["deliveries"]), _np(summary["redeliveries"])
    sub, down = summary["submit_ns"], summary["downstream_ns"]
    both = np.asarray(pc.and_(pc.is_valid(sub), pc.is_valid(down)).to_numpy(zero_copy_only=False))
    diff = (_np(down) - _np(sub))[both]
    lat_us = diff[diff >= 0] // 1000
    first, last = _np(summary["first_ns"]), _np(summary["last_ns"])
    valid = np.asarray(pc.is_valid(summary["first_ns"]).to_numpy(zero_copy_only=False))
    overlays: dict[int, dict[str, int]] = {}
    for i, w in enumerate(windows[:MAX_OVERLAY_WINDOWS]):
        mask = _overlap(first, last, valid, w)
        counts = {"ops": int(mask.sum()), "redelivered_ops": int((mask & (redelivered > 0)).sum())}
        for cls, h in hits.items():
            hv = np.asarray(pc.is_valid(h["first_ns"]).to_numpy(zero_copy_only=False))
            counts[cls] = int(_overlap(_np(h["first_ns"]), _np(h["last_ns"]), hv, w).sum())
        overlays[i] = counts
    return Aggregates(
        writers=_writers(events),
        operations=summary.num_rows,
        totals={n: int(_np(summary[n]).sum()) for n in COUNTS},
        anomalies={cls: h.num_rows for cls, h in hits.items()},
        redeliveries=int(redelivered.sum()),
        redelivered_ops=int((redelivered > 0).sum()),
        max_deliveries=int(d.max()) if d.size else 0,
        duplicate_downstream=int(np.maximum(_np(summary["downstream"]) - 1, 0).sum()),
        deliveries_hist=_hist(np.minimum(d, DELIVERY_HIST_CAP)),
        latency_hist=_hist(_latency_buckets(lat_us)),
        latency_max_us=int(lat_us.max()) if lat_us.size else None,
        clock_skew_ops=int((diff < 0).sum()),
        overlays=overlays,
    )


def _chains(events: pa.Table, ops: set[str]) -> dict[str, list[dict[str, Any]]]:
    chains: dict[str, list[dict[str, Any]]] = {}
    if ops:
        mask = pc.is_in(events["op"], value_set=pa.array(sorted(ops), pa.string()))
        for row in events.filter(mask).to_pylist():
            chains.setdefault(row["op"], []).append(row)
    return chains


def _fault_rows(events: pa.Table) -> list[dict[str, Any]]:
    def select(kinds: tuple[Kind, ...]) -> list[dict[str, Any]]:
        wanted = pa.array([str(k) for k in kinds])
        rows: list[dict[str, Any]] = (
            events.filter(pc.is_in(events["kind"], value_set=wanted)).select(list(fired.COLUMNS)).to_pylist()
        )
        return rows

    rows = select(fired.REQUESTS)  # fault windows and arms; their firings only when something was armed
    return rows + select(fired.FIRINGS) if fired.armed(rows) else rows


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
    started = time.perf_counter()
    fault_rows = _fault_rows(events)
    windows, unmatched = pair_fault_windows(fault_rows)
    summary = summarize(events, contract)
    if contract.per_key:
        summary = _with_per_key(summary, events)
    judged = judged_rules(contract, snapshot=snapshot, intact=intact)
    hits = {cls: summary.filter(to_arrow(pred)) for cls, pred in judged.items()}
    flagged: list[dict[str, Any]] = []
    for cls in ANOMALY_CLASSES:
        if cls in hits and len(flagged) < MAX_WITNESSES:
            top = hits[cls].sort_by("op").slice(0, MAX_WITNESSES - len(flagged))
            flagged += [row | {"anomaly": cls} for row in top.to_pylist()]
    chains = _chains(events, {row["op"] for row in flagged})
    agg = aggregate(events, summary, hits, windows)
    return make_verdict(
        agg,
        build_witnesses(flagged, chains, windows),
        windows,
        unmatched,
        engine="in-process",
        scenario=scenario,
        seed=seed,
        timing={"job_s": round(time.perf_counter() - started, 4)},
        fault_rows=fault_rows,
    )


def check_run(run_dir: Path, contract: FlowContract, *, scenario: str = "", seed: int | None = None) -> Verdict:
    """Return the verdict for the ledger in ``run_dir/ledger``; an incomplete or damaged folder gets an
    ``incomplete`` verdict that judges only what its evidence can decide (see ``evidence.py``)."""
    evidence = gather(run_dir)
    events = read_ledger(run_dir / "ledger")
    verdict = check_table(
        events, contract, scenario=scenario, seed=seed, snapshot=evidence.closed, intact=evidence.intact
    )
    return evidence.apply(verdict, contract)
