"""Benchmark of ledger verification: ``txchaos bench verify --sizes 1e6,1e7,1e8``.

Per size: synthesize a run, verify it with Spark in a fresh child process (so JVM start, a cold
job and the driver's peak memory are what ``txchaos verify`` sees), and with the in-process
checker where it fits; check both against the injected ground truth and each other. Prints a
table and replaces the issue-5 section of ``docs/benchmarks.md``.
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
from rich.table import Table

from harness.bench.report import write_section

SECTION = "Ledger verification (issue 5)"


def _child(engine: str, run_dir: str, out: str) -> None:
    """Verify ``run_dir`` in this (child) process and write timing and memory figures to ``out``."""
    from harness.verify.assemble import compare_verdicts  # noqa: F401  (warm the import like the CLI)
    from harness.verify.cli import contract_of

    run = Path(run_dir)
    result: dict[str, Any] = {}
    if engine == "spark":
        from harness.verify import spark

        t0 = time.perf_counter()
        session = spark.spark_session()
        jvm_start = time.perf_counter() - t0
        verdict = spark.check_run(run, contract_of(run), spark=session)
        # a second job in the same JVM: what every verification after the first one in a session
        # costs (the pytest plugin verifies each scenario's run in one shared session)
        result["warm_job_s"] = spark.check_run(run, contract_of(run), spark=session).timing["job_s"]
        pid = spark.driver_jvm_pid(session)
        status = Path(f"/proc/{pid}/status").read_text()
        hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        jvm: Any = session.sparkContext._jvm
        pools = jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
        heap = sum(p.getPeakUsage().getUsed() for p in pools if str(p.getType()) == "Heap memory")
        result |= {"jvm_start_s": round(jvm_start, 2), "driver_rss_mb": hwm // 1024, "driver_heap_peak_mb": heap >> 20}
        session.stop()
    else:
        from harness.verify import checker

        verdict = checker.check_run(run, contract_of(run))
        result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    result["verdict"] = verdict.to_dict()
    Path(out).write_text(json.dumps(result, default=str))


def _run_child(engine: str, run: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        code = f"from harness.bench.verify import _child; _child({engine!r}, {str(run)!r}, {fh.name!r})"
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{engine} verify of {run} failed:\n{proc.stderr[-3000:]}")
        out: dict[str, Any] = json.loads(Path(fh.name).read_text())
        out["wall_s"] = round(time.perf_counter() - started, 2)
        return out


def writer_cost(n: int = 50_000) -> float:
    """Return the mean cost of ``LedgerWriter.emit`` in microseconds per event."""
    from harness.ledger.schema import Kind
    from harness.ledger.writer import LedgerWriter

    with tempfile.TemporaryDirectory() as tmp, LedgerWriter(Path(tmp), "bench") as w:
        started = time.perf_counter()
        for i in range(n):
            w.emit(Kind.DELIVER, op=f"op-{i}", msg=f"ID:{i}", stage="s0", dest="orders", attempt=1)
        return (time.perf_counter() - started) / n * 1e6


def bench_size(events: int, work: Path, in_process_max: int) -> dict[str, Any]:
    """Synthesize (or reuse) a run of ``events`` events and verify it; return the figures."""
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
    row["events"] = manifest["events"]
    sp = _run_child("spark", run)
    verdict = Verdict.from_dict(sp["verdict"])
    truth = {k: v for k, v in manifest["ground_truth"].items() if v}
    row |= {k: sp[k] for k in ("jvm_start_s", "warm_job_s", "driver_rss_mb", "driver_heap_peak_mb")}
    row |= {
        "job_s": verdict.timing["job_s"],
        "phases": {k: v for k, v in verdict.timing.items() if k not in ("job_s", "jvm_start_s")},
    }
    row["events_per_s"] = int(manifest["events"] / verdict.timing["job_s"])
    row["truth_found"] = verdict.found() == truth
    if manifest["events"] <= in_process_max:
        ip = _run_child("in-process", run)
        local = Verdict.from_dict(ip["verdict"])
        row |= {
            "in_process_s": local.timing["job_s"],
            "in_process_rss_mb": ip["rss_mb"],
            "engines_agree": compare_verdicts(local, verdict) == [],
        }
    return row


def _yes(flag: object) -> str:
    return "-" if flag is None else ("yes" if flag else "NO")


def _markdown(rows: list[dict[str, Any]], command: str, emit_us: float) -> str:
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"Command: `{command}` on this machine ({os.cpu_count()} cores, Spark `local[*]`, driver 2 GiB).",
        f"Load average when the run ended (1/5/15 min): {load}; anything above ~2 means other work shared the cores.",
        "Spark runs in a fresh child process per size: JVM start, one cold `txchaos verify` job, then the same"
        " job again in that JVM (warm: what each later verification in a shared session costs).",
        f"`LedgerWriter.emit`: {emit_us:.1f} us per event ({1e6 / emit_us:,.0f} events/s, one `os.write` each).",
        "",
        "| events | synth s | JVM start s | job s | warm job s | events/s (job) | driver RSS MB "
        "| driver heap peak MB | truth found | in-process s | in-process RSS MB | engines agree |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---:|---:|:-:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['events']:,} | {r['synth_s'] if r['synth_s'] is not None else 'reused'} | {r['jvm_start_s']} "
            f"| {r['job_s']} | {r['warm_job_s']} | {r['events_per_s']:,} | {r['driver_rss_mb']} "
            f"| {r['driver_heap_peak_mb']} "
            f"| {'yes' if r['truth_found'] else 'NO'} | {r.get('in_process_s', '-')} "
            f"| {r.get('in_process_rss_mb', '-')} | {_yes(r.get('engines_agree'))} |"
        )
    lines += [
        "",
        "Spark job phases (s): "
        + "; ".join(f"{r['events']:,}: " + ", ".join(f"{k}={v}" for k, v in r["phases"].items()) for r in rows),
        "",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``txchaos bench verify [--sizes 1e6,1e7,1e8] [--work DIR] [--doc docs/benchmarks.md]``."""
    parser = argparse.ArgumentParser(prog="txchaos bench verify")
    parser.add_argument("--sizes", default="1e6,1e7", help="comma-separated event counts")
    parser.add_argument("--work", type=Path, default=Path("reports/bench"), help="where synthetic runs go")
    parser.add_argument("--in-process-max", type=float, default=2e7, help="largest size the in-process checker runs")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    console = Console()
    emit_us = writer_cost()
    console.print(f"LedgerWriter.emit: {emit_us:.1f} us/event")
    rows = []
    for size in sizes:
        console.print(f"[bold]size {size:,}[/bold] ...")
        rows.append(bench_size(size, args.work, int(args.in_process_max)))
        console.print(rows[-1])
    table = Table(title="ledger verification")
    cols = (
        "events",
        "synth_s",
        "jvm_start_s",
        "job_s",
        "warm_job_s",
        "events_per_s",
        "driver_rss_mb",
        "driver_heap_peak_mb",
        "truth_found",
        "in_process_s",
        "engines_agree",
    )
    for col in cols:
        table.add_column(col)
    for r in rows:
        table.add_row(*(str(r.get(c, "-")) for c in cols))
    console.print(table)
    command = "txchaos bench verify " + " ".join(argv if argv is not None else sys.argv[1:])
    write_section(SECTION, _markdown(rows, command.strip(), emit_us), args.doc)
    ok = all(r["truth_found"] and r.get("engines_agree", True) for r in rows)
    return 0 if ok else 1
