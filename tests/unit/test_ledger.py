"""The ledger: SIGKILL-safe writer, compaction into the bucketed layout, reading back, synthesis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import ConfigError
from harness.ledger.layout import (
    DELTA_COLUMNS,
    LAYOUT_NAME,
    OP_BUCKETS,
    REQUEST_COLUMNS,
    REQUEST_KINDS,
    file_bucket_table,
    op_bucket_of,
    read_layout,
    recorded_requests,
    spark_hash_int,
    writer_counts,
)
from harness.ledger.reader import PARQUET_NAME, compact, read_ledger, read_segment, read_segments
from harness.ledger.reader import _segment_table as reader_segment_table
from harness.ledger.schema import COLUMNS, Kind
from harness.ledger.synth import synth_run
from harness.ledger.tail import LedgerTail
from harness.ledger.writer import Detail, DetailForm, LedgerWriter

KILL_SELF = """
import os, signal, sys
from pathlib import Path
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
w = LedgerWriter(Path(sys.argv[1]), "worker-1")
for i in range(int(sys.argv[2])):
    w.emit(Kind.DELIVER, op=f"op-{i}", attempt=1, note="x" * (i % 7))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("n", [1, 257, 5000])
def test_sigkill_after_emit_loses_nothing(tmp_path: Path, n: int) -> None:
    proc = subprocess.run([sys.executable, "-c", KILL_SELF, str(tmp_path), str(n)], check=False, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    table = read_segments(tmp_path)
    assert table.num_rows == n
    assert sorted(table["seq"].to_pylist()) == list(range(n))
    assert set(table["op"].to_pylist()) == {f"op-{i}" for i in range(n)}


def _write_small(tmp_path: Path) -> Path:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as d, LedgerWriter(ledger, "sink") as s:
        for i in range(50):
            d.emit(Kind.SUBMIT, op=f"op-{i}", dest="orders")
            s.emit(Kind.DOWNSTREAM, op=f"op-{i}", msg=f"m-{i}", partition=i % 3, offset=i, lag_ms=i)
        d.emit(Kind.FAULT_START, point="latency:kafka")
    return ledger


def test_compact_writes_buckets_that_keep_each_op_whole(tmp_path: Path) -> None:
    ledger = _write_small(tmp_path)
    out = compact(ledger)
    layout = read_layout(out)
    assert layout is not None
    assert layout["events"] == 101
    seen: dict[str, str] = {}
    for f in sorted(out.glob("*.parquet")):
        for op in pq.read_table(f, columns=["op"])["op"].to_pylist():
            assert seen.setdefault(str(op), f.name) == f.name  # never split across files
    assert len(seen) == 51  # 50 ops + the null op of the fault event


def test_compacted_parts_store_the_sorted_integer_columns_as_deltas(tmp_path: Path) -> None:
    """The parts' encoding the docs and the benchmark figures describe (``layout.DELTA_COLUMNS``)."""
    out = compact(_write_small(tmp_path))
    for f in sorted(out.glob("*.parquet")):
        meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
            for name in DELTA_COLUMNS:
                assert "DELTA_BINARY_PACKED" in encodings[name], (f.name, name, encodings[name])
            assert "DELTA_BINARY_PACKED" not in encodings["kind_code"]  # a dictionary column stays one


def test_compact_numbers_ops_in_id_order_and_codes_kinds_and_writers(tmp_path: Path) -> None:
    out = compact(_write_small(tmp_path))
    assert (read_layout(out) or {}).get("layout") == 2
    table = pq.read_table(out, columns=["op", "op_id", "kind", "kind_code"])
    pairs = {(r["op"], r["op_id"]) for r in table.select(["op", "op_id"]).to_pylist()}
    assert (None, None) in pairs  # the fault event has no operation, so no op_id
    named = sorted(p for p in pairs if p[0] is not None)
    # op_id is the operation's rank in string order ("op-10" before "op-2"), the order witnesses use
    assert [i for _, i in named] == list(range(50))
    kinds = list(Kind)
    assert all(kinds[c] == k for k, c in zip(table["kind"].to_pylist(), table["kind_code"].to_pylist(), strict=True))
    srcs = (read_layout(out) or {})["srcs"]
    codes = pq.read_table(out, columns=["src", "src_code"]).to_pylist()
    assert sorted(srcs) == ["driver", "sink"]
    assert all(srcs[r["src_code"]] == r["src"] for r in codes)


def test_compaction_records_each_writers_counts(tmp_path: Path) -> None:
    # the engines take these instead of scanning the whole ledger again: they must be the scan's figures
    ledger = _write_small(tmp_path)
    with LedgerWriter(ledger, "driver") as late:  # a second process of the same writer name
        late.emit(Kind.SUBMIT, op="op-late")
    out = compact(ledger)
    expected: dict[tuple[str, int, str, bool], list[int]] = {}
    for r in read_ledger(ledger).to_pylist():
        acc = expected.setdefault((r["src"], r["pid"], r["kind"], r["op"] is not None), [0, r["seq"], r["seq"]])
        acc[0] += 1
        acc[1], acc[2] = min(acc[1], r["seq"]), max(acc[2], r["seq"])
    recorded = writer_counts(read_layout(out) or {})
    assert recorded == {k: tuple(v) for k, v in expected.items()}
    assert recorded[("driver", os.getpid(), "fault_start", False)] == (1, 50, 50)
    requests = recorded_requests(read_layout(out) or {})
    assert requests == [
        {k: r[k] for k in REQUEST_COLUMNS} for r in read_ledger(ledger).to_pylist() if r["kind"] in REQUEST_KINDS
    ]
    assert [r["kind"] for r in requests] == ["fault_start"]  # the one fault event _write_small writes
    meta = json.loads((out / LAYOUT_NAME).read_text())
    del meta["writers"]  # a ledger compacted before they were recorded: the engines count them
    assert writer_counts(meta) is None


def test_read_ledger_is_the_same_before_and_after_compaction(tmp_path: Path) -> None:
    ledger = _write_small(tmp_path)
    before = read_ledger(ledger)
    compact(ledger)
    compact(ledger)  # repeatable
    after = read_ledger(ledger)
    assert after.column_names == list(COLUMNS)
    key = [("src", "ascending"), ("seq", "ascending")]
    assert before.sort_by(key).to_pylist() == after.sort_by(key).to_pylist()
    down = after.filter(pc.and_(pc.equal(after["kind"], "downstream"), pc.equal(after["op"], "op-7")))
    assert json.loads(down["detail"][0].as_py()) == {"lag_ms": 7}


def test_read_ledger_without_a_ledger_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Hint: pass a run folder"):
        read_ledger(tmp_path)


def test_bucket_hash_matches_sparks_murmur3() -> None:
    # values from Spark 4.0: SELECT hash(CAST(i AS INT)) for i in 0, 1, 2, 3
    assert [spark_hash_int(i) for i in range(4)] == [933211791, -559580957, 1765031574, -1823081949]
    table = file_bucket_table(32)
    assert table.shape == (OP_BUCKETS,)
    assert list(table[:4]) == [15, 3, 22, 3]


def test_synth_writes_ground_truth_and_contiguous_seqs(tmp_path: Path) -> None:
    run = synth_run(tmp_path / "synth", 60_000, seed=3, anomaly_rate=0.02)
    manifest = json.loads((run / "manifest.json").read_text())
    events = read_ledger(run / "ledger")
    assert events.num_rows == manifest["events"]
    assert sum(manifest["ground_truth"].values()) > 0
    assert manifest["ground_truth"]["stuck"] >= manifest["ground_truth"]["never-dead-lettered-poison"]
    for src in set(events["src"].to_pylist()):
        seqs = np.sort(events.filter(pc.equal(events["src"], src))["seq"].to_numpy())
        assert (seqs == np.arange(len(seqs))).all(), src
    assert (run / "ledger" / PARQUET_NAME / "_layout.json").is_file()
    assert os.path.getsize(run / "manifest.json") > 0


def _worker_segment(tmp_path: Path, n: int) -> Path:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "worker-0") as w:
        for i in range(n):
            w.emit(Kind.DELIVER, op=f"v-s0-op{i:05d}", msg=f"m{i}", attempt=1 + i % 2, redelivered=bool(i % 3))
            w.emit(Kind.DB_COMMIT, op=f"v-s0-op{i:05d}", partition=i % 3, offset=i)
    (seg,) = (ledger / "segments").glob("*.jsonl")
    return seg


