"""Read a run's ledger: JSON-lines segments, or the compacted ``events.parquet``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import ConfigError
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


def compact(ledger_dir: Path) -> Path:
    """Write the segments as ``events.parquet`` sorted by operation; the segments stay as written."""
    table = read_segments(ledger_dir)
    table = table.sort_by([("op", "ascending"), ("ts_ns", "ascending")])
    out = ledger_dir / PARQUET_NAME
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=1_000_000)
    tmp.replace(out)
    return out


def read_ledger(ledger_dir: Path) -> pa.Table:
    """Return the run's events: the parquet file when compacted, else the live segments."""
    parquet = ledger_dir / PARQUET_NAME
    if parquet.exists():
        return pq.read_table(parquet, schema=ARROW_SCHEMA)
    if (ledger_dir / "segments").is_dir():
        return read_segments(ledger_dir)
    raise ConfigError(
        f"no ledger in {ledger_dir}",
        hint="pass a run folder written by `txchaos run` (it holds ledger/segments or ledger/events.parquet)",
    )
