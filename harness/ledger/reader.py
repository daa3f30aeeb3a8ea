"""Read a run's ledger: JSON-lines segments, or the compacted ``events.parquet``.

A segment line that is torn (no newline: the writer died inside its one ``write``) or otherwise
unreadable is *damaged*: it is counted per segment and skipped alone, and the lines after it are
read as usual. A torn write followed by the next event glues the two on one line; the event after
the tear is recovered (every row starts with ``{"ts_ns":``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from harness.errors import ConfigError, IncompleteEvidence
from harness.ledger.layout import LAYOUT_NAME, OP_BUCKETS, BucketWriter, n_buckets_for, op_bucket_of, read_layout
from harness.ledger.schema import ARROW_SCHEMA, COLUMNS

PARQUET_NAME = "events.parquet"
ROW_START = b'{"ts_ns":'  # what every row the writer emits begins with
_REQUIRED: dict[str, type | tuple[type, ...]] = {"ts_ns": int, "src": str, "pid": int, "seq": int, "kind": str}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "op": str,
    "msg": str,
    "stage": str,
    "dest": str,
    "attempt": int,
    "point": str,
    "partition": int,
    "offset": int,
    "detail": str,
}


def _parse(raw: bytes) -> dict[str, Any] | None:
    """Return one row, or None when the bytes are not a whole, well-typed ledger row."""
    try:
        row = json.loads(raw)
    except ValueError:  # also UnicodeDecodeError
        return None
    if not isinstance(row, dict):
        return None
    for col, typ in _REQUIRED.items():
        if not isinstance(row.get(col), typ) or isinstance(row.get(col), bool):
            return None
    for col, typ in _OPTIONAL.items():
        if row.get(col) is not None and (not isinstance(row[col], typ) or isinstance(row[col], bool)):
            return None
    return row


def read_segment(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Return the readable rows of one segment and how many lines were damaged (each skipped alone)."""
    rows: list[dict[str, Any]] = []
    damaged = 0
    with path.open("rb") as fh:
        for raw in fh:
            row = _parse(raw) if raw.endswith(b"\n") else None
            if row is None:
                damaged += 1
                # a torn write and the next event on one line: keep the event after the tear
                at = raw.rfind(ROW_START)
                tail = _parse(raw[at:]) if at > 0 and raw.endswith(b"\n") else None
                if tail is not None:
                    rows.append(tail)
                continue
            rows.append(row)
    return rows, damaged


_LOOSE = pa.schema([f.with_nullable(True) for f in ARROW_SCHEMA])  # what Arrow's reader fills, checked after
_ARROW_JSON = pa_json.ParseOptions(explicit_schema=_LOOSE, unexpected_field_behavior="ignore")


def _arrow_segment(path: Path) -> pa.Table | None:
    """Return a whole, well-typed segment read by Arrow's JSON reader; None when any line is not.

    A segment of millions of events read line by line into dicts takes about 1.5 KB an event;
    Arrow parses it in C++ into columns (about a tenth). Any damaged line (torn, mistyped, not
    an object, a required field missing) makes Arrow refuse the file, and ``read_segment`` then
    reads it line by line, counting and skipping the damage exactly as before.
    """
    size = path.stat().st_size
    if size == 0:
        return ARROW_SCHEMA.empty_table()
    with path.open("rb") as fh:
        fh.seek(size - 1)
        if fh.read(1) != b"\n":  # a torn last line: Arrow would take a whole-looking tail
            return None
    try:
        table = pa_json.read_json(path, parse_options=_ARROW_JSON)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if any(table.column(c).null_count for c in _REQUIRED):
        return None
    try:
        return table.select(list(COLUMNS)).cast(ARROW_SCHEMA)
    except (pa.ArrowInvalid, ValueError):
        return None


def _segment_table(path: Path) -> tuple[pa.Table, int]:
    """Return one segment's readable events as a table and how many lines were damaged."""
    table = _arrow_segment(path)
    if table is not None:
        return table, 0
    rows, damaged = read_segment(path)
    columns = {c: [r.get(c) for r in rows] for c in COLUMNS}
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA), damaged