def test_a_whole_segment_reads_through_arrow_as_the_line_reader_reads_it(tmp_path: Path) -> None:
    from harness.ledger.reader import read_segment, segment_chunks

    seg = _worker_segment(tmp_path, 50)
    chunks = list(segment_chunks(seg))
    assert [d for _, d in chunks] == [0]
    rows, damaged = read_segment(seg)
    assert damaged == 0
    assert chunks[0][0].to_pylist() == [{c: r.get(c) for c in COLUMNS} for r in rows]


@pytest.mark.parametrize("at", [0, 333, 999])
def test_a_segment_damaged_mid_file_streams_every_readable_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    # Arrow hands out whole blocks until the block with the damage; the line reader goes on from the
    # first row Arrow did not hand out, in chunks: each readable row once, the damage counted
    from harness.ledger import reader

    monkeypatch.setattr(reader, "_BLOCK_BYTES", 4096)
    monkeypatch.setattr(reader, "CHUNK_ROWS", 64)
    seg = _worker_segment(tmp_path, 500)
    lines = seg.read_bytes().splitlines(keepends=True)
    lines.insert(at, b'{"ts_ns":1,"src":"worker-0","pid":1,"seq":"x","kind":"deliver"}\n')
    seg.write_bytes(b"".join(lines))
    chunks = list(reader.segment_chunks(seg))
    rows, damaged = reader.read_segment(seg)
    assert damaged == 1
    assert sum(d for _, d in chunks) == 1
    assert max(t.num_rows for t, _ in chunks) <= 64  # blocks, then line chunks: memory stays bounded
    streamed = pa.concat_tables([t for t, _ in chunks]).to_pylist()
    assert streamed == [{c: r.get(c) for c in COLUMNS} for r in rows]
    assert len(streamed) == 1000


