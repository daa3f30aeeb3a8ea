"""Benchmark of ledger verification: ``txchaos bench verify --sizes 1e6,1e7,1e8``.

Per size, on one synthetic run folder, each figure in a fresh child process: the DuckDB engine
(``txchaos verify --engine in-process``'s work), a plain DuckDB query of the same rules (the floor
for that engine), a cold ``txchaos verify`` (the Spark CLI: interpreter, JVM, session, job), the
Spark job again in a session already up (warm), and a bare PySpark ``local[*]`` start with one
trivial job (the floor for any Spark verification). Every verdict is checked against the injected
ground truth and the engines against each other. Prints the figures and their ratios and replaces
the verification section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.bench.report import DOC, write_section
from harness.stack import spark_connect

SECTION = "Ledger verification (issues 5 and 31)"
OLD_SECTION = "Ledger verification (issue 5)"
WARM_REPEATS = 2  # warm jobs per size; the fastest is reported (the first warm one still compiles a little)


def _rss_mb() -> int:
    """Return this process's peak RSS in MB.

    From ``VmHWM``: ``ru_maxrss`` survives fork and exec on Linux, so a child of a parent that
    has just synthesized 100M events (4.5 GB) would report the parent's peak as its own.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _child(kind: str, run_dir: str, out: str) -> None:
    """Measure one engine on ``run_dir`` in this (child) process; write its figures to ``out``."""
    from harness.verify.cli import contract_of

    run = Path(run_dir)
    contract = contract_of(run)
    result: dict[str, Any] = {}
    if kind == "duckdb":
        from harness.verify import checker

        verdict = checker.check_run(run, contract)
        result |= {"job_s": verdict.timing["job_s"], "rss_mb": _rss_mb(), "verdict": verdict.to_dict()}
    elif kind == "floor":
        from harness.verify import checker

        started = time.perf_counter()
        counts = checker.floor_counts(run, contract)
        result |= {"job_s": round(time.perf_counter() - started, 3), "rss_mb": _rss_mb(), "counts": counts}
    elif kind == "connect":
        from harness.verify import spark

        started = time.perf_counter()
        remote = spark.remote_session(os.environ[spark_connect.ENV])
        connect_s = round(time.perf_counter() - started, 3)
        first = spark.check_run(run, contract, spark=remote)
        warm = [spark.check_run(run, contract, spark=remote) for _ in range(WARM_REPEATS)]
        best = min(warm, key=lambda v: v.timing["job_s"])
        remote.stop()
        result |= {
            "connect_s": connect_s,
            "first_job_s": first.timing["job_s"],
            "job_s": best.timing["job_s"],
            "verdict": best.to_dict(),
        }
    else:
        from harness.verify import spark

        session = spark.spark_session()
        cold = spark.check_run(run, contract, spark=session)
        warm = [spark.check_run(run, contract, spark=session) for _ in range(WARM_REPEATS)]
        best = min(warm, key=lambda v: v.timing["job_s"])
        status = Path(f"/proc/{spark.driver_jvm_pid(session)}/status").read_text()
        hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        session.stop()
        result |= {
            "cold_job_s": cold.timing["job_s"],
            "job_s": best.timing["job_s"],
            "phases": {k: v for k, v in best.timing.items() if k not in ("job_s", "jvm_start_s")},
            "driver_rss_mb": hwm // 1024,
            "verdict": best.to_dict(),
        }
    Path(out).write_text(json.dumps(result, default=str))


