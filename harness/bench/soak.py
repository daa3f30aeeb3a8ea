"""Benchmark soaks against the machine's limit, side by side on one stack: ``txchaos bench soak``.

For each flow the benchmark measures, on the same stack and in the same run, the bare loop
(``harness.bench.bare``: the same broker and database work per message, no harness) and the soak's
clean path (``--nemesis none``), then the soak under the default nemesis and a naive variant's soak
with its anomaly counts, and a service soak with several instances. Every soak runs in a child
process of its own, so its driver's peak RSS is its own; each soak's ledger is then verified again
by the in-process engine and by Spark (``local[*]``), timed. Soak throughput is end to end: first
submission to the verdict.

    txchaos bench soak [--activemq-ops 20000] [--kafka-ops 200000] [--workers 4] [--no-write]
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from rich.console import Console

from harness.bench.bare import BareResult, bare_activemq, bare_kafka
from harness.bench.kafka import spec as kafka_spec
from harness.bench.report import CHECKOUT, bench_parser, bench_stack, table, write_section
from harness.errors import HarnessError
from harness.resources import scenarios_dir
from harness.run.spec.files import resolve
from harness.soak.driver import SUMMARY, run_soak
from harness.soak.nemesis import DEFAULT
from harness.soak.spec import Soak
from harness.stack.base import Endpoints
from harness.verify.checker import check_run
from harness.verify.cli import contract_of, verify_run

console = Console(highlight=False, emoji=False, soft_wrap=True)
SCENARIOS = scenarios_dir()
EXAMPLES = CHECKOUT / "examples" / "services"  # the example services live in a checkout only
NO_CRASH = tuple(k for k in DEFAULT if k not in ("crash", "freeze"))  # a service has no crash points


@dataclass(frozen=True)
class Case:
    """One soak of the benchmark: its row label and how to build it for ``ops`` operations."""

    label: str
    build: Callable[[int, int], Soak]  # (ops, workers) -> Soak
    size: str  # "activemq", "kafka" or "service": which --*-ops sets its size
    versus: bool = False  # the clean path: compared with its flow's bare loop


def _onepc(variant: str, nemesis: tuple[str, ...]) -> Callable[[int, int], Soak]:
    def build(ops: int, workers: int) -> Soak:
        (spec,) = resolve(f"onepc_crash_gap:{variant}", 0, SCENARIOS)
        return Soak(spec, ops=ops, workers=workers, nemesis=nemesis, quiesce_s=300)

    return build


def _kafka(nemesis: tuple[str, ...]) -> Callable[[int, int], Soak]:
    def build(ops: int, workers: int) -> Soak:
        spec = kafka_spec("inbox-offset-batch", ops, 500, 1, 3)
        # A backlog as fast as the producer goes (the bare loop's fill), consumed in batches of 500.
        return Soak(spec, ops=ops, workers=1, nemesis=nemesis, window=ops, quiesce_s=300)

    return build


def _service(ops: int, workers: int) -> Soak:
    (spec,) = resolve("services:py-fixed", 0, EXAMPLES)
    return Soak(spec, ops=ops, workers=min(workers, 3), nemesis=NO_CRASH, quiesce_s=300)


CASES = (
    Case("ActiveMQ 1PC stage `check-then-skip`, `--nemesis none`", _onepc("check-then-skip", ()), "activemq", True),
    Case(
        "ActiveMQ 1PC stage `check-then-skip-locked`, default nemesis",
        _onepc("check-then-skip-locked", DEFAULT),
        "activemq",
    ),
    Case("ActiveMQ 1PC stage `naive`, default nemesis", _onepc("naive", DEFAULT), "activemq"),
    Case("Kafka inbox consumer (batch 500, 3 partitions), `--nemesis none`", _kafka(()), "kafka", True),
    Case("Kafka inbox consumer (batch 500, 3 partitions), default nemesis", _kafka(DEFAULT), "kafka"),
    Case("service `py-fixed` (instances behind trap proxies), default nemesis", _service, "service"),
)


def _child(case: int, ops: int, workers: int, endpoints: str, out: Any) -> None:
    """Run one soak in this (spawned) process and send back its folder."""
    soak = CASES[case].build(ops, workers)
    result = run_soak(soak, Endpoints.from_json(endpoints), progress=lambda _: None)
    out.put(str(result.run_dir))


def _result_of(child: Any, queue: Any) -> Path:
    """Return the folder ``child`` sends back; a child that ends without one fails the benchmark."""
    while True:
        try:
            return Path(queue.get(timeout=1.0))
        except Empty:
            if not child.is_alive():
                child.join()
                raise HarnessError(
                    f"a soak of the benchmark ended (exit {child.exitcode}) without a verdict",
                    hint="its traceback is above; the run folder under reports/runs keeps its ledger and logs",
                ) from None


def _soak(case: int, ops: int, workers: int, endpoints: Endpoints) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(case, ops, workers, endpoints.to_json(), queue))
    with console.status(f"{CASES[case].label}: {ops:,} ops"):
        child.start()
        run_dir = _result_of(child, queue)
        child.join()
    summary: dict[str, Any] = json.loads((run_dir / SUMMARY).read_text())
    started = time.monotonic()
    inproc = check_run(run_dir, contract_of(run_dir))
    summary["inproc_s"] = time.monotonic() - started
    started = time.monotonic()
    spark = verify_run(run_dir, engine="spark")
    summary["spark_s"], summary["spark_job_s"] = time.monotonic() - started, spark.timing.get("job_s", 0.0)
    summary["spark_agrees"] = spark.found() == summary["counts"]
    summary["events"] = inproc.stats["events"]
    summary["run_dir"] = run_dir
    stats = summary["stats"]
    console.print(
        f"{CASES[case].label}: {stats['ops_per_s']:,.0f} ops/s, {summary['outcome']} {summary['counts']}, "
        f"RSS {stats['driving_rss_mb']:.0f} MB driving, {stats['driver_peak_rss_mb']:.0f} MB peak, "
        f"in-process {summary['inproc_s']:.1f}s, Spark {summary['spark_s']:.1f}s"
    )
    return summary


def _bare(flow: str, messages: int, workers: int, endpoints: Endpoints) -> BareResult:
    """Run the bare loop of ``flow`` ("activemq" or "kafka") on ``endpoints``."""
    if flow == "activemq":
        with console.status(f"bare loop: ActiveMQ, {messages:,} messages, {workers} processes"):
            return bare_activemq(endpoints, messages=messages, workers=workers)
    with console.status(f"bare loop: Kafka, {messages:,} records"):
        return bare_kafka(endpoints, messages=messages)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("soak")
    parser.add_argument("--activemq-ops", type=int, default=20_000)
    parser.add_argument("--kafka-ops", type=int, default=200_000)
    parser.add_argument("--service-ops", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=4, help="ActiveMQ workers (and bare-loop processes)")
    args = parser.parse_args(argv)
    ops = {"activemq": args.activemq_ops, "kafka": args.kafka_ops, "service": args.service_ops}
    for case in CASES:  # every soak is valid before any service starts
        case.build(ops[case.size], args.workers)
    rows: list[list[object]] = []
    bare: dict[str, float] = {}
    with bench_stack() as endpoints:
        for i, case in enumerate(CASES):
            if case.size not in bare and case.size in ("activemq", "kafka"):
                # Each flow's limit is measured right before its soaks: a million-record Kafka fill
                # leaves the broker flushing for a while, which an ActiveMQ soak after it would pay.
                got = _bare(case.size, ops[case.size], args.workers, endpoints)
                bare[case.size] = got.ops_per_s
                name = (
                    f"ActiveMQ ({args.workers} processes)"
                    if case.size == "activemq"
                    else "Kafka (1 consumer, batch 500)"
                )
                rows.append([f"bare loop, {name}", f"{got.messages:,}", f"{got.seconds:.1f}", f"{got.ops_per_s:,.0f}"])
                rows[-1] += ["-"] * 5 + ["the machine's limit"]
            s = _soak(i, ops[case.size], args.workers, endpoints)
            stats = s["stats"]
            versus = f"{stats['ops_per_s'] / bare[case.size]:.0%} of the bare loop" if case.versus else ""
            counts = ", ".join(f"{k}={v}" for k, v in s["counts"].items()) or "clean"
            rows.append(
                [
                    case.label,
                    f"{stats['submitted']:,}",
                    f"{stats['wall_s']:.1f}",
                    f"{stats['ops_per_s']:,.0f}",
                    f"{stats['driving_rss_mb']:.0f} / {stats['driver_peak_rss_mb']:.0f}",
                    f"{s['events']:,}",
                    f"{s['inproc_s']:.1f}",
                    f"{s['spark_s']:.1f} (job {s['spark_job_s']:.1f})" + ("" if s["spark_agrees"] else " DISAGREES"),
                    f"{stats['windows']} windows, {stats['kills']} kills, {stats['crashes_armed']} arms",
                    f"{counts}; {versus}".strip("; "),
                ]
            )
    headers = ["run", "ops", "wall s", "ops/s (end to end)", "driver RSS MB (driving / peak)", "ledger events"]
    headers += ["in-process verify s", "Spark verify s", "nemesis", "verdict; vs bare loop"]
    text = table(headers, rows)
    console.print(text)
    if not args.no_write:
        command = (
            f"txchaos bench soak --activemq-ops {args.activemq_ops} --kafka-ops {args.kafka_ops} "
            f"--service-ops {args.service_ops} --workers {args.workers}"
        )
        body = (
            f"Command: `{command}` (one stack; every soak in a child process of its own). Soak "
            "throughput is end to end, first submission to the in-process verdict; the bare loops "
            "(`harness.bench.bare`) do the same broker and database work per message without the "
            "harness, on the same stack in the same run, and their time runs from the first message "
            "consumed to the last output. Verify columns re-verify the finished folder (Spark: "
            f"`local[*]`, JVM start included).\n\n{text}\n\nRun folders: `reports/runs/` (`$TXCHAOS_REPORTS`)."
        )
        console.print(f"written to {write_section('Soak runs against the bare loop (issue 32)', body)}")
    return 0