@pytest.mark.parametrize("where", ["writing", "a write on its lane", "sorting ahead"])
def test_a_compaction_that_fails_keeps_the_compacted_ledger_and_leaves_no_spill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from harness.ledger import layout, reader

    ledger = _write_small(tmp_path)
    out = compact(ledger)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(self: object, table: object) -> None:
        raise OSError("disk full")

    sort = layout.BucketSpill.sorted_buckets

    def broken_after_one(self: layout.BucketSpill, n_buckets: int) -> object:
        yield next(sort(self, n_buckets))  # the writer has a slice when the sort ahead of it fails
        raise OSError("disk full")

    if where == "writing":
        monkeypatch.setattr(reader.BucketWriter, "write", broken)
    elif where == "a write on its lane":  # raised on a writer thread, handed back to the close
        monkeypatch.setattr(layout.pq.ParquetWriter, "write_table", broken)
    else:
        monkeypatch.setattr(layout.BucketSpill, "sorted_buckets", broken_after_one)
    with pytest.raises(OSError, match="disk full"):
        compact(ledger)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the last whole one stays
    assert not list(ledger.glob(f"{PARQUET_NAME}.spill*"))
    assert not [t for t in threading.enumerate() if t.name.startswith("txchaos-parquet")]  # no write goes on


@pytest.mark.parametrize("n_buckets", [4, 16, 32])
def test_streamed_compaction_writes_what_sorting_the_whole_ledger_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_buckets: int
) -> None:
    # the spill is partitioned by the bucket hash modulo SPILL_PARTS: fewer, as many and more
    # file buckets than parts must each get exactly their ops, whole and in (op, ts_ns, src, seq) order
    from harness.ledger import layout, reader

    monkeypatch.setattr(reader, "n_buckets_for", lambda events: n_buckets)
    monkeypatch.setattr(layout, "_SORTED_SLICE", 97)  # several slices (row groups) per bucket
    ledger = _write_small(tmp_path)
    with LedgerWriter(ledger, "worker-1") as w:
        for i in range(400):
            w.emit(Kind.DELIVER, op=f"op-{i % 60}", msg=f"m-{i}", attempt=1 + i // 60)
    out = compact(ledger)
    expected = reader.with_op_bucket(read_segments(ledger))
    buckets = file_bucket_table(n_buckets)
    got: list[dict[str, object]] = []
    files = 0
    for b in range(n_buckets):
        # a bucket's row groups go to its files in turn (``WRITE_LANES``), each file in order
        for part in sorted(out.glob(f"part-{b:05d}_{b:05d}.c*.parquet")):
            files += 1
            rows = pq.read_table(part, columns=[*COLUMNS, "op_bucket", "op_id"]).to_pylist()
            assert all(buckets[r["op_bucket"]] == b for r in rows)
            assert all(r["op_bucket"] == op_bucket_of(r["op"]) for r in rows)
            key = [(r["op"] is None, r["op"] or "", r["ts_ns"], r["src"], r["seq"]) for r in rows]
            assert key == sorted(key)
            got += rows
    assert files == len(list(out.glob("*.parquet")))
    per_bucket = np.bincount([buckets[r["op_bucket"]] for r in got], minlength=n_buckets)
    # a bucket of more than one slice has a second file; one of a single slice, one
    assert files == n_buckets + int((per_bucket > 97).sum())
    assert n_buckets > 4 or files > n_buckets  # the fewest buckets take several slices each
    assert sorted(got, key=str) == sorted(expected.to_pylist(), key=str)
    assert (read_layout(out) or {})["n_buckets"] == n_buckets
    assert not list(ledger.glob(f"{PARQUET_NAME}.spill*"))  # the spill is removed


@pytest.mark.parametrize(
    "bad",
    [b'{"ts_ns":1,"src":"d","pid":1,"seq":true,"kind":"x"}\n', b"[1]\n", b'{"ts_ns":1,"src":"d","pid":1,"seq":9,"ki'],
)
def test_a_damaged_segment_falls_back_to_the_line_reader_and_counts_the_damage(tmp_path: Path, bad: bytes) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as w:
        w.emit(Kind.SUBMIT, op="v-s0-op00000")
    (seg,) = (ledger / "segments").glob("*.jsonl")
    with seg.open("ab") as fh:
        fh.write(bad)
    events = read_segments(ledger)
    assert events["op"].to_pylist() == ["v-s0-op00000"]
    from harness.ledger.reader import segment_damage

    assert segment_damage(ledger) == {seg.name: 1}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"op": "v-s0-op00001", "msg": "ID:a\\c1", "attempt": 2, "partition": 0, "offset": 12},
        {"op": 'quote" and \\ and é and \n', "stage": "s1", "dest": "q", "point": "after_db_commit"},
        {"op": "x", "redelivered": True, "reason": "naïve", "nested": {"b": 1, "a": [1, 2]}},
    ],
)
def test_a_row_is_written_exactly_as_the_json_encoder_writes_the_row(tmp_path: Path, fields: dict[str, object]) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "wörker-0") as w:
        w.emit(Kind.DELIVER, **fields)  # type: ignore[arg-type]
    (seg,) = (ledger / "segments").glob("*.jsonl")
    line = seg.read_text()
    row = json.loads(line)
    named = {c: fields.get(c) for c in COLUMNS if c not in ("ts_ns", "src", "pid", "seq", "kind", "detail")}
    detail = {k: v for k, v in fields.items() if k not in named}
    expected = {"ts_ns": row["ts_ns"], "src": "wörker-0", "pid": os.getpid(), "seq": 0, "kind": "deliver", **named}
    expected["detail"] = json.dumps(detail, sort_keys=True) if detail else "{}"
    assert line == json.dumps(expected, separators=(",", ":")) + "\n"


