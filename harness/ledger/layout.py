"""The compacted ledger layout: ``events.parquet/`` as hash buckets of operation ids.

Every event of one operation lands in the same bucket file, sorted by ``op`` inside it, so an
engine can summarize operations bucket by bucket without moving rows between workers. The files
follow Spark's bucketed-table convention (``..._{bucket:05d}.parquet``, bucket =
``pmod(murmur3(op_bucket), n_buckets)``), so Spark reads them as a table bucketed by
``op_bucket`` and plans the per-operation group-by without a shuffle. Any reader that ignores the
convention (pyarrow, ``read_ledger``) simply sees one dataset.

Three more derived columns let an engine group and count by integers instead of strings:
``op_id`` (int64, the operation's rank among the run's operation ids in string order, null
without one), so grouping and ordering compare integers; ``kind_code`` (int8, the kind's position
in ``Kind``, -1 for a kind this version does not know); and ``src_code`` (int32, the writer name's
index in the ``srcs`` list of ``_layout.json``).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.ledger.schema import ARROW_SCHEMA, SCHEMA_VERSION, Kind

OP_BUCKETS = 1024  # range of the op_bucket column; file buckets are a coarser hash of it
LAYOUT_NAME = "_layout.json"
LAYOUT_VERSION = 2  # 2: op_id, kind_code, src_code
PARQUET_SCHEMA = pa.schema(
    [
        *ARROW_SCHEMA,
        pa.field("op_bucket", pa.int32(), nullable=False),
        pa.field("op_id", pa.int64()),
        pa.field("kind_code", pa.int8(), nullable=False),
        pa.field("src_code", pa.int32(), nullable=False),
    ]
)
KIND_CODES: dict[str, int] = {str(k): i for i, k in enumerate(Kind)}
# The rare control events every verification reads (arms and fault windows: a few per run), kept
# in ``_layout.json`` at compaction with these columns, so no engine scans the ledger for them.
REQUEST_KINDS: tuple[Kind, ...] = (Kind.ARM, Kind.FAULT_START, Kind.FAULT_END)
REQUEST_COLUMNS: tuple[str, ...] = ("ts_ns", "src", "seq", "kind", "op", "point", "detail")


def kind_codes(kinds: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Return the ``kind_code`` column for a ``kind`` column."""
    names = pa.array(list(KIND_CODES), pa.string())
    return pc.fill_null(pc.index_in(kinds, value_set=names), -1).cast(pa.int8())


def n_buckets_for(events: int) -> int:
    """Return the file-bucket count for a ledger of ``events`` rows: ~3M rows a bucket, 4..256."""
    n = 4
    while n < 256 and n * 3_000_000 < events:
        n *= 2
    return n


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Return Spark's ``hash(int)`` (Murmur3_x86_32, seed 42) as a signed 32-bit integer."""
    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
    k = (k * 0x1B873593) & 0xFFFFFFFF
    h = seed ^ k
    h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h = _fmix(h ^ 4)
    return h - (1 << 32) if h >= 1 << 31 else h


def file_bucket_table(n_buckets: int) -> npt.NDArray[np.int32]:
    """Return op_bucket -> file bucket, exactly as Spark's bucketed scan assumes."""
    return np.array([spark_hash_int(b) % n_buckets for b in range(OP_BUCKETS)], dtype=np.int32)


def op_bucket_of(op: str | None) -> int:
    """Return the op_bucket of one operation id (null ops go to bucket 0)."""
    return 0 if op is None else zlib.crc32(op.encode()) % OP_BUCKETS


def bucket_path(root: Path, bucket: int) -> Path:
    return root / f"part-{bucket:05d}_{bucket:05d}.c000.parquet"