def _python(code: str, *args: str, connect: str = "off") -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run ``code`` in a new interpreter reaching the Connect server ``connect`` (``off``: none, whatever
    stack is up, so the local figures stay local); return its wall time and the process."""
    env = dict(os.environ, **{spark_connect.ENV: connect})
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, env=env)
    return round(time.perf_counter() - started, 2), proc


def _run_child(kind: str, run: Path, connect: str = "off") -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        code = f"from harness.bench.verify import _child; _child({kind!r}, {str(run)!r}, {fh.name!r})"
        wall, proc = _python(code, connect=connect)
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} verify of {run} failed:\n{proc.stderr[-3000:]}")
        out: dict[str, Any] = json.loads(Path(fh.name).read_text())
        out["wall_s"] = wall
        return out


def cold_cli(run: Path, connect: str = "off") -> tuple[float, list[str]]:
    """Return the wall time of ``txchaos verify RUN`` in a new process (reaching the Connect server
    ``connect``, or none) and the lines it wrote to stderr."""
    code = "import sys; from harness.cli import main; sys.exit(main())"
    wall, proc = _python(code, "verify", str(run), connect=connect)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"txchaos verify {run} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall, proc.stderr.splitlines()


def bare_pyspark() -> float:
    """Return the wall time of a new process that starts a default PySpark session and runs one trivial job."""
    wall, proc = _python("from harness.verify.spark import bare_start; bare_start()")
    if proc.returncode != 0:
        raise RuntimeError(f"bare PySpark start failed:\n{proc.stderr[-3000:]}")
    return wall


def writer_cost(n: int = 50_000) -> float:
    """Return the mean cost of ``LedgerWriter.emit`` in microseconds per event."""
    from harness.ledger.schema import Kind
    from harness.ledger.writer import LedgerWriter

    with tempfile.TemporaryDirectory() as tmp, LedgerWriter(Path(tmp), "bench") as w:
        started = time.perf_counter()
        for i in range(n):
            w.emit(Kind.DELIVER, op=f"op-{i}", msg=f"ID:{i}", stage="s0", dest="orders", attempt=1)
        return (time.perf_counter() - started) / n * 1e6


def bench_size(events: int, work: Path, spark_max: int, connect: str | None = None) -> dict[str, Any]:
    """Synthesize (or reuse) a run of ``events`` events and measure every engine on it; return the figures."""
    from harness.ledger.synth import synth_run
    from harness.verify.assemble import compare_verdicts
    from harness.verify.verdict import Verdict

    run = work / f"synth-{events:.0e}".replace("+", "")
    row: dict[str, Any] = {"size": events}
    if (run / "manifest.json").is_file():
        row["synth_s"] = None  # reused
    else:
        started = time.perf_counter()
        synth_run(run, events, seed=1)
        row["synth_s"] = round(time.perf_counter() - started, 1)
    manifest = json.loads((run / "manifest.json").read_text())
    truth = {k: v for k, v in manifest["ground_truth"].items() if v}
    row["events"] = manifest["events"]
    row["load_before"] = os.getloadavg()[0]
    duck = _run_child("duckdb", run)
    local = Verdict.from_dict(duck["verdict"])
    floor = _run_child("floor", run)
    row |= {
        "duckdb_s": duck["job_s"],
        "duckdb_wall_s": duck["wall_s"],
        "duckdb_rss_mb": duck["rss_mb"],
        "floor_s": floor["job_s"],
        "floor_rss_mb": floor["rss_mb"],
        "duckdb_truth": local.found() == truth,
        "floor_truth": {k: v for k, v in floor["counts"].items() if v} == truth,
    }
    if events <= spark_max:
        sp = _run_child("spark", run)
        remote = Verdict.from_dict(sp["verdict"])
        cold_s, noise = cold_cli(run)
        bare_s = bare_pyspark()
        row |= {
            "spark_cold_cli_s": cold_s,
            "cli_stderr_lines": len(noise),
            "cli_stderr_head": noise[:5],
            "spark_warm_s": sp["job_s"],
            "spark_cold_job_s": sp["cold_job_s"],
            "spark_phases": sp["phases"],
            "driver_rss_mb": sp["driver_rss_mb"],
            "bare_pyspark_s": bare_s,
            "spark_truth": remote.found() == truth,
            "engines_agree": compare_verdicts(local, remote) == [],
        }
    if events <= spark_max and connect is not None:
        sc = _run_child("connect", run, connect)
        cli_s, _ = cold_cli(run, connect)
        via = Verdict.from_dict(sc["verdict"])
        row |= {
            "connect_first_s": sc["first_job_s"],
            "connect_warm_s": sc["job_s"],
            "connect_cli_s": cli_s,
            "connect_agree": compare_verdicts(local, via) == [] and via.found() == truth,
        }
    row["load_after"] = os.getloadavg()[0]
    return row


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or not b else f"{a / b:.2f}x"


def _yes(flag: object) -> str:
    return "-" if flag is None else ("yes" if flag else "NO")


def _markdown(rows: list[dict[str, Any]], command: str, emit_us: float) -> str:
    lines = [
        f"Command: `{command}` on this machine ({os.cpu_count()} cores; Spark `local[*]`, driver 2 GiB;"
        " DuckDB buffer pool 384 MB). Every figure comes from a fresh child process on the same run folder.",
        "",
        "- **DuckDB engine**: `checker.check_run` (what `txchaos verify --engine in-process` and every run's"
        " `verdict.json` cost): the job, and the child's peak RSS.",
        "- **DuckDB floor**: one plain DuckDB query of the same rules (`checker.floor_counts`: the summary and"
        " the anomaly counts, no statistics, overlay, writer check or witnesses).",
        "- **Spark cold CLI**: the wall time of a new `txchaos verify RUN` process (interpreter, JVM, session,"
        " job, verdict written).",
        "- **Spark warm**: the same job in a session already up, fastest of"
        f" {WARM_REPEATS} (what each verification after the first costs in the pytest plugin's shared session).",
        "- **bare PySpark**: a new process that starts a default `local[*]` session and counts `range(1)`.",
        "- **Connect**: a Spark Connect server as `txchaos up` starts and warms it (`stack/spark_connect.py`,"
        " `verify/spark/warm.py`), started once for the benchmark: its first job on each size, the job warm (fastest of"
        f" {WARM_REPEATS}), and the wall time of a new `txchaos verify RUN` process that reaches it.",
        "- The local figures never reach a Connect server (`TXCHAOS_SPARK_CONNECT=off` in their processes).",
        "",
        "| events | load 1-min before/after | DuckDB engine s | DuckDB floor s | engine/floor | DuckDB RSS MB "
        "| Spark warm s | warm/DuckDB | Spark cold CLI s | bare PySpark s | cold - (bare + warm) s "
        "| CLI stderr lines | truth found (DuckDB/floor/Spark) | engines agree "
        "| Connect first job s | Connect warm s | Connect warm/DuckDB | `txchaos verify` via Connect s |",
        "|---:|:-:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|---:|---:|---:|---:|",
    ]
    for r in rows:
        warm, cold, bare = r.get("spark_warm_s"), r.get("spark_cold_cli_s"), r.get("bare_pyspark_s")
        slack = "-" if cold is None or bare is None or warm is None else f"{cold - (bare + warm):+.2f}"
        truth = "/".join(_yes(r.get(k)) for k in ("duckdb_truth", "floor_truth", "spark_truth"))
        lines.append(
            f"| {r['events']:,} | {r['load_before']:.2f} / {r['load_after']:.2f} | {r['duckdb_s']} | {r['floor_s']} "
            f"| {_ratio(r['duckdb_s'], r['floor_s'])} | {r['duckdb_rss_mb']} | {warm or '-'} "
            f"| {_ratio(warm, r['duckdb_s'])} | {cold or '-'} | {bare or '-'} | {slack} "
            f"| {r.get('cli_stderr_lines', '-')} | {truth} | {_yes(r.get('engines_agree'))} "
            f"| {r.get('connect_first_s', '-')} | {r.get('connect_warm_s', '-')} "
            f"| {_ratio(r.get('connect_warm_s'), r['duckdb_s'])} | {r.get('connect_cli_s', '-')} |"
        )
    lines += ["", "Spark warm job phases (s): "]
    lines[-1] += "; ".join(
        f"{r['events']:,}: " + ", ".join(f"{k}={v}" for k, v in r["spark_phases"].items())
        for r in rows
        if "spark_phases" in r
    )
    lines += [
        "",
        "Targets (issue 31): DuckDB engine <= 1.5x its floor and under 1 GB at 10M events; Spark warm <= 3x the"
        " DuckDB engine at 10M (<= 1.5x at 100M); a cold `txchaos verify` <= bare PySpark + Spark warm.",
        f"`LedgerWriter.emit`: {emit_us:.1f} us per event ({1e6 / emit_us:,.0f} events/s, one `os.write` each).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``txchaos bench verify [--sizes 1e6,1e7,1e8] [--work DIR] [--spark-max N] [--no-write]``."""
    parser = argparse.ArgumentParser(prog="txchaos bench verify")
    parser.add_argument("--sizes", default="1e6,1e7,1e8", help="comma-separated event counts")
    parser.add_argument("--work", type=Path, default=Path("reports/bench"), help="where synthetic runs go")
    parser.add_argument("--spark-max", type=float, default=1e9, help="largest size the Spark figures are taken at")
    parser.add_argument("--doc", type=Path, default=DOC, help="the file to write (default: the checkout's own)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--no-connect", action="store_true", help="take no Spark Connect figures")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    console = Console(markup=False)
    emit_us = writer_cost()
    rows = []
    with tempfile.TemporaryDirectory(prefix="txchaos-bench-connect-") as state:
        stack_id = f"bench-{os.getpid()}"
        try:
            url = None if args.no_connect else spark_connect.start(Path(state), stack_id)
            if url is not None:  # as `txchaos up` does, but waited for: the figures are a warmed server's
                env = dict(os.environ, **{spark_connect.ENV: url})
                warm = [sys.executable, "-m", "harness.verify.spark.warm"]
                subprocess.run(warm, env=env, cwd=state, check=True, capture_output=True)
            for size in sizes:
                console.print(f"size {size:,} ...", style="bold")
                rows.append(bench_size(size, args.work, int(args.spark_max), url))
                console.print(rows[-1])
        finally:
            spark_connect.stop(Path(state), stack_id)
    command = "txchaos bench verify " + " ".join(argv if argv is not None else sys.argv[1:])
    body = _markdown(rows, command.strip(), emit_us)
    sys.stdout.write(body)
    if not args.no_write:
        doc = args.doc.read_text() if args.doc.is_file() else ""
        # the issue-5 section had this benchmark's figures under the old title: replace it in place
        if f"## {OLD_SECTION}\n" in doc:
            args.doc.write_text(doc.replace(f"## {OLD_SECTION}\n", f"## {SECTION}\n", 1))
        write_section(SECTION, body, args.doc)
    keys = ("duckdb_truth", "floor_truth", "spark_truth", "engines_agree", "connect_agree")
    return 0 if all(r.get(k, True) for r in rows for k in keys) else 1