def _untimed(ledger: Path) -> list[dict[str, object]]:
    """Return the ledger's events as they read back, in writing order, without their clock."""
    events = read_segments(ledger).sort_by([("seq", "ascending")]).drop_columns(["ts_ns"])
    return events.to_pylist()


def _lines_read(ledger: Path) -> list[dict[str, object]]:
    """Return the ledger's events as the line reader reads them (not Arrow's), in writing order, untimed."""
    (seg,) = (ledger / "segments").glob("*.jsonl")
    rows, damaged = read_segment(seg)
    assert damaged == 0
    return [{c: r.get(c) for c in COLUMNS if c != "ts_ns"} for r in sorted(rows, key=lambda r: r["seq"])]


@pytest.mark.parametrize("in_batch", [False, True])
def test_emit_ops_writes_the_events_emit_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_batch: bool
) -> None:
    from harness.ledger import writer

    monkeypatch.setattr(writer, "PACK_EVENTS", 3)  # several packed rows
    ops = ["v-s0-op00000", 'quote" and \\ and é', "v-s0-op00002", "x", "y", "z", "last"]
    by_emit, by_ops = tmp_path / "emit", tmp_path / "ops"
    with LedgerWriter(by_emit, "drïver") as w:
        w.emit(Kind.SUBMIT, op="before")
        for op in ops:
            w.emit(Kind.RESIDUE_EFFECT, op=op, dest="effects")
    with LedgerWriter(by_ops, "drïver") as w:
        w.emit(Kind.SUBMIT, op="before")
        if in_batch:
            with w.batch():
                w.emit_ops(Kind.RESIDUE_EFFECT, iter(ops), dest="effects")
        else:
            w.emit_ops(Kind.RESIDUE_EFFECT, iter(ops), dest="effects")
    lines = next((by_ops / "segments").glob("*.jsonl")).read_text().splitlines()
    assert len(lines) == 1 + 3  # the event before, then packed rows of 3, 3 and 1
    expected = _untimed(by_emit)
    assert _untimed(by_ops) == expected
    assert _lines_read(by_ops) == expected
    assert [e["seq"] for e in expected] == list(range(len(ops) + 1))


def test_a_batch_writes_its_events_in_one_call_when_it_ends(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "worker-0") as w:
        (seg,) = (ledger / "segments").glob("*.jsonl")
        with w.batch():
            for n in range(3):
                w.emit(Kind.DELIVER, op=f"v-s0-op{n:05d}")
            assert seg.read_bytes() == b""  # held until the block ends
            with pytest.raises(RuntimeError, match="nest"), w.batch():
                pass
        w.emit(Kind.DB_COMMIT, op="v-s0-op00000")
    rows = [json.loads(line) for line in seg.read_text().splitlines()]
    assert [(r["seq"], r["kind"]) for r in rows] == [(0, "deliver"), (1, "deliver"), (2, "deliver"), (3, "db_commit")]


