"""Read a run's ledger: JSON-lines segments, or the compacted ``events.parquet``.

A segment line that is torn (no newline: the writer died inside its one ``write``) or otherwise
unreadable is *damaged*: it is counted per segment and skipped alone, and the lines after it are
read as usual. A torn write followed by the next event glues the two on one line; the event after
the tear is recovered (every row starts with ``{"ts_ns":``). A packed row (``schema.PACKED_COLUMNS``)
is unpacked into its events; one that does not unpack whole (a list of the wrong length, a value of
the wrong type) is a damaged line, all its events with it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from harness.errors import ConfigError, IncompleteEvidence
from harness.ledger.layout import (
    LAYOUT_NAME,
    OP_BUCKETS,
    BucketSpill,
    BucketWriter,
    n_buckets_for,
    op_bucket_column,
    op_buckets,
    read_layout,
)
from harness.ledger.schema import ARROW_SCHEMA, COLUMNS, PACKED_COLUMNS, PACKED_MAX

PARQUET_NAME = "events.parquet"
# The allocator Arrow chose when it loaded (mimalloc in the wheels). A live run's driver takes
# under the system allocator (``harness.soak.compacting``); ``finish`` sorts and writes under this.
_ARROW_POOL = pa.default_memory_pool()
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


def _well_typed(row: dict[str, Any]) -> bool:
    for col, typ in _REQUIRED.items():
        if not isinstance(row.get(col), typ) or isinstance(row.get(col), bool):
            return False
    for col, typ in _OPTIONAL.items():
        if row.get(col) is not None and (not isinstance(row[col], typ) or isinstance(row[col], bool)):
            return False
    return True


def unpacked(row: object) -> list[dict[str, Any]] | None:
    """Return the events of one parsed segment line: the row itself, or a packed row's events (each
    with every column); None when it is not a whole, well-typed ledger row."""
    if not isinstance(row, dict):
        return None
    n = row.get("n")
    if n is None:
        return [row] if _well_typed(row) else None
    if type(n) is not int or not 1 <= n <= PACKED_MAX or type(row.get("seq")) is not int:
        return None
    columns: dict[str, list[Any]] = {}
    for col, plural in PACKED_COLUMNS.items():
        values = row.get(plural)
        if values is None:
            columns[col] = [row.get(col)] * n
        elif type(values) is list and len(values) == n and row.get(col) is None:
            columns[col] = values
        else:
            return None
    first = row["seq"]
    alike = {c: row.get(c) for c in ("ts_ns", "src", "pid", "kind")}
    rows = [alike | {"seq": first + i} | {col: values[i] for col, values in columns.items()} for i in range(n)]
    return rows if all(_well_typed(r) for r in rows) else None


def _parse(raw: bytes) -> list[dict[str, Any]] | None:
    """Return the events of one line, or None when the bytes are not a whole, well-typed ledger row."""
    try:
        row = json.loads(raw)
    except ValueError:  # also UnicodeDecodeError
        return None
    return unpacked(row)


class _Region(io.RawIOBase):
    """Bytes ``[start, end)`` of a file (to its end when ``end`` is None), read as a file of their own.

    A run's segments grow while a live compaction reads them: it reads only up to the last whole
    line it saw, so neither Arrow nor the line reader meets the line a writer is appending.
    """

    def __init__(self, path: Path, start: int = 0, end: int | None = None) -> None:
        super().__init__()
        self._fh = path.open("rb")
        self._fh.seek(start)
        self._left = None if end is None else max(end - start, 0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._left is not None:
            view = view[: self._left]
        got = self._fh.readinto(view) or 0
        if self._left is not None:
            self._left -= got
        return got

    def close(self) -> None:
        self._fh.close()
        super().close()


def _region(path: Path, start: int = 0, end: int | None = None) -> io.BufferedReader:
    return io.BufferedReader(_Region(path, start, end), buffer_size=1 << 20)


def _rows(path: Path, start: int = 0, end: int | None = None) -> Iterator[dict[str, Any] | None]:
    """Yield each readable event of one segment (bytes ``[start, end)``) in file order, and None for
    each damaged line."""
    with _region(path, start, end) as fh:
        for raw in fh:
            rows = _parse(raw) if raw.endswith(b"\n") else None
            if rows is None:
                yield None
                # a torn write and the next event on one line: keep the event after the tear
                at = raw.rfind(ROW_START)
                tail = _parse(raw[at:]) if at > 0 and raw.endswith(b"\n") else None
                if tail is not None:
                    yield from tail
                continue
            yield from rows


def read_segment(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Return the readable rows of one segment and how many lines were damaged (each skipped alone)."""
    rows: list[dict[str, Any]] = []
    damaged = 0
    for row in _rows(path):
        if row is None:
            damaged += 1
        else:
            rows.append(row)
    return rows, damaged