class BucketWriter:
    """Write rows into ``n_buckets`` bucket files under ``root``, one row group per ``write`` call."""

    def __init__(self, root: Path, n_buckets: int) -> None:
        self.root = root
        self.n_buckets = n_buckets
        self._map = file_bucket_table(n_buckets)
        self._srcs: dict[str, int] = {}  # writer name -> src_code, in the order first seen
        self._writers_seen: dict[tuple[str, int, str, bool], list[int]] = {}  # see ``writer_counts``
        self._requests: list[dict[str, Any]] = []  # see ``recorded_requests``
        root.mkdir(parents=True, exist_ok=True)
        self._writers = [
            pq.ParquetWriter(bucket_path(root, b), PARQUET_SCHEMA, compression="zstd") for b in range(n_buckets)
        ]

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (sorted by op, with ``op_bucket`` and ``op_id``) split into its buckets.

        Keeps each op whole; adds ``kind_code`` and ``src_code``.
        """
        for name in pc.unique(table["src"]).to_pylist():
            self._srcs.setdefault(name, len(self._srcs))
        srcs = pc.index_in(table["src"], value_set=pa.array(list(self._srcs), pa.string()))
        self._count_writers(table)
        wanted = pc.is_in(table["kind"], value_set=pa.array([str(k) for k in REQUEST_KINDS], pa.string()))
        self._requests += table.filter(wanted).select(list(REQUEST_COLUMNS)).to_pylist()
        table = table.append_column("kind_code", kind_codes(table["kind"]))
        table = table.append_column("src_code", srcs.cast(pa.int32()))
        files = self._map[table["op_bucket"].to_numpy()]
        order = np.argsort(files, kind="stable")
        bounds = np.searchsorted(files[order], np.arange(self.n_buckets + 1))
        for b in range(self.n_buckets):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            if hi > lo:
                self._writers[b].write_table(table.take(order[lo:hi]).cast(PARQUET_SCHEMA))

    def _count_writers(self, table: pa.Table) -> None:
        keyed = table.select(["src", "pid", "kind", "seq"]).append_column("has_op", pc.is_valid(table["op"]))
        stats = keyed.group_by(["src", "pid", "kind", "has_op"]).aggregate(
            [("seq", "count"), ("seq", "min"), ("seq", "max")]
        )
        names = ["src", "pid", "kind", "has_op", "seq_count", "seq_min", "seq_max"]
        for src, pid, kind, has_op, n, lo, hi in zip(*(stats[c].to_pylist() for c in names), strict=True):
            acc = self._writers_seen.setdefault((src, pid, kind, has_op), [0, lo, hi])
            acc[0] += n
            acc[1], acc[2] = min(acc[1], lo), max(acc[2], hi)

    def close(self, events: int, *, damaged_lines: dict[str, int] | None = None) -> None:
        """Close the bucket files and write ``_layout.json``; ``damaged_lines`` (segment -> lines
        skipped while compacting) is recorded there so every engine reports it."""
        for w in self._writers:
            w.close()
        meta = {
            "version": SCHEMA_VERSION,
            "layout": LAYOUT_VERSION,
            "n_buckets": self.n_buckets,
            "bucket_column": "op_bucket",
            "op_buckets": OP_BUCKETS,
            "events": events,
            "srcs": list(self._srcs),
            "writers": [[*key, *acc] for key, acc in sorted(self._writers_seen.items())],
            "requests": sorted(self._requests, key=lambda r: (r["ts_ns"], r["src"], r["seq"])),
            "damaged_lines": dict(sorted((damaged_lines or {}).items())),
        }
        (self.root / LAYOUT_NAME).write_text(json.dumps(meta, indent=2))


def writer_counts(layout: dict[str, Any]) -> dict[tuple[str, int, str, bool], tuple[int, int, int]] | None:
    """Return (src, pid, kind, has_op) -> (events, lowest seq, highest seq) as counted at compaction,
    or None for a ledger compacted before they were recorded (an engine then counts them itself).

    Counted while the parts are written, so no engine scans the whole ledger again for them.
    """
    rows = layout.get("writers")
    if not isinstance(rows, list):
        return None
    return {(str(s), int(p), str(k), bool(h)): (int(n), int(lo), int(hi)) for s, p, k, h, n, lo, hi in rows}


def recorded_requests(layout: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Return the ledger's ``REQUEST_KINDS`` rows (``REQUEST_COLUMNS``) as recorded at compaction, or
    None for a ledger compacted before they were (an engine then selects them itself)."""
    rows = layout.get("requests")
    return [dict(r) for r in rows] if isinstance(rows, list) else None


def read_layout(root: Path) -> dict[str, Any] | None:
    """Return the layout metadata of a bucketed ``events.parquet`` directory, or None."""
    meta = root / LAYOUT_NAME
    if not meta.is_file():
        return None
    raw: dict[str, Any] = json.loads(meta.read_text())
    return raw