def test_flush_writes_what_the_batch_holds_so_far_and_nothing_outside_one(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "worker-0") as w:
        (seg,) = (ledger / "segments").glob("*.jsonl")
        w.flush()  # no batch open: nothing held, nothing to do
        with w.batch():
            w.emit(Kind.DELIVER, op="v-s0-op00000")
            w.flush()
            assert [json.loads(x)["kind"] for x in seg.read_text().splitlines()] == ["deliver"]
            w.emit(Kind.EFFECT, op="v-s0-op00000")
            assert len(seg.read_text().splitlines()) == 1  # held again until the block ends
    assert [json.loads(x)["seq"] for x in seg.read_text().splitlines()] == [0, 1]


def test_a_batch_is_its_threads_own(tmp_path: Path) -> None:
    import threading

    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as w:
        (seg,) = (ledger / "segments").glob("*.jsonl")
        with w.batch():
            w.emit(Kind.DOWNSTREAM, op="v-s0-op00000")
            other = threading.Thread(target=lambda: w.emit(Kind.SUBMIT, op="v-s0-op00001"))
            other.start()
            other.join()
            assert [json.loads(x)["kind"] for x in seg.read_text().splitlines()] == ["submit"]
    assert sorted(json.loads(x)["seq"] for x in seg.read_text().splitlines()) == [0, 1]