_LOOSE = pa.schema([f.with_nullable(True) for f in ARROW_SCHEMA])  # what Arrow's reader fills, checked after
# ... and what a packed row adds: its count and each packed column's list of values
_PACKS = pa.schema(
    [pa.field("n", pa.int64())]
    + [pa.field(plural, pa.list_(ARROW_SCHEMA.field(col).type)) for col, plural in PACKED_COLUMNS.items()]
)
_ARROW_JSON = pa_json.ParseOptions(
    explicit_schema=pa.unify_schemas([_LOOSE, _PACKS]), unexpected_field_behavior="ignore"
)
_BLOCK_BYTES = 4 << 20  # Arrow parses this many bytes at a time (about 13,000 events; its parse holds ~35x)
CHUNK_ROWS = 200_000  # the line reader's chunk: memory stays bounded on a damaged segment of any size


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pydict({c: [r.get(c) for r in rows] for c in COLUMNS}, schema=ARROW_SCHEMA)


def _checked(table: pa.Table) -> pa.Table | None:
    """Return Arrow's parse of a block as the ledger schema, its packed rows unpacked, or None when a
    row is not well-typed or a packed row does not unpack whole."""
    counts = table.column("n")
    if counts.null_count < len(counts):
        packed = pc.is_valid(counts)
        events = _unpack(table.filter(packed))
        if events is None:
            return None
        table = pa.concat_tables([table.filter(pc.invert(packed)).select(list(COLUMNS)), events])
    if any(table.column(c).null_count for c in _REQUIRED):
        return None
    try:
        return table.select(list(COLUMNS)).cast(ARROW_SCHEMA)
    except (pa.ArrowInvalid, ValueError):
        return None


def _unpack(packs: pa.Table) -> pa.Table | None:
    """Return the events of ``packs`` (packed rows only, as Arrow parsed them) in the loose schema, or
    None when one does not unpack whole."""
    packs = packs.combine_chunks()
    n = packs.column("n").to_numpy()
    if n.min() < 1 or n.max() > PACKED_MAX or packs.column("seq").null_count:
        return None
    parent = np.repeat(np.arange(len(n)), n)
    pos = np.arange(len(parent)) - (np.cumsum(n) - n)[parent]
    taken = pa.array(parent)
    columns = {c: packs.column(c).take(taken) for c in ("ts_ns", "src", "pid", "kind")}
    columns["seq"] = pc.add(packs.column("seq").take(taken), pa.array(pos))
    for col, plural in PACKED_COLUMNS.items():
        single = packs.column(col).chunk(0)
        once = single.take(taken)
        lists = packs.column(plural).chunk(0)
        if lists.null_count == len(lists):
            columns[col] = once
            continue
        given = lists.is_valid().to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
        twice = given & single.is_valid().to_numpy(zero_copy_only=False)
        if (given & (lengths != n)).any() or twice.any():
            return None  # a list of the wrong length, or a column given once and as a list
        at = lists.offsets.to_numpy()[:-1][parent] + pos
        listed = given[parent]
        values = lists.values.take(pa.array(at, mask=~listed))
        columns[col] = pc.if_else(pa.array(listed), values, once)
    return pa.table(columns).select(list(COLUMNS))


