"""Synthetic run folders: a realistic ledger of N events with a known ground truth of anomalies.

Operations are built from *blocks* of events (a submission, a failed or successful delivery
attempt, a duplicate delivery the consumer skips, the residue tail) and generated vectorized in
chunks of operations, so memory stays bounded whatever N. Each anomalous operation gets one
injected class; ``manifest.json`` records the expected count per class (a poison message is
also stuck, so it counts in both) and a sample of the injected operation ids.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from harness.errors import ConfigError
from harness.ledger.layout import OP_BUCKETS, BucketWriter, n_buckets_for
from harness.ledger.reader import PARQUET_NAME
from harness.ledger.schema import SCHEMA_VERSION, Kind

I64 = npt.NDArray[np.int64]
K = Kind
BLOCKS: dict[str, tuple[Kind, ...]] = {
    "none": (),
    "submit": (K.SUBMIT,),
    "prepare_submit": (K.PREPARE, K.SUBMIT),
    "prepare_abort": (K.PREPARE, K.ABORT_PREPARED),
    "prepare": (K.PREPARE,),
    "fail": (K.DELIVER, K.CRASH),
    "fail_ext": (K.DELIVER, K.EXTERNAL_CALL, K.CRASH),
    "ok": (K.DELIVER, K.EFFECT, K.DB_COMMIT, K.SEND, K.BROKER_COMMIT),
    "ok_ext": (K.DELIVER, K.EXTERNAL_CALL, K.EFFECT, K.DB_COMMIT, K.SEND, K.BROKER_COMMIT),
    "dup_skip": (K.DELIVER, K.SKIP, K.BROKER_COMMIT),
    "tail": (K.DOWNSTREAM, K.RESIDUE_EFFECT),
    "tail_nodown": (K.RESIDUE_EFFECT,),
    "tail_dup": (K.DOWNSTREAM, K.RESIDUE_EFFECT, K.RESIDUE_EFFECT),
    "tail_queue": (K.RESIDUE_QUEUE,),
    "tail_dlq": (K.DEAD_LETTER,),
    "tail_dlq_eff": (K.DEAD_LETTER, K.RESIDUE_EFFECT),
    "tail_dup_out": (K.DOWNSTREAM, K.DOWNSTREAM, K.RESIDUE_EFFECT),
    "tail_inv": (K.DOWNSTREAM, K.RESIDUE_EFFECT, K.RESIDUE_INVARIANT),
}
BLOCK_IDS = {name: i for i, name in enumerate(BLOCKS)}
KINDS = list(Kind)
KIND_NAMES = pa.array([str(k) for k in KINDS])
_WIDTH = max(len(b) for b in BLOCKS.values())
KIND_TABLE = np.array([[KINDS.index(k) for k in b] + [-1] * (_WIDTH - len(b)) for b in BLOCKS.values()])
BLOCK_LEN = np.array([len(b) for b in BLOCKS.values()])

INJECTED = (
    "lost",
    "duplicate-effect",
    "duplicate-external-call",
    "orphan-effect",
    "stuck",
    "dead-lettered",
    "dead-lettered-with-effect",
    "never-dead-lettered-poison",
    "in-doubt",
    "duplicate-output",
    "invariant-broken",
)
ALSO_EXPECTED = {"never-dead-lettered-poison": ("stuck",)}
# The flow promises one output per operation and that every operation nets zero (the per-operation
# invariant below): a second downstream message is duplicate-output, a broken net is invariant-broken.
CONTRACT: dict[str, Any] = {
    "expects_downstream": True,
    "max_external_calls": 1,
    "max_deliveries": 10,
    "exactly_once_output": True,
    "invariants": [
        {
            "name": "net-zero",
            "sql": "SELECT op_id, sum(amount) AS actual, 0 AS expected FROM moves GROUP BY op_id",
            "scope": "op",
            "label": "net of the op's moves",
        }
    ],
}
INVARIANT_DETAIL = json.dumps(
    {
        "invariant": "net-zero",
        "label": "net of the op's moves",
        "scope": "op",
        "actual": 1,
        "expected": 0,
        "holds": False,
    }
)
STAGES, WORKERS_PER_STAGE = 3, 3
SRCS = ["driver", "sink", "residue", "faults"]
SRCS += [f"worker-{s}-{w}" for s in range(STAGES) for w in range(WORKERS_PER_STAGE)]
SRC_NAMES = pa.array(SRCS)
FAULTS = ("latency:activemq", "partition:kafka", "reset_peer:postgres", "kill:worker")
T0 = 1_760_000_000_000_000_000
OPS_PER_S = 5_000
EVENTS_PER_OP = 11.5  # measured mean of the mix below; sizes the op count for a target event count
MAX_EVENTS = 1_000_000_000  # past this the op ids, memory per chunk and hours of writing stop making sense
BYTES_PER_EVENT = 16  # measured 11.6 on the compacted layout (1M events: 11.6 MB); kept with a margin
DISK_SLACK = 64 * 1024 * 1024  # never fill the disk to its last bytes


def check_out_dir(out_dir: Path, events: int) -> None:
    """Refuse an ``out_dir`` that is a file or a non-empty folder, an event count out of bounds, or
    a disk without room for the estimated size."""
    if not 1 <= events <= MAX_EVENTS:
        raise ConfigError(
            f"events={events} is out of range",
            hint=f"pass 1 to 1e9 events (1e9 take about {MAX_EVENTS * BYTES_PER_EVENT / 1e9:.0f} GB and hours)",
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a folder", hint="pass a new or empty folder for the run")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise ConfigError(
            f"--out {out_dir} is a folder that is not empty",
            hint="pass a new or empty folder (nothing in this one was touched)",
        )
    parent = Path(os.path.abspath(out_dir)).parent
    while not parent.exists():  # the folders to create land on the disk of the nearest existing one
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"--out {out_dir}: {parent} is a file, not a folder", hint="pass a path under a folder")
    need = events * BYTES_PER_EVENT + DISK_SLACK
    free = shutil.disk_usage(parent).free
    if free < need:
        raise ConfigError(
            f"{events:,} events need about {need / 1e9:.1f} GB and {parent} has {free / 1e9:.1f} GB free",
            hint="pass fewer --events or an --out on a disk with room",
        )


def _ops_plan(rng: np.random.Generator, n: int, rate: float) -> dict[str, Any]:
    """Draw per-operation choices: class (-1 normal), head and tail blocks, stage count."""
    cls = np.where(rng.random(n) < rate, rng.integers(0, len(INJECTED), n), -1)
    head = rng.choice(
        [BLOCK_IDS["submit"], BLOCK_IDS["prepare_submit"], BLOCK_IDS["prepare_abort"]], n, p=[0.895, 0.1, 0.005]
    )
    tail = np.full(n, BLOCK_IDS["tail"])
    stages = rng.choice([1, 2, 3], n, p=[0.5, 0.3, 0.2])
    stages[head == BLOCK_IDS["prepare_abort"]] = 0
    tail[head == BLOCK_IDS["prepare_abort"]] = BLOCK_IDS["none"]
    lost_nodown = rng.random(n) < 0.5
    injected = cls >= 0  # an injected op starts as a plain submitted flow, then gets its defect
    head[injected] = BLOCK_IDS["submit"]
    tail[injected] = BLOCK_IDS["tail"]
    stages[injected & (stages == 0)] = 1
    for name, (h, t, s) in {
        "lost": (None, "none", None),
        "duplicate-effect": (None, "tail_dup", None),
        "orphan-effect": ("none", None, None),
        "stuck": (None, "tail_queue", None),
        "dead-lettered": (None, "tail_dlq", None),
        "dead-lettered-with-effect": (None, "tail_dlq_eff", None),
        "never-dead-lettered-poison": ("submit", "tail_queue", 1),
        "in-doubt": ("prepare", "none", 0),
        "duplicate-external-call": ("submit", None, None),
        "duplicate-output": (None, "tail_dup_out", None),
        "invariant-broken": (None, "tail_inv", None),
    }.items():
        m = cls == INJECTED.index(name)
        if h is not None:
            head[m] = BLOCK_IDS[h]
        if t is not None:
            tail[m] = BLOCK_IDS[t]
        if s is not None:
            stages[m] = s
    tail[(cls == INJECTED.index("lost")) & lost_nodown] = BLOCK_IDS["tail_nodown"]
    return {"cls": cls, "head": head, "tail": tail, "stages": stages}


def _blocks(rng: np.random.Generator, plan: dict[str, Any]) -> tuple[I64, I64, I64, I64]:
    """Return per block: op (chunk-local), order within op, block id, stage (-1 for head/tail)."""
    n = len(plan["cls"])
    st_op = np.repeat(np.arange(n), plan["stages"])
    st_idx = np.arange(len(st_op)) - np.repeat(np.cumsum(plan["stages"]) - plan["stages"], plan["stages"])
    cls = plan["cls"][st_op]
    fails = (rng.random(len(st_op)) < 0.05).astype(np.int64)
    dup = (rng.random(len(st_op)) < 0.02).astype(np.int64)
    ok = np.where((st_idx == 0) & (rng.random(len(st_op)) < 0.3), BLOCK_IDS["ok_ext"], BLOCK_IDS["ok"])
    fail = np.full(len(st_op), BLOCK_IDS["fail"])
    poison, dext = cls == INJECTED.index("never-dead-lettered-poison"), cls == INJECTED.index("duplicate-external-call")
    fails[poison], dup[poison], ok[poison] = 11, 0, -1
    first = dext & (st_idx == 0)
    fails[first], fail[first], ok[first] = 1, BLOCK_IDS["fail_ext"], BLOCK_IDS["ok_ext"]
    per = fails + (ok >= 0) + dup
    b_st = np.repeat(np.arange(len(st_op)), per)
    q = np.arange(len(b_st)) - np.repeat(np.cumsum(per) - per, per)
    nf = fails[b_st]
    b_type = np.where(q < nf, fail[b_st], np.where((q == nf) & (ok[b_st] >= 0), ok[b_st], BLOCK_IDS["dup_skip"]))
    ops = np.concatenate([np.arange(n), st_op[b_st], np.arange(n)])
    order = np.concatenate([np.zeros(n, np.int64), 1 + st_idx[b_st] * 64 + q, np.full(n, 10_000)])
    types = np.concatenate([plan["head"], b_type, plan["tail"]])
    stage = np.concatenate([np.full(n, -1), st_idx[b_st], np.full(n, -1)])
    keep = BLOCK_LEN[types] > 0
    ops, order, types, stage = ops[keep], order[keep], types[keep], stage[keep]
    idx = np.lexsort((order, ops))
    return ops[idx], order[idx], types[idx], stage[idx]


def _op_ids(first_op: int, n: int) -> pa.Array:
    ints = pa.array(np.arange(first_op, first_op + n))
    return pc.binary_join_element_wise("op-", pc.utf8_lpad(pc.cast(ints, pa.string()), 10, "0"), "")


class _Seq:
    """Per-writer sequence numbers 0, 1, 2, ... across chunks."""

    def __init__(self) -> None:
        self.next = np.zeros(len(SRCS), np.int64)

    def assign(self, src: I64) -> I64:
        seq = np.empty(len(src), np.int64)
        for code in np.unique(src):
            m = src == code
            seq[m] = self.next[code] + np.arange(int(m.sum()))
            self.next[code] += int(m.sum())
        return seq


def _take(values: list[str | None], codes: I64) -> pa.Array:
    return pc.take(pa.array(values, pa.string()), pa.array(codes))


def _chunk(
    rng: np.random.Generator, first_op: int, n: int, rate: float, t_end: int, seq: _Seq
) -> tuple[pa.Table, dict[str, Any]]:
    """Return one chunk of operations' events (sorted by op) and its plan."""
    plan = _ops_plan(rng, n, rate)
    ops, order, types, stage_of = _blocks(rng, plan)
    lens = BLOCK_LEN[types]
    ev = np.repeat(np.arange(len(types)), lens)
    kind = KIND_TABLE[types[ev], np.arange(len(ev)) - np.repeat(np.cumsum(lens) - lens, lens)]
    op, stage = ops[ev], stage_of[ev]
    # timestamps: arrival rate, a per-op step between events, 300 ms restart after each crash
    start = T0 + (first_op + np.arange(n)) * (1_000_000_000 // OPS_PER_S) + rng.integers(0, 100_000, n)
    inc = rng.integers(200_000, 2_000_000, n)[op] + (kind == KINDS.index(K.CRASH)) * 300_000_000
    csum = np.cumsum(inc)
    op_first = np.searchsorted(op, np.arange(n))
    at = np.minimum(op_first, len(op) - 1)
    base = np.where(op_first < len(op), csum[at] - inc[at], 0)
    ts = start[op] + csum - inc - base[op]
    is_inv = kind == KINDS.index(K.RESIDUE_INVARIANT)
    residue = np.isin(kind, [KINDS.index(K.RESIDUE_EFFECT), KINDS.index(K.RESIDUE_QUEUE)]) | is_inv
    ts[residue] = t_end + first_op + op[residue]
    sink = np.isin(kind, [KINDS.index(K.DOWNSTREAM), KINDS.index(K.DEAD_LETTER)])
    skewed = sink & (rng.random(n) < 0.001)[op]  # the sink's clock runs 5 s behind for a few ops
    ts[skewed] -= 5_000_000_000
    src = np.where(stage >= 0, 4 + stage * WORKERS_PER_STAGE + (first_op + op) % WORKERS_PER_STAGE, 0)
    src = np.where(sink, 1, np.where(residue, 2, src))
    in_stage = stage >= 0
    attempt = np.where(in_stage, (order[ev] - 1) % 64 + 1, 0)
    op_ids = pc.take(_op_ids(first_op, n), pa.array(op))
    is_deliver = kind == KINDS.index(K.DELIVER)
    table = pa.table(
        {
            "ts_ns": pa.array(ts),
            "src": pc.take(SRC_NAMES, pa.array(src)),
            "pid": pa.array((1000 + src).astype(np.int32)),
            "seq": pa.array(seq.assign(src)),
            "kind": pc.take(KIND_NAMES, pa.array(kind)),
            "op": op_ids,
            "msg": pc.binary_join_element_wise(
                op_ids, _take(["#0", "#1", "#2", None], np.where(in_stage, stage, 3)), ""
            ),
            "stage": _take(["stage-0", "stage-1", "stage-2", None], np.where(in_stage, stage, 3)),
            "dest": _take(["orders", "payments", "shipping", None], np.where(in_stage, stage, 3)),
            "attempt": pa.array(attempt.astype(np.int32), mask=~in_stage),
            "point": _take([None, "before_db_commit"], (kind == KINDS.index(K.CRASH)).astype(np.int64)),
            "partition": pa.nulls(len(ts), pa.int32()),
            "offset": pa.nulls(len(ts), pa.int64()),
            "detail": _take(
                ["{}", '{"redelivered": true}', INVARIANT_DETAIL],
                np.where(is_inv, 2, (is_deliver & (attempt > 1)).astype(np.int64)),
            ),
            "op_bucket": pa.array((((first_op + op) * 2654435761) % OP_BUCKETS).astype(np.int32)),
            "op_id": pa.array(first_op + op),  # "op-%010d" sorts as its number
        }
    )
    return table, plan


def _run_rows(
    t_end: int, t_busy: int, n_windows: int, rng: np.random.Generator, seq: _Seq
) -> tuple[pa.Table, list[Any]]:
    """Return the events without an operation: run start/end, worker starts, fault windows."""
    rows: list[tuple[int, int, Kind, str | None]] = [(T0 - 1_000_000, 0, K.RUN_START, None)]
    rows += [(T0 - 500_000, code, K.WORKER_START, None) for code in range(4, len(SRCS))]
    windows = []
    span = (t_busy - T0) // max(n_windows, 1)
    for i in range(n_windows):
        s = T0 + i * span + int(rng.integers(0, max(span // 2, 1)))
        e = s + int(rng.integers(span // 20, span // 3 + 2))
        name = FAULTS[i % len(FAULTS)]
        rows += [(s, 3, K.FAULT_START, name), (e, 3, K.FAULT_END, name)]
        windows.append([name, s, e])
    rows.append((t_end + 10**12, 0, K.RUN_END, None))
    src = np.array([r[1] for r in rows], np.int64)
    n = len(rows)
    table = pa.table(
        {
            "ts_ns": pa.array([r[0] for r in rows], pa.int64()),
            "src": pc.take(SRC_NAMES, pa.array(src)),
            "pid": pa.array((1000 + src).astype(np.int32)),
            "seq": pa.array(seq.assign(src)),
            "kind": pa.array([str(r[2]) for r in rows]),
            **{c: pa.nulls(n, pa.string()) for c in ("op", "msg", "stage", "dest")},
            "attempt": pa.nulls(n, pa.int32()),
            "point": pa.array([r[3] for r in rows], pa.string()),
            "partition": pa.nulls(n, pa.int32()),
            "offset": pa.nulls(n, pa.int64()),
            "detail": pa.array(["{}"] * n),
            "op_bucket": pa.array(np.zeros(n, np.int32)),
            "op_id": pa.nulls(n, pa.int64()),
        }
    )
    return table, windows


def synth_run(out_dir: Path, events: int, seed: int, anomaly_rate: float = 1e-3, *, windows: int | None = None) -> Path:
    """Write a synthetic run folder of about ``events`` events into ``out_dir``; return it.

    ``windows``: how many fault windows (default: one per 100,000 operations, 3 to 60).

    ``out_dir`` must be new or empty (``check_out_dir``). The folder is written as a hidden sibling
    and renamed into place once whole, so a failure leaves nothing behind.

    >>> synth_run(Path("reports/runs/synth-1m"), 1_000_000, seed=1)
    """
    check_out_dir(out_dir, events)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{secrets.token_hex(4)}"
    try:
        _write_run(tmp, out_dir.name, events, seed, anomaly_rate, windows)
        if out_dir.is_dir():
            out_dir.rmdir()  # empty (checked above); a file appearing since makes this fail, not lose it
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write_run(
    out_dir: Path, run_id: str, events: int, seed: int, anomaly_rate: float, windows: int | None = None
) -> None:
    started = time.time()
    rng = np.random.default_rng(seed)
    n_ops = max(1, int(events / EVENTS_PER_OP))
    n_buckets = n_buckets_for(events)
    chunk_ops = max(200_000, n_buckets * 15_000)
    t_end = T0 + n_ops * (1_000_000_000 // OPS_PER_S) + 60_000_000_000
    seq = _Seq()
    ledger = out_dir / "ledger"
    ledger.mkdir(parents=True, exist_ok=True)
    writer = BucketWriter(ledger / PARQUET_NAME, n_buckets)
    truth = dict.fromkeys(INJECTED, 0)
    sample: dict[str, list[str]] = {c: [] for c in INJECTED}
    written = 0
    for first in range(0, n_ops, chunk_ops):
        n = min(chunk_ops, n_ops - first)
        table, plan = _chunk(rng, first, n, anomaly_rate, t_end, seq)
        writer.write(table)
        written += table.num_rows
        for i, name in enumerate(INJECTED):
            hits = np.flatnonzero(plan["cls"] == i)
            truth[name] += len(hits)
            sample[name] += [f"op-{first + int(h):010d}" for h in hits[: 10 - len(sample[name])]]
    for name, also in ALSO_EXPECTED.items():
        for other in also:
            truth[other] += truth[name]
    n_windows = int(min(60, max(3, n_ops // 100_000))) if windows is None else windows
    run_rows, opened = _run_rows(t_end, t_end - 59_000_000_000, n_windows, rng, seq)
    writer.write(run_rows)
    written += run_rows.num_rows
    writer.close(written)
    manifest = {
        "run_id": run_id,
        "scenario": "synthetic",
        "seed": seed,
        "synthetic": True,
        "events": written,
        "operations": n_ops,
        "anomaly_rate": anomaly_rate,
        "ground_truth": truth,
        "ground_truth_sample": sample,
        "fault_windows": opened,
        "contract": CONTRACT,
        "ledger_schema": SCHEMA_VERSION,
        "started_at": started,
        "ended_at": time.time(),
        "complete": True,  # generated whole, end-state snapshot included
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