def _parts(out: Path) -> dict[str, object]:
    """Return a compacted ledger's content: each bucket file's rows, in order, and its layout."""
    files = {p.name: pq.read_table(p).to_pylist() for p in sorted(out.glob("*.parquet"))}
    return {"files": files, "layout": read_layout(out)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_live_compaction_writes_what_compacting_the_finished_segments_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # Segments grow, a line is half written when a take comes, a new writer starts late, a damaged
    # line and a torn tail appear: taking now and then, then finishing, must come to the same parts.
    import random
    import shutil

    from harness.ledger import layout
    from harness.ledger.reader import Compaction

    monkeypatch.setattr(layout, "_SORTED_SLICE", 53)  # several spill flushes and row groups
    rng = random.Random(seed)
    ledger = tmp_path / "live" / "ledger"
    live = Compaction(ledger)
    writers = [LedgerWriter(ledger, "driver"), LedgerWriter(ledger, "worker-0")]
    half: tuple[Path, bytes] | None = None
    for i in range(600):
        if i == 250:
            writers.append(LedgerWriter(ledger, "worker-1"))
        w = rng.choice(writers)
        w.emit(Kind.DELIVER, op=f"op-{rng.randrange(80)}", msg=f"m-{i}", attempt=1 + i % 3, note="é" * (i % 4))
        if i == 300:
            (seg,) = (ledger / "segments").glob("driver-*.jsonl")
            with seg.open("ab") as fh:
                fh.write(b'{"ts_ns":1,"src":"driver","pid":1,"seq":true,"kind":"x"}\n')  # damaged
        if half is None and rng.random() < 0.05:  # a writer in the middle of its line
            line = b'{"ts_ns":5,"src":"stray","pid":7,"seq":0,"kind":"submit","op":"op-1","detail":"{}"}\n'
            half = (ledger / "segments" / "stray-7.jsonl", line)
            with half[0].open("ab") as fh:
                fh.write(line[:30])
        elif half is not None and rng.random() < 0.2:  # ... and done with it
            with half[0].open("ab") as fh:
                fh.write(half[1][30:])
            half = None
        if rng.random() < 0.05:
            live.take()
    for w in writers:
        w.close()
    with (ledger / "segments" / "stray-8.jsonl").open("ab") as fh:
        fh.write(b'{"ts_ns":9,"src":"stray","pid":8,"seq":0,"kind":"sub')  # torn by a kill
    assert live.events > 0
    once = tmp_path / "once" / "ledger"
    shutil.copytree(ledger / "segments", once / "segments")
    got, expected = _parts(live.finish()), _parts(compact(once))
    assert got == expected
    layout_meta = got["layout"]
    assert isinstance(layout_meta, dict)
    assert sum(layout_meta["damaged_lines"].values()) >= 2  # the mistyped line and the torn tail
    assert not list(ledger.glob(f"{PARQUET_NAME}.spill*"))


def test_a_discarded_live_compaction_leaves_no_spill(tmp_path: Path) -> None:
    from harness.ledger.reader import Compaction

    ledger = _write_small(tmp_path)
    live = Compaction(ledger)
    assert live.take() > 0
    assert list(ledger.glob(f"{PARQUET_NAME}.spill*"))
    live.discard()
    assert not list(ledger.glob(f"{PARQUET_NAME}.spill*"))
    assert not (ledger / PARQUET_NAME).exists()


def test_a_take_that_fails_halfway_is_read_again_at_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from harness.ledger import layout
    from harness.ledger.reader import Compaction

    ledger = _write_small(tmp_path / "live")
    live = Compaction(ledger)
    calls = 0
    real_add = layout.BucketSpill.add

    def add_then_fail(self: layout.BucketSpill, table: pa.Table) -> None:
        nonlocal calls
        calls += 1
        real_add(self, table)  # spilled, and then the disk fills before the take is booked
        raise OSError("disk full")

    monkeypatch.setattr(layout.BucketSpill, "add", add_then_fail)
    with pytest.raises(OSError, match="disk full"):
        live.take()
    assert calls == 1
    assert live.take() == 0  # a broken compaction takes nothing more
    monkeypatch.setattr(layout.BucketSpill, "add", real_add)
    once = tmp_path / "once" / "ledger"
    shutil.copytree(ledger / "segments", once / "segments")
    assert _parts(live.finish()) == _parts(compact(once))
    with pytest.raises(RuntimeError, match="finished already"):
        live.finish()


def test_a_compaction_leaves_a_running_processs_spill_and_removes_a_dead_ones(tmp_path: Path) -> None:
    # `txchaos verify` of a soak's folder while the soak still compacts it must not pull the
    # soak's spill from under it; what a killed driver left is cleared by the next compaction.
    from harness.ledger.reader import SPILL_PREFIX

    ledger = _write_small(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = ledger / f"{SPILL_PREFIX}{sleeper.pid}"
        live.mkdir()
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        gone = ledger / f"{SPILL_PREFIX}{dead.stdout.strip()}"
        gone.mkdir()
        old = ledger / f"{PARQUET_NAME}.spill"  # a spill of the version before per-process names
        old.mkdir()
        compact(ledger)
        assert live.is_dir()
        assert not gone.exists()
        assert not old.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_event_about_a_subject_is_the_row_emit_writes(tmp_path: Path) -> None:
    columns = {"op": 'op "1" é', "msg": "in/2@7", "stage": "worker", "dest": "in", "partition": 2, "offset": 7}
    events = [
        (Kind.DELIVER, {"attempt": 2, "redelivered": True, "batch": 3}),
        (Kind.DB_COMMIT, {}),
        (Kind.CRASH, {"point": "after_db_commit", "arm": "arm-0"}),
    ]
    by_emit, by_subject = tmp_path / "emit", tmp_path / "subject"
    with LedgerWriter(by_emit, "worker-0") as w:
        for kind, detail in events:
            w.emit(kind, **columns, **detail)
    with LedgerWriter(by_subject, "worker-0") as w:
        about = w.subject(**columns)
        for kind, detail in events:
            w.emit_about(kind, about, **detail)
        with pytest.raises(TypeError, match="dest, offset: a column of the event's subject"):
            w.emit_about(Kind.SEND, about, offset=9, dest="elsewhere")
    by_shared = tmp_path / "shared"
    with LedgerWriter(by_shared, "worker-0") as w:
        about = w.subject(**columns)
        for i, (kind, detail) in enumerate(events):  # remembered, then formatted alone
            attempt, point = detail.pop("attempt", None), detail.pop("point", None)
            shared = w.shared(**detail) if i % 2 else Detail(**detail)
            w.emit_about(kind, about, attempt=attempt, point=point, shared=shared)
        with pytest.raises(TypeError, match="batch: give the detail as shared= or as keywords"):
            w.emit_about(Kind.SEND, about, shared=Detail(), batch=1)
    dirs = (by_emit, by_subject, by_shared)
    lines = [next((d / "segments").glob("*.jsonl")).read_text().splitlines() for d in dirs]
    assert len(lines[1]) == len(lines[2]) == len(events)  # the refused events wrote nothing
    untimed = [[line.split(",", 1)[1] for line in each] for each in lines]  # all but ts_ns
    assert untimed[1] == untimed[0]
    assert untimed[2] == untimed[0]


def test_a_shared_detail_is_remembered_only_where_equal_values_write_alike(tmp_path: Path) -> None:
    with LedgerWriter(tmp_path, "worker-0") as w:
        table = w.shared(table="effects", n=1)
        assert w.shared(table="effects", n=1) is table
        assert w.shared(n=1, table="effects").text == table.text  # sorted alike, wherever remembered
        assert w.shared(flag=True).text != w.shared(flag=1).text  # equal keys to a dict, not equal text
        assert w.shared(flag=1).text == Detail(flag=1).text
        assert w.shared(x=-0.0).text != w.shared(x=0.0).text
        assert w.shared(parts=[1, 2]).text == Detail(parts=[1, 2]).text  # a list: formatted each time
        for i in range(300):
            assert w.shared(i=i).text == Detail(i=i).text  # past the bound: formatted, not kept
        assert w.shared(i=299) is not w.shared(i=299)


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70))
_VALUES = st.one_of(_SCALARS, st.text(max_size=8), st.floats(allow_nan=False), st.lists(st.integers(), max_size=3))