def _line_chunks(path: Path, skip: int, start: int, end: int | None) -> Iterator[tuple[pa.Table, int]]:
    """Yield the readable rows of bytes ``[start, end)`` after the first ``skip`` in chunks, each with
    the damaged lines met since the previous chunk (damage in the skipped part is counted too)."""
    rows: list[dict[str, Any]] = []
    damaged = seen = 0
    for row in _rows(path, start, end):
        if row is None:
            damaged += 1
            continue
        seen += 1
        if seen <= skip:
            continue
        rows.append(row)
        if len(rows) >= CHUNK_ROWS:
            yield _rows_table(rows), damaged
            rows, damaged = [], 0
    if rows or damaged:
        yield _rows_table(rows), damaged


def segment_chunks(
    path: Path, start: int = 0, end: int | None = None, *, threads: bool = True
) -> Iterator[tuple[pa.Table, int]]:
    """Yield one segment's readable events in file order, in chunks of bounded size, each with the
    damaged lines skipped since the previous chunk: the whole segment, or its bytes ``[start, end)``
    (``start`` at the beginning of a line; ``end``, when given, just after a newline).

    Arrow's JSON reader parses the segment block by block in C++ (an event read line by line into
    a dict takes about 1.5 KB, in Arrow's columns about a tenth), on its thread pool unless
    ``threads`` is False. A block holding a damaged line (torn, mistyped, not an object, a required
    field missing) makes Arrow stop; the line reader then goes on from the first row Arrow did not
    hand out, counting and skipping the damage line by line. A torn last line goes to the line reader
    at once: Arrow would take a whole-looking tail.
    """
    stop = path.stat().st_size if end is None else end
    if stop <= start:
        return
    with path.open("rb") as fh:
        fh.seek(stop - 1)
        whole = fh.read(1) == b"\n"
    done = 0
    if whole:
        try:
            with _region(path, start, stop) as region:
                reader = pa_json.open_json(
                    region,
                    read_options=pa_json.ReadOptions(block_size=_BLOCK_BYTES, use_threads=threads),
                    parse_options=_ARROW_JSON,
                )
                for batch in reader:
                    table = _checked(pa.Table.from_batches([batch]))
                    if table is None:
                        break
                    yield table, 0
                    done += table.num_rows
                else:
                    return
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    yield from _line_chunks(path, done, start, stop)


def _segment_table(path: Path) -> tuple[pa.Table, int]:
    """Return one segment's readable events as a table and how many lines were damaged."""
    chunks = list(segment_chunks(path))
    table = pa.concat_tables([t for t, _ in chunks]) if chunks else ARROW_SCHEMA.empty_table()
    return table, sum(d for _, d in chunks)


def segment_files(ledger_dir: Path) -> list[Path]:
    """Return the ledger's JSON-lines segments in name order (none when it has no segments folder)."""
    return sorted((ledger_dir / "segments").glob("*.jsonl"))


def segments_bytes(ledger_dir: Path) -> int:
    """Return the size of the ledger's segments together, in bytes."""
    return sum(p.stat().st_size for p in segment_files(ledger_dir))


def scan_segments(ledger_dir: Path) -> tuple[pa.Table, dict[str, int]]:
    """Return every readable event in the segments, in (ts_ns, src, seq) order, and the damaged
    lines per segment file name (only segments with damage are listed)."""
    tables: list[pa.Table] = []
    damage: dict[str, int] = {}
    for seg in segment_files(ledger_dir):
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
    for seg in segment_files(ledger_dir):
        damaged = sum(d for _, d in segment_chunks(seg))
        if damaged:
            damage[seg.name] = damaged
    return damage


def with_op_bucket(table: pa.Table) -> pa.Table:
    """Return ``table`` with its ``op_bucket`` and ``op_id`` columns, sorted by (op, ts_ns, src, seq)."""
    unique = table["op"].unique().drop_null()
    ops = pc.take(unique, pc.sort_indices(unique))
    op_id = pc.index_in(table["op"], value_set=ops)
    table = table.append_column("op_bucket", op_bucket_column(op_buckets(ops), op_id))
    table = table.append_column("op_id", op_id.cast(pa.int64()))
    return table.sort_by([("op", "ascending"), ("ts_ns", "ascending"), ("src", "ascending"), ("seq", "ascending")])


