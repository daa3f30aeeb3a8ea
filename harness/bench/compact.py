"""What the close of a long run holds: ``txchaos bench compact RUN_DIR [RUN_DIR ...]``.

A soak's driver stays flat while it drives; its peak comes at the close, where the ledger's
segments are compacted into the bucketed Parquet layout and judged in-process. This benchmark
repeats that close on finished run folders: each folder is hard-linked into a scratch copy beside
it without its compacted ledger and verdicts (the run folder itself is left as it is), and a new
interpreter compacts the copy and judges it, recording the wall time and the peak RSS (VmHWM)
after each step. The scratch copy is removed afterwards, whatever happens.

    txchaos bench compact RUN_DIR [RUN_DIR ...] [--no-write]
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.bench.report import bench_parser, table, write_section
from harness.bench.verify import _python, _rss_mb
from harness.ledger.reader import segments_bytes

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup
SECTION = "The close of a long run: streaming compaction (issue 32)"
HEADERS = [
    "run",
    "events",
    "segments MB",
    "compact s",
    "peak RSS after compact MB",
    "in-process verify s",
    "peak RSS of the close MB",
    "verdict",
]
LEFT_OUT = ("events.parquet", "verdict.json", "verdict-spark.json")  # what the close makes again


def _child(run_dir: str, out: str) -> None:
    """Compact and judge the scratch folder ``run_dir`` in this (new) process; write the figures to ``out``."""
    from harness.ledger.reader import compact
    from harness.verify import checker
    from harness.verify.cli import contract_of

    run = Path(run_dir)
    started = time.perf_counter()
    layout = compact(run / "ledger") / "_layout.json"
    compacted = time.perf_counter()
    compact_rss = _rss_mb()
    verdict = checker.check_run(run, contract_of(run))
    result: dict[str, Any] = {
        "events": json.loads(layout.read_text())["events"],
        "compact_s": round(compacted - started, 1),
        "compact_rss_mb": compact_rss,
        "verify_s": round(time.perf_counter() - compacted, 1),
        "rss_mb": _rss_mb(),
        "verdict": verdict.headline(),
    }
    Path(out).write_text(json.dumps(result))


def measure(run: Path) -> list[object]:
    """Return one table row: the close of ``run`` (which holds ``ledger/segments``, as ``main`` checks)
    repeated on a scratch copy in a new interpreter."""
    scratch = Path(tempfile.mkdtemp(prefix=".bench-compact-", dir=run.parent))  # hard links need one filesystem
    try:
        copy = scratch / run.name
        shutil.copytree(run, copy, copy_function=os.link, ignore=lambda _d, names: [n for n in names if n in LEFT_OUT])
        with tempfile.NamedTemporaryFile(suffix=".json") as fh:
            code = f"from harness.bench.compact import _child; _child({str(copy)!r}, {fh.name!r})"
            _, proc = _python(code)
            if proc.returncode != 0:
                raise RuntimeError(f"the close of {run} failed:\n{proc.stderr[-3000:]}")
            got: dict[str, Any] = json.loads(Path(fh.name).read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size_mb = segments_bytes(run / "ledger") / 2**20
    return [
        f"`{run.name}`",
        f"{got['events']:,}",
        f"{size_mb:,.0f}",
        got["compact_s"],
        f"{got['compact_rss_mb']:,}",
        got["verify_s"],
        f"{got['rss_mb']:,}",
        got["verdict"],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("compact")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="finished run folders (reports/runs/...)")
    args = parser.parse_args(argv)
    for run in args.runs:  # every folder is checked before any is measured
        if not (run / "ledger" / "segments").is_dir():
            parser.error(f"{run}: no ledger/segments in it; pass a run folder written by `txchaos soak`")
    rows = []
    for run in args.runs:
        console.print(f"closing a copy of {run} ...")
        rows.append(measure(run.resolve()))
    text = table(HEADERS, rows)
    console.print(text)
    if not args.no_write:
        command = "txchaos bench compact " + " ".join(f"reports/runs/{r.resolve().name}" for r in args.runs)
        body = (
            f"Command: `{command}` (run folders from `txchaos bench soak --only nemesis`). The close a "
            "soak makes, repeated on a hard-linked copy of each finished run in a new interpreter: "
            "compaction of the JSON-lines segments into the bucketed Parquet layout (streamed: segments "
            "read in blocks, spilled by bucket, each bucket sorted alone), then the in-process verdict. "
            f"Peak RSS is the interpreter's VmHWM after each step.\n\n{text}"
        )
        console.print(f"written to {write_section(SECTION, body)}")
    return 0