@given(
    fixed=st.dictionaries(st.text(max_size=6), _VALUES, max_size=4),
    blanks=st.dictionaries(st.text(max_size=6), _SCALARS, max_size=4),
)
def test_a_detail_form_filled_in_is_the_detail_written_whole(
    fixed: dict[str, object], blanks: dict[str, object]
) -> None:
    fixed = {k: v for k, v in fixed.items() if k not in blanks}
    form = DetailForm(tuple(blanks), **fixed)
    assert form(*blanks.values()).text == Detail(**fixed, **blanks).text


def test_a_detail_form_keeps_braces_and_escapes_of_its_fixed_text() -> None:
    # Its template is a str.format text: braces of a key or value must stay text, not fields.
    fixed = {"note": "{0} {x} }{", "{key}": 'quote " and \\ é'}
    form = DetailForm(("z", "a"), **fixed)
    assert form(1, None).text == Detail(**fixed, z=1, a=None).text


def test_a_detail_form_refuses_what_it_cannot_fill_in_alike() -> None:
    form = DetailForm(("index",), batch=1)
    with pytest.raises(TypeError, match="whole numbers, booleans and None"):
        form("seven")
    with pytest.raises(TypeError, match="1 blank"):
        form(1, 2)
    with pytest.raises(TypeError, match="index: a blank and a fixed value"):
        DetailForm(("index",), index=1)
    with pytest.raises(ValueError, match="holds the text it marks its blanks with"):
        DetailForm(("index",), note="\x00txchaos-slot-0\x00")


def test_events_emitted_each_at_once_are_the_events_emit_about_writes(tmp_path: Path) -> None:
    columns = [
        {"op": f'op "{n}" é', "msg": f"in/2@{n}", "stage": "worker", "dest": "in", "partition": 2, "offset": n}
        for n in range(3)
    ]
    by_one, by_each = tmp_path / "one", tmp_path / "each"
    with LedgerWriter(by_one, "worker-0") as w:
        about = [w.subject(**c) for c in columns]
        for n, s in enumerate(about):
            w.emit_about(Kind.DELIVER, s, attempt=n + 1, index=n, redelivered=n > 0)
        for s in about:
            w.emit_about(Kind.DB_COMMIT, s)
        for s in about:
            w.emit_about(Kind.SEND, s, topic="out")
        w.emit_about(Kind.SEND, about[0], topic="alone")
        for s in about[:2]:
            w.emit_about(Kind.BROKER_COMMIT, w.subject(op=s.op, stage="other"))
        w.emit_about(Kind.BROKER_COMMIT, w.subject(op="one", stage="other", dest="here"))
        w.emit_about(Kind.BROKER_COMMIT, w.subject(op="two", stage="other", dest="there"))
    with LedgerWriter(by_each, "worker-0") as w:
        about = [w.subject(**c) for c in columns]
        form = DetailForm(("index", "redelivered"))
        details = [form(n, n > 0) for n in range(3)]
        w.emit_each(Kind.DELIVER, about, attempts=[1, 2, 3], details=details)
        with w.batch():
            w.emit_each(Kind.DB_COMMIT, about)
            w.emit_each(Kind.SEND, about, shared=w.shared(topic="out"))
            w.emit_each(Kind.SEND, [])
            w.emit_each(Kind.SEND, about[:1], shared=w.shared(topic="alone"))
        # no partition, offset or message; then subjects of two destinations: a row each
        w.emit_each(Kind.BROKER_COMMIT, [w.subject(op=s.op, stage="other") for s in about[:2]])
        two = [w.subject(op="one", stage="other", dest="here"), w.subject(op="two", stage="other", dest="there")]
        w.emit_each(Kind.BROKER_COMMIT, two)
        with pytest.raises(ValueError, match="3 subjects, 2 details"):
            w.emit_each(Kind.SEND, about, details=details[:2])
        with pytest.raises(TypeError, match="not both"):
            w.emit_each(Kind.SEND, about, details=details, shared=Detail())
    lines = next((by_each / "segments").glob("*.jsonl")).read_text().splitlines()
    assert ['"n":' in line for line in lines] == [True, True, True, False, True, False, False]  # packed where alike
    expected = _untimed(by_one)
    assert _untimed(by_each) == expected
    assert _lines_read(by_each) == expected
    tail = [{c: e.get(c) for c in COLUMNS if c != "ts_ns"} for e in LedgerTail(by_each).new()]
    assert tail == expected
    assert [e["seq"] for e in LedgerTail(by_each).new({"send"})] == [6, 7, 8, 9]


