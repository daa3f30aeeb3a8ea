"""The in-process engine: evaluates ``model.py`` on a ledger table with pyarrow, inside a test."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.verify.model import ANOMALY_CLASSES, COUNTS, AllOf, AnyOf, Cmp, FlowContract, Pred, rules
from harness.verify.verdict import Verdict, Witness

MAX_WITNESS_EVENTS = 200  # per witness: enough to read the story, bounded for huge redelivery loops
MAX_WITNESSES = 1000  # counts stay exact; only the number of printed examples is bounded


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


def summarize(events: pa.Table) -> pa.Table:
    """Group events by ``op`` and count each kind of ``COUNTS``: the operation summary."""
    with_op = events.filter(pc.is_valid(events["op"]))
    kind = with_op["kind"]
    cols: dict[str, pa.Array | pa.ChunkedArray] = {"op": with_op["op"]}
    for name, k in COUNTS.items():
        cols[name] = pc.cast(pc.equal(kind, str(k)), pa.int64())
    is_submit = pc.equal(kind, str(Kind.SUBMIT))
    is_down = pc.equal(kind, str(Kind.DOWNSTREAM))
    cols["submit_ns"] = pc.if_else(is_submit, with_op["ts_ns"], None)
    cols["downstream_ns"] = pc.if_else(is_down, with_op["ts_ns"], None)
    grouped = pa.table(cols).group_by("op").aggregate(
        [(name, "sum") for name in COUNTS] + [("submit_ns", "min"), ("downstream_ns", "min")]
    )
    rename = {f"{name}_sum": name for name in COUNTS} | {"submit_ns_min": "submit_ns", "downstream_ns_min": "downstream_ns"}
    return grouped.rename_columns([rename.get(c, c) for c in grouped.column_names])


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    def pick(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))], 3)
    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": round(values[-1], 3)}


def statistics(summary: pa.Table, events: pa.Table) -> dict[str, Any]:
    """Return redelivery, crash and latency statistics (not anomalies)."""
    def total(col: str) -> int:
        return int(pc.sum(summary[col]).as_py() or 0)

    deliveries = summary["deliveries"]
    redeliveries = int(pc.sum(pc.max_element_wise(pc.subtract(deliveries, 1), 0)).as_py() or 0)
    dup_down = int(pc.sum(pc.max_element_wise(pc.subtract(summary["downstream"], 1), 0)).as_py() or 0)
    lat = pc.divide(pc.cast(pc.subtract(summary["downstream_ns"], summary["submit_ns"]), pa.float64()), 1e6)
    lat_values = [v for v in lat.to_pylist() if v is not None]
    kinds = events["kind"]
    return {
        "events": events.num_rows,
        "operations": summary.num_rows,
        "submitted": total("submitted"),
        "deliveries": total("deliveries"),
        "redeliveries": redeliveries,
        "duplicate_downstream_deliveries": dup_down,
        "crashes": int(pc.sum(pc.cast(pc.equal(kinds, str(Kind.CRASH)), pa.int64())).as_py() or 0),
        "worker_restarts": int(pc.sum(pc.cast(pc.equal(kinds, str(Kind.WORKER_START)), pa.int64())).as_py() or 0),
        "latency_ms": _percentiles(lat_values),
    }


def _witness_events(events: pa.Table, ops: set[str]) -> dict[str, list[dict[str, Any]]]:
    chains: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not ops:
        return chains
    mask = pc.is_in(events["op"], value_set=pa.array(sorted(ops), pa.string()))
    for row in events.filter(mask).sort_by([("ts_ns", "ascending"), ("seq", "ascending")]).to_pylist():
        chain = chains[row["op"]]
        if len(chain) < MAX_WITNESS_EVENTS:
            row["detail"] = json.loads(row["detail"] or "{}")
            chain.append({k: v for k, v in row.items() if v not in (None, {})})
    return chains


def check_table(events: pa.Table, contract: FlowContract, *, scenario: str = "", seed: int | None = None) -> Verdict:
    """Return the verdict for a ledger table."""
    started = time.perf_counter()
    summary = summarize(events)
    anomalies: dict[str, int] = dict.fromkeys(ANOMALY_CLASSES, 0)
    flagged: list[tuple[str, dict[str, Any]]] = []
    for name, pred in rules(contract).items():
        hits = summary.filter(to_arrow(pred))
        anomalies[name] = hits.num_rows
        flagged.extend((name, row) for row in hits.slice(0, MAX_WITNESSES).to_pylist())
    flagged = flagged[:MAX_WITNESSES]
    chains = _witness_events(events, {row["op"] for _, row in flagged})
    witnesses = []
    for name, row in flagged:
        chain = chains.get(row["op"], [])
        msg_ids = tuple(dict.fromkeys(str(e["msg"]) for e in chain if e.get("msg")))
        counts = {k: int(row[k]) for k in COUNTS}
        witnesses.append(Witness(name, row["op"], msg_ids, counts, tuple(chain)))
    stats = statistics(summary, events)
    return Verdict(
        anomalies=anomalies,
        witnesses=tuple(sorted(witnesses, key=lambda w: (ANOMALY_CLASSES.index(w.anomaly), w.op))),
        stats=stats,
        engine="in-process",
        scenario=scenario,
        seed=seed,
        timing={"job_s": round(time.perf_counter() - started, 4)},
    )


def check_run(run_dir: Path, contract: FlowContract, *, scenario: str = "", seed: int | None = None) -> Verdict:
    """Return the verdict for the ledger in ``run_dir/ledger``."""
    return check_table(read_ledger(run_dir / "ledger"), contract, scenario=scenario, seed=seed)
