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

import contextlib
import json
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
# Columns with about one value an event (times, sequence numbers, ids, details): written without
# a dictionary. Parquet's writer builds one for every column by default and falls back to plain
# pages once it outgrows its page; for these that was wasted work. Measured on a 200,000-op Kafka
# soak's 1.6M events: 0.43 s and 13 MB written against 0.75 s and 20 MB; the DuckDB engine reads a
# 10M-event synthetic ledger within a few percent of the time it took before (docs/benchmarks.md).
_UNIQUE_COLUMNS = frozenset({"ts_ns", "seq", "op", "msg", "offset", "detail", "op_id"})
_DICTIONARY_COLUMNS = [name for name in PARQUET_SCHEMA.names if name not in _UNIQUE_COLUMNS]
# Data pages of 16 KB, not pyarrow's 1 MB: a verdict's witnesses are a few hundred operations spread
# over the whole id range, and DuckDB decompresses only the pages that hold a selected row. At 10.5M
# events (DuckDB 2.0) the lookup of 834 witnesses' events took 0.37-0.44 s against 0.73-0.74 s, the
# summaries of both engines the same; writing a part costs about 10 % more CPU (docs/benchmarks.md).
PAGE_BYTES = 16 << 10
# The sorted integer columns as deltas (Parquet's DELTA_BINARY_PACKED), not plain values: inside a
# bucket the rows run in (op, ts_ns) order, so ``op_id`` steps by 0 or 1, and ``ts_ns`` and ``seq``
# by far less than their 64-bit values. Rewriting the 10.5M-event synthetic ledger's parts: written in
# 3.1-3.2 s against 3.5-3.6 s, 69 MB against 78 MB, and DuckDB reads ``ts_ns`` in 0.039 s against 0.057 s.
DELTA_COLUMNS = ("ts_ns", "seq", "op_id")
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


def op_buckets(ops: pa.Array) -> pa.Array:
    """Return the op_bucket of each of the distinct op ids ``ops``."""
    return pa.array([op_bucket_of(o) for o in ops.to_pylist()], pa.int32())