_PACKED_ROW = {"ts_ns": 1, "src": "worker-0", "pid": 7, "kind": "deliver", "n": 2, "stage": "s", "detail": "{}"}


@pytest.mark.parametrize(
    "bad",
    [
        {"ops": ["a"]},  # a list shorter than n
        {"ops": ["a", "b"], "op": "a"},  # a column given once and as a list
        {"ops": ["a", 3]},  # a value of the wrong type
        {"attempts": [1, True]},
        {"n": 0},
        {"n": 1 << 40},
        {"n": "2"},
        {"ops": "ab"},  # a plural that is not a list
    ],
)
def test_a_packed_row_that_does_not_unpack_whole_is_one_damaged_line(tmp_path: Path, bad: dict[str, object]) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "worker-0") as w:
        w.emit(Kind.SUBMIT, op="before")
    (seg,) = (ledger / "segments").glob("*.jsonl")
    with seg.open("a") as fh:
        fh.write(json.dumps({**_PACKED_ROW, "seq": 1, **bad}) + "\n")
        fh.write(json.dumps({**_PACKED_ROW, "seq": 3, "ops": ["c", "d"]}) + "\n")
    table, damaged = reader_segment_table(seg)
    assert damaged == 1
    read = sorted(zip(table["seq"].to_pylist(), table["op"].to_pylist(), table["stage"].to_pylist(), strict=True))
    assert read == [(0, "before", None), (3, "c", "s"), (4, "d", "s")]
    rows, damaged = read_segment(seg)
    assert damaged == 1
    assert sorted(r["seq"] for r in rows) == [0, 3, 4]
    tail = LedgerTail(ledger)
    assert sorted(e["seq"] for e in tail.new()) == [0, 3, 4]
    assert tail.damaged == 1


def test_events_about_subjects_held_in_a_batch_are_the_events_written_alone(tmp_path: Path) -> None:
    def write(w: LedgerWriter) -> None:
        about = [
            w.subject(op=f"op-{n}", msg=f"in/0@{n}", stage="s", dest="in", partition=0, offset=n) for n in range(4)
        ]
        for s in about[:3]:
            w.emit_about(Kind.EFFECT, s, shared=w.shared(table="t"))
        w.emit(Kind.ALERT, op="op-0", reason="between")
        w.emit_about(Kind.EFFECT, about[3], table="t")
        w.emit_about(Kind.EFFECT, w.subject(op="op-9", stage="other", dest="in"), table="t")
        for n, s in enumerate(about):
            w.emit_about(Kind.SEND, s, attempt=n % 2 or None, topic=f"out-{n % 2}")
        w.emit_about(Kind.CRASH, about[0], point="after_db_commit")

    alone, held = tmp_path / "alone", tmp_path / "held"
    with LedgerWriter(alone, "worker-0") as w:
        write(w)
    with LedgerWriter(held, "worker-0") as w, w.batch():
        write(w)
    lines = next((held / "segments").glob("*.jsonl")).read_text().splitlines()
    assert ['"n":' in line for line in lines] == [True, False, False, False, True, False]  # runs alike packed
    expected = _untimed(alone)
    assert _untimed(held) == expected
    assert _lines_read(held) == expected


def test_a_torn_packed_row_glued_to_the_next_loses_only_its_own_events(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "worker-0") as w:
        about = [w.subject(op=f"op-{n}", stage="s", dest="in") for n in range(3)]
        w.emit_each(Kind.DELIVER, about)
        w.emit_each(Kind.DB_COMMIT, about)
    (seg,) = (ledger / "segments").glob("*.jsonl")
    first, second = seg.read_bytes().splitlines(keepends=True)
    seg.write_bytes(first[: len(first) // 2] + second)  # the writer died inside its first write
    table, damaged = reader_segment_table(seg)
    assert damaged == 1
    assert table["kind"].to_pylist() == ["db_commit"] * 3
    assert table["seq"].to_pylist() == [3, 4, 5]
    rows, damaged = read_segment(seg)
    assert (damaged, [r["seq"] for r in rows]) == (1, [3, 4, 5])
