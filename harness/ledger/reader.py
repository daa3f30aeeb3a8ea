"""Read a run's ledger: JSON-lines segments, or the compacted ``events.parquet``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.errors import ConfigError
from harness.ledger.layout import OP_BUCKETS, BucketWriter, n_buckets_for, op_bucket_of
from harness.ledger.schema import ARROW_SCHEMA, COLUMNS

PARQUET_NAME = "events.parquet"


def _read_segment(path: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # a torn last line cannot happen with one write per event, but never trust it
            rows.append(json.loads(raw))
    return rows


def read_segments(ledger_dir: Path) -> pa.Table:
    """Return every event in the segments as one table, in (ts_ns, src, seq) order."""
    rows: list[dict[str, object]] = []
    for seg in sorted((ledger_dir / "segments").glob("*.jsonl")):
        rows.extend(_read_segment(seg))
    columns = {c: [r.get(c) for r in rows] for c in COLUMNS}
    table = pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
    return table.sort_by([("ts_ns", "ascending"), ("src", "ascending"), ("seq", "ascending")])


def with_op_bucket(table: pa.Table) -> pa.Table:
    """Return ``table`` with its ``op_bucket`` and ``op_id`` columns, sorted by (op, ts_ns, src, seq)."""
    unique = table["op"].unique().drop_null()
    ops = pc.take(unique, pc.sort_indices(unique))
    lookup = pa.array([op_bucket_of(o) for o in ops.to_pylist()], pa.int32())
    op_id = pc.index_in(table["op"], value_set=ops)
    table = table.append_column("op_bucket", pc.fill_null(pc.take(lookup, op_id), 0))
    table = table.append_column("op_id", op_id.cast(pa.int64()))
    return table.sort_by([("op", "ascending"), ("ts_ns", "ascending"), ("src", "ascending"), ("seq", "ascending")])


def compact(ledger_dir: Path) -> Path:
    """Write the segments as the bucketed ``events.parquet/`` directory; the segments stay as written.

    Safe to repeat: the new directory replaces the old one only once it is complete.
    """
    table = with_op_bucket(read_segments(ledger_dir))
    out = ledger_dir / PARQUET_NAME
    tmp = ledger_dir / (PARQUET_NAME + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    writer = BucketWriter(tmp, n_buckets_for(table.num_rows))
    writer.write(table)
    writer.close(table.num_rows)
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    tmp.rename(out)
    return out


def read_ledger(ledger_dir: Path) -> pa.Table:
    """Return the run's events: the compacted parquet when present, else the live segments."""
    parquet = ledger_dir / PARQUET_NAME
    if parquet.exists():
        # a directory is the bucketed layout, a file the v1 single file; both read as one dataset
        table = pq.read_table(parquet, columns=list(COLUMNS))
        return table.cast(ARROW_SCHEMA)
    if (ledger_dir / "segments").is_dir():
        return read_segments(ledger_dir)
    raise ConfigError(
        f"no ledger in {ledger_dir}",
        hint="pass a run folder written by `txchaos run` (it holds ledger/segments or ledger/events.parquet)",
    )


__all__ = ["OP_BUCKETS", "PARQUET_NAME", "compact", "read_ledger", "read_segments", "with_op_bucket"]