def op_bucket_column(buckets: pa.Array, index: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Return each row's op_bucket, given ``op_buckets`` of the distinct op ids and each row's
    position among them (``index``, null without an op: bucket 0). One hash per distinct op, not per row."""
    return pc.fill_null(pc.take(buckets, index), 0)


def bucket_path(root: Path, bucket: int, file: int = 0) -> Path:
    """Return file ``file`` of bucket ``bucket``: Spark reads the bucket from the digits after the
    last underscore, and numbers a task's files of one bucket ``c000``, ``c001``... the same way."""
    return root / f"part-{bucket:05d}_{bucket:05d}.c{file:03d}.parquet"


# Each bucket is written as up to this many files, a bucket's row groups handed to them in turn and
# written on as many threads: Parquet's encoder runs on one core a file, and at a soak's close it was
# half the compaction (a 200,000-op Kafka soak's 1.6M events: 0.8 s of 2.0). Every file of a bucket
# holds its rows in (op, ts_ns, src, seq) order; Spark's bucketed scan reads a bucket's files as one.
WRITE_LANES = 2


class BucketWriter:
    """Write rows into ``n_buckets`` buckets under ``root``, one row group per bucket per ``write``.

    A bucket's successive row groups go to its ``WRITE_LANES`` files in turn, each written on a
    thread of its own while the caller prepares the next; at most ``WRITE_LANES`` writes are in
    flight, so memory holds that many row groups more, and one file is never written by two
    threads (its next row group waits for the ``WRITE_LANES`` writes before it).
    """

    def __init__(self, root: Path, n_buckets: int) -> None:
        self.root = root
        self.n_buckets = n_buckets
        self._map = file_bucket_table(n_buckets)
        self._srcs: dict[str, int] = {}  # writer name -> src_code, in the order first seen
        self._writers_seen: dict[tuple[str, int, str, bool], list[int]] = {}  # see ``writer_counts``
        self._requests: list[dict[str, Any]] = []  # see ``recorded_requests``
        root.mkdir(parents=True, exist_ok=True)
        # the first file of every bucket now, as before (a bucket with no rows has an empty file);
        # the others when a bucket first has a second row group
        self._files: dict[tuple[int, int], pq.ParquetWriter] = {(b, 0): self._open(b, 0) for b in range(n_buckets)}
        self._turns = [0] * n_buckets  # row groups written to each bucket so far
        self._lanes = ThreadPoolExecutor(WRITE_LANES, thread_name_prefix="txchaos-parquet")
        self._flying: deque[Future[None]] = deque()

    def _open(self, bucket: int, file: int) -> pq.ParquetWriter:
        return pq.ParquetWriter(
            bucket_path(self.root, bucket, file),
            PARQUET_SCHEMA,
            compression="zstd",
            use_dictionary=_DICTIONARY_COLUMNS,
            data_page_size=PAGE_BYTES,
            column_encoding=dict.fromkeys(DELTA_COLUMNS, "DELTA_BINARY_PACKED"),
        )

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
        if len(files) and (files == files[0]).all():  # compaction writes one bucket at a time
            self._put(int(files[0]), table)
            return
        order = np.argsort(files, kind="stable")
        bounds = np.searchsorted(files[order], np.arange(self.n_buckets + 1))
        for b in range(self.n_buckets):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            if hi > lo:
                self._put(b, table.take(order[lo:hi]))

    def _put(self, bucket: int, rows: pa.Table) -> None:
        """Write ``rows`` as the next row group of ``bucket``, on a lane."""
        file = self._turns[bucket] % WRITE_LANES
        self._turns[bucket] += 1
        if (bucket, file) not in self._files:
            self._files[bucket, file] = self._open(bucket, file)
        while len(self._flying) >= WRITE_LANES:
            self._flying.popleft().result()  # a failed write is raised here, or at ``close``
        self._flying.append(self._lanes.submit(self._files[bucket, file].write_table, rows.cast(PARQUET_SCHEMA)))

    def _land(self) -> None:
        """Wait for every write in flight; raise the first that failed once all have ended."""
        failed: BaseException | None = None
        while self._flying:
            try:
                self._flying.popleft().result()
            except BaseException as exc:  # the others still finish before their files close
                failed = failed or exc
        if failed is not None:
            raise failed

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

    def abandon(self) -> None:
        """Wait for the writes in flight and close every file, ignoring their errors (a failed
        compaction, whose folder is thrown away); safe to repeat, and after ``close``. An interrupt
        while it waits is not ignored: it is raised once the writes have ended."""
        try:
            with contextlib.suppress(Exception):
                self._land()
        finally:
            self._lanes.shutdown()  # waits for a write still running, whatever interrupted the wait
            for w in self._files.values():
                with contextlib.suppress(OSError, pa.ArrowException):
                    w.close()
            self._files.clear()

    def close(self, events: int, *, damaged_lines: dict[str, int] | None = None) -> None:
        """Close the bucket files and write ``_layout.json``; ``damaged_lines`` (segment -> lines
        skipped while compacting) is recorded there so every engine reports it."""
        try:
            self._land()
            for w in self._files.values():
                w.close()
        finally:
            self.abandon()
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


SPILL_PARTS = 16  # a power of two: each file bucket is a union of spill parts, or a share of one
_SPILL_IPC = pa.ipc.IpcWriteOptions(compression="lz4")
_SORTED_SLICE = 250_000  # rows handed to the bucket writer at a time (one row group each)
_OPS_NAME = "ops-{:02d}.arrow"  # a spill part's distinct op ids, a batch per flush


class BucketSpill:
    """Events in any order, spilled to disk by file bucket, read back one bucket at a time in
    (op, ts_ns, src, seq) order with ``op_bucket`` and ``op_id``.

    Compaction goes through it so that memory holds one bucket (about 3M events at most, see
    ``n_buckets_for``), never the whole ledger. The bucket count is known only once every event is
    in: the spill is partitioned by the bucket hash modulo ``SPILL_PARTS``, and since every bucket
    count is a power of two, a file bucket is the union of the parts congruent to it (fewer buckets)
    or the rows of one part that hash to it (more).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows = 0
        self._parts = file_bucket_table(SPILL_PARTS)
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        # Each flush's distinct op ids, spilled too, by part: a live run's driver holds none of them.
        self._ops: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        root.mkdir(parents=True, exist_ok=True)

    def add(self, table: pa.Table) -> None:
        """Take events (``ARROW_SCHEMA`` columns) in any order."""
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= _SORTED_SLICE:
            self.flush()

    def flush(self) -> None:
        """Spill what ``add`` holds in memory now (it spills by itself every ``_SORTED_SLICE`` rows)."""
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        self.rows += table.num_rows
        ops = pc.unique(table["op"]).drop_null()
        lookup = op_buckets(ops)
        self._remember(ops, self._parts[lookup.to_numpy()])
        buckets = op_bucket_column(lookup, pc.index_in(table["op"], value_set=ops))
        table = table.append_column("op_bucket", buckets)
        parts = self._parts[buckets.to_numpy(zero_copy_only=False)]
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(SPILL_PARTS + 1))
        # One take, then a slice per part: a take from a table of many chunks (a chunk per segment
        # read) costs about as much as the whole table, so sixteen of them cost two to three times this.
        table = table.take(order)
        for p in range(SPILL_PARTS):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if hi > lo:
                if p not in self._writers:
                    self._writers[p] = pa.ipc.new_stream(self._path(p), table.schema, options=_SPILL_IPC)
                self._writers[p].write_table(table.slice(lo, hi - lo))

    def _remember(self, ops: pa.Array, parts: npt.NDArray[np.int32]) -> None:
        """Spill distinct op ids, each to the ops stream of its spill part (``parts``)."""
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(SPILL_PARTS + 1))
        ops = ops.cast(pa.string()).take(pa.array(order))
        for p in range(SPILL_PARTS):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if hi > lo:
                batch = pa.record_batch([ops.slice(lo, hi - lo)], names=["op"])
                if p not in self._ops:
                    path = str(self.root / _OPS_NAME.format(p))
                    self._ops[p] = pa.ipc.new_stream(path, batch.schema, options=_SPILL_IPC)
                self._ops[p].write_batch(batch)

    def _part_ops(self, part: int) -> pa.Array:
        """Return the op ids spilled to ``part``, once each, in no order."""
        held: list[pa.Array] = []
        rows = distinct = 0
        with pa.ipc.open_stream(str(self.root / _OPS_NAME.format(part))) as reader:
            for batch in reader:  # merged now and then: memory holds about twice the distinct ids
                held.append(batch.column(0))
                rows += batch.num_rows
                if rows > max(1_000_000, 2 * distinct):
                    held = [pc.unique(pa.chunked_array(held, pa.string()))]
                    rows = distinct = len(held[0])
        return pc.unique(pa.chunked_array(held, pa.string()))

    def _ranked_ops(self) -> dict[int, tuple[pa.Array, pa.Array]]:
        """Return spill part -> (its op ids, once each; their ``op_id``: each one's rank among every
        op id spilled, in string order).

        An op id is in one part only, so the parts' sets are found apart (hash tables a part's size)
        and sorted once together; a bucket then looks its rows' ids up among its parts' alone.
        """
        parts = sorted(self._ops)
        found = [self._part_ops(p) for p in parts]
        order = pc.sort_indices(pa.chunked_array(found, pa.string())).to_numpy()
        ranks = np.empty(len(order), np.int64)
        ranks[order] = np.arange(len(order), dtype=np.int64)
        ends = np.cumsum([0, *map(len, found)])
        return {
            p: (ops, pa.array(ranks[ends[i] : ends[i + 1]]))
            for i, (p, ops) in enumerate(zip(parts, found, strict=True))
        }

    def _path(self, part: int) -> str:
        return str(self.root / f"part-{part:02d}.arrow")

    def close(self) -> None:
        """Close the spill files (they stay readable); safe to repeat."""
        for w in [*self._writers.values(), *self._ops.values()]:
            w.close()

    def sorted_buckets(self, n_buckets: int) -> Iterator[tuple[int, pa.Table]]:
        """Yield (file bucket, rows) in bucket order, each bucket's rows in (op, ts_ns, src, seq)
        order over one or more slices."""
        self.flush()
        self.close()
        ops = self._ranked_ops()
        pa.default_memory_pool().release_unused()
        for b in range(n_buckets):
            table = self._bucket(b, n_buckets, ops)
            if table is None:
                continue
            order = pc.sort_indices(
                table, [("op_id", "ascending"), ("ts_ns", "ascending"), ("src", "ascending"), ("seq", "ascending")]
            )
            for lo in range(0, len(order), _SORTED_SLICE):
                yield b, table.take(order[lo : lo + _SORTED_SLICE])
            del table, order  # one bucket in memory at a time: free this one before reading the next
        # Handed back once all are sorted, not after each bucket: the next bucket reuses what this
        # one freed. Handing it back each time made every bucket fault its pages in anew: the close
        # of a 1M-op Kafka soak's 8M events took 7.5-8.2 s (3.0-3.2 s of it system time) against
        # 6.9-7.0 s (1.6-1.8 s), with the same peak.
        pa.default_memory_pool().release_unused()

    def _bucket(self, b: int, n_buckets: int, ops: dict[int, tuple[pa.Array, pa.Array]]) -> pa.Table | None:
        """Return file bucket ``b``'s spilled rows with ``op_id``, unsorted, one chunk per column
        (None when it has none)."""
        parts = [b % SPILL_PARTS] if n_buckets >= SPILL_PARTS else [p for p in range(SPILL_PARTS) if p % n_buckets == b]
        parts = [p for p in parts if p in self._writers]
        if not parts:
            return None
        table = pa.concat_tables([pa.ipc.open_stream(self._path(p)).read_all() for p in parts])
        if n_buckets > SPILL_PARTS:
            table = table.filter(pa.array(file_bucket_table(n_buckets)[table["op_bucket"].to_numpy()] == b))
        # One chunk per column: a take from a column of many chunks (one per spilled batch, hundreds
        # once a live run spills every few seconds) costs about the whole column each time, and the
        # bucket is taken in slices (8M events: 9 s of takes, 2.5 s this way). Combined a column at
        # a time, so memory holds the bucket and one column more, not the bucket twice.
        schema, columns = table.schema, table.columns
        del table
        for i, column in enumerate(columns):
            columns[i] = column.combine_chunks()
            del column
        table = pa.Table.from_arrays(columns, schema=schema)
        known = [ops[p] for p in parts if p in ops]  # a part of rows without an op has no ids
        ids = pa.chunked_array([i for i, _ in known], pa.string()).combine_chunks()
        ranks = pa.chunked_array([r for _, r in known], pa.int64()).combine_chunks()
        return table.append_column("op_id", pc.take(ranks, pc.index_in(table["op"], value_set=ids)))


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