def scan_segments(ledger_dir: Path) -> tuple[pa.Table, dict[str, int]]:
    """Return every readable event in the segments, in (ts_ns, src, seq) order, and the damaged
    lines per segment file name (only segments with damage are listed)."""
    tables: list[pa.Table] = []
    damage: dict[str, int] = {}
    for seg in sorted((ledger_dir / "segments").glob("*.jsonl")):
        table, damaged = _segment_table(seg)
        tables.append(table)
        if damaged:
            damage[seg.name] = damaged
    table = pa.concat_tables(tables) if tables else ARROW_SCHEMA.empty_table()
    return table.sort_by([("ts_ns", "ascending"), ("src", "ascending"), ("seq", "ascending")]), damage


def read_segments(ledger_dir: Path) -> pa.Table:
    """Return every readable event in the segments as one table, in (ts_ns, src, seq) order."""
    return scan_segments(ledger_dir)[0]


def segment_damage(ledger_dir: Path) -> dict[str, int]:
    """Return the damaged lines per segment file name (empty when every line reads)."""
    damage: dict[str, int] = {}
    for seg in sorted((ledger_dir / "segments").glob("*.jsonl")):
        damaged = 0 if _arrow_segment(seg) is not None else read_segment(seg)[1]
        if damaged:
            damage[seg.name] = damaged
    return damage


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
    events, damage = scan_segments(ledger_dir)
    table = with_op_bucket(events)
    out = ledger_dir / PARQUET_NAME
    tmp = ledger_dir / (PARQUET_NAME + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    writer = BucketWriter(tmp, n_buckets_for(table.num_rows))
    writer.write(table)
    writer.close(table.num_rows, damaged_lines=damage)
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    tmp.rename(out)
    return out


def compacted_damage(ledger_dir: Path) -> list[str]:
    """Return what is wrong with the compacted ledger (empty: absent or sound).

    Reads each part's footer (schema and row count) and ``_layout.json``; the data pages are read
    by the engines themselves.
    """
    parquet = ledger_dir / PARQUET_NAME
    if not parquet.exists():
        return []
    parts = sorted(parquet.glob("*.parquet")) if parquet.is_dir() else [parquet]
    problems: list[str] = []
    rows = 0
    for part in parts:
        try:
            meta = pq.read_metadata(part)
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{part.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        missing = [c for c in COLUMNS if c not in meta.schema.names]
        if missing:
            problems.append(f"{part.name}: no column {', '.join(missing)}")
        rows += meta.num_rows
    if parquet.is_dir():
        try:
            layout = read_layout(parquet)
        except ValueError:
            layout = None
            problems.append(f"{LAYOUT_NAME}: not JSON")
        if layout is None and not problems:
            problems.append(f"{LAYOUT_NAME}: missing")
        elif layout is not None and not problems and int(layout.get("events", rows)) != rows:
            problems.append(f"the parts hold {rows} events, {LAYOUT_NAME} says {layout.get('events')}")
    return problems


def rebuild_compacted(ledger_dir: Path, problems: list[str]) -> str:
    """Move the damaged compacted ledger aside and compact the segments again; return one line saying so.

    Raises ``IncompleteEvidence`` when there are no segments to rebuild it from.
    """
    parquet = ledger_dir / PARQUET_NAME
    segments = sorted((ledger_dir / "segments").glob("*.jsonl"))
    if not segments:
        raise IncompleteEvidence(
            f"{parquet} is damaged ({'; '.join(problems[:3])}) and {ledger_dir / 'segments'} holds no segment "
            "to rebuild it from",
            hint="restore the run folder from a copy; nothing in this one can be verified",
        )
    aside = ledger_dir / f"{PARQUET_NAME}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**6:06d}"
    parquet.rename(aside)  # kept, never deleted: it is a record of the run
    compact(ledger_dir)
    return (
        f"rebuilt {parquet} from {len(segments)} segment(s): {'; '.join(problems[:3])}; "
        f"the damaged copy is kept as {aside.name}"
    )


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


__all__ = [
    "OP_BUCKETS",
    "PARQUET_NAME",
    "compact",
    "compacted_damage",
    "read_ledger",
    "read_segment",
    "read_segments",
    "rebuild_compacted",
    "scan_segments",
    "segment_damage",
    "with_op_bucket",
]