SPILL_PREFIX = PARQUET_NAME + ".spill-"  # then the compacting process's id


def _alive(pid: str) -> bool:
    """Tell whether process ``pid`` (text, from a spill folder's name) may still be running."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def compacting(ledger_dir: Path) -> bool:
    """Tell whether a process still running is compacting ``ledger_dir`` (its spill folder is there)."""
    return any(_alive(s.name.removeprefix(SPILL_PREFIX)) for s in ledger_dir.glob(f"{SPILL_PREFIX}*"))


def _whole_lines_end(path: Path, start: int, limit: int | None = None) -> int:
    """Return the offset just after the segment's last newline in ``[start, limit)`` (``start`` if none)."""
    end = path.stat().st_size if limit is None else min(path.stat().st_size, limit)
    with path.open("rb") as fh:
        while end > start:
            lo = max(start, end - (64 << 10))
            fh.seek(lo)
            at = fh.read(end - lo).rfind(b"\n")
            if at >= 0:
                return lo + at + 1
            end = lo
    return start


class Compaction:
    """The segments of one ledger turned into the bucketed ``events.parquet/`` directory.

    ``take`` spills the whole lines written so far and may be called again and again while the run
    still writes (a soak does so in the background, so its close reads only the tails); ``finish``
    reads the rest of every segment, a torn last line included, and writes the buckets. What it
    writes is what compacting the finished segments at once writes: the spill takes events in any
    order, and the operation ids, the bucket count and the damage are settled in ``finish``.

    Streams: segments are read in chunks and spilled by bucket (``BucketSpill``), then each bucket
    is sorted and written alone, so memory holds one bucket, not the ledger. The segments stay as
    written; the new directory replaces the old one only once it is complete; the spill is removed
    by ``finish`` and ``discard`` whatever happens.
    """

    def __init__(self, ledger_dir: Path) -> None:
        self.ledger_dir = ledger_dir
        # The spill is this process's: a `txchaos verify` of a soak's folder while the soak still
        # compacts it must not remove the soak's spill. One left by a process that is gone is removed.
        self._spill_dir = ledger_dir / f"{SPILL_PREFIX}{os.getpid()}"
        for stale in ledger_dir.glob(f"{PARQUET_NAME}.spill*"):  # ".spill": a version before the ids
            if stale == self._spill_dir or not _alive(stale.name.removeprefix(SPILL_PREFIX)):
                shutil.rmtree(stale, ignore_errors=True)
        self._spill, self._taken, self._damage = self._fresh()
        self._lock = threading.Lock()  # a background ``take`` and the close's ``finish`` never overlap
        self._broken = False  # a take failed halfway: what the spill holds is not known
        self._done = False

    def _fresh(self) -> tuple[BucketSpill, dict[Path, int], dict[str, int]]:
        """Return an empty spill, the bytes taken per segment (whole lines) and the damaged lines per segment name."""
        return BucketSpill(self._spill_dir), {}, {}

    @property
    def events(self) -> int:
        """Return how many events are spilled so far."""
        return self._spill.rows

    @property
    def taken_bytes(self) -> int:
        """Return how many bytes of segments are spilled so far."""
        return sum(self._taken.values())

    def take(self, *, max_bytes: int | None = None, threads: bool = False) -> int:
        """Spill the whole lines written since the last call, at most about ``max_bytes`` of them;
        return how many events that was (0: nothing new, or the compaction is finished).

        Arrow's thread pool is left alone unless ``threads``: in the background of a live run this
        runs on the calling thread only. A bound on the bytes bounds the memory one take holds.
        """
        with self._lock:
            if self._done or self._broken:
                return 0
            before = self._spill.rows
            budget = max_bytes
            try:
                for seg in segment_files(self.ledger_dir):
                    if budget is not None and budget <= 0:
                        break
                    start = self._taken.get(seg, 0)
                    end = _whole_lines_end(seg, start, None if budget is None else start + budget)
                    self._read(seg, start, end, threads=threads)
                    budget = None if budget is None else budget - (end - start)
                self._spill.flush()
                pa.default_memory_pool().release_unused()  # a live run's driver stays as small as it was
            except BaseException:
                self._broken = True  # ``finish`` starts again from the segments
                raise
            return self._spill.rows - before

    def _read(self, seg: Path, start: int, end: int | None, *, threads: bool) -> None:
        stop = seg.stat().st_size if end is None else end
        if stop <= start:
            return
        damaged = 0
        for chunk, skipped in segment_chunks(seg, start, stop, threads=threads):
            self._spill.add(chunk)
            damaged += skipped
        self._taken[seg] = stop
        if damaged:
            self._damage[seg.name] = self._damage.get(seg.name, 0) + damaged

    def finish(self) -> Path:
        """Read the rest of every segment and write ``events.parquet/``; return its path.

        After a ``take`` that failed halfway, everything is read again from the segments.
        """
        out = self.ledger_dir / PARQUET_NAME
        tmp = self.ledger_dir / (PARQUET_NAME + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with self._lock:
            if self._done:
                raise RuntimeError(f"the compaction of {self.ledger_dir} is finished already")
            self._done = True
            try:
                if self._broken:
                    self._discard()
                    self._spill, self._taken, self._damage = self._fresh()
                with _memory_pool(_ARROW_POOL):
                    for seg in segment_files(self.ledger_dir):
                        self._read(seg, self._taken.get(seg, 0), None, threads=True)
                    writer = BucketWriter(tmp, n_buckets_for(self._spill.rows))
                    try:
                        # closed before the spill is discarded, so no sort ahead still reads it
                        with closing(_one_ahead(self._spill.sorted_buckets(writer.n_buckets))) as buckets:
                            for _, rows in buckets:
                                writer.write(rows)
                        writer.close(self._spill.rows, damaged_lines=self._damage)
                    finally:
                        writer.abandon()  # no write still in flight once this returns
            finally:
                self._discard()
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        tmp.rename(out)
        return out

    def discard(self) -> None:
        """Drop what was spilled (a run that will not be compacted from here); safe to repeat."""
        with self._lock:
            self._done = True
            self._discard()

    def _discard(self) -> None:
        self._spill.close()
        shutil.rmtree(self._spill_dir, ignore_errors=True)


def _one_ahead(items: Iterator[tuple[int, pa.Table]]) -> Generator[tuple[int, pa.Table], None, None]:
    """Yield what ``items`` yields, making the next one on a thread while the caller uses this one.

    The close sorts a bucket's slices while it writes the slice before (Arrow's sorts and takes and
    Parquet's writes release the GIL): memory holds one slice more, not one bucket more, since a
    bucket's table is freed once its last slice is taken.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="txchaos-compaction") as ahead:
        upcoming = ahead.submit(next, items, None)
        while (item := upcoming.result()) is not None:
            upcoming = ahead.submit(next, items, None)
            yield item


@contextmanager
def _memory_pool(pool: pa.MemoryPool) -> Iterator[None]:
    """Allocate Arrow's new buffers from ``pool`` inside the block (each buffer is freed to its own).

    The system allocator a live run's driver takes under hands memory back at each
    ``release_unused`` with ``malloc_trim``: at the close of a 200,000-op Kafka soak that was about
    a second of system time over the buckets, and the peak was higher than under mimalloc.
    """
    before = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def compact(ledger_dir: Path) -> Path:
    """Write the segments as the bucketed ``events.parquet/`` directory at once (``Compaction``)."""
    return Compaction(ledger_dir).finish()


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
    segments = segment_files(ledger_dir)
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
    "SPILL_PREFIX",
    "Compaction",
    "compact",
    "compacted_damage",
    "compacting",
    "read_ledger",
    "read_segment",
    "read_segments",
    "rebuild_compacted",
    "scan_segments",
    "segment_damage",
    "segment_files",
    "segments_bytes",
    "with_op_bucket",
]
