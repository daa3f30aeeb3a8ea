"""Benchmark the stack: cold start of every service, per-test reset, clean-path throughput.

``txchaos bench stack [--starts 3] [--resets 30] [--messages 2000]`` prints the figures and
records them in docs/benchmarks.md. Targets (issue 2): cold start <= 20 s, reset <= 200 ms.
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console

from harness.bench.report import bench_parser, table, write_section
from harness.run.core.session import run_scenario
from harness.run.spec.scenario import ScenarioSpec
from harness.stack.local import LocalProvider
from harness.stack.reset import Resetter

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("stack")
    parser.add_argument("--starts", type=int, default=3, help="cold starts to time")
    parser.add_argument("--resets", type=int, default=30, help="per-test resets to time")
    parser.add_argument("--messages", type=int, default=2000, help="messages in the throughput run")
    args = parser.parse_args(argv)

    starts: list[dict[str, float]] = []
    for i in range(args.starts):
        with console.status(f"cold start {i + 1}/{args.starts}"):
            provider = LocalProvider()
            t0 = time.monotonic()
            try:
                provider.start()
                took = time.monotonic() - t0
                starts.append({**provider.timings, "wall": took})
            finally:
                provider.stop()
        console.print(f"cold start {i + 1}: {took:.2f}s")

    provider = LocalProvider()
    endpoints = provider.start()
    try:
        resetter = Resetter(endpoints)
        with console.status("timing resets"):
            warm = run_scenario(_spec(50, "warmup"), endpoints)  # queues with residue to purge
            resetter.track_queues([f"txchaos.{warm.run_dir.name}.in", f"txchaos.{warm.run_dir.name}.out"])
            resets = [resetter.reset() * 1000 for _ in range(args.resets)]
        resetter.close()
        with console.status(f"clean-path throughput, {args.messages} messages"):
            result = run_scenario(_spec(args.messages, "throughput"), endpoints)
    finally:
        provider.stop()
    lat = result.verdict.stats["latency_ms"]
    manifest_took = run_seconds(result.run_dir)
    rate = args.messages / manifest_took
    rows: list[list[object]] = [
        [
            f"cold start, all services incl. DTM (median of {len(starts)})",
            f"{statistics.median(s['wall'] for s in starts):.2f} s",
            "<= 20 s",
        ],
        ["  slowest service wait (kafka, median)", f"{statistics.median(s.get('kafka', 0) for s in starts):.2f} s", ""],
        ["  dtm wait (median)", f"{statistics.median(s.get('dtm', 0) for s in starts):.2f} s", ""],
        [
            f"per-test reset (median / p95 of {len(resets)})",
            f"{statistics.median(resets):.0f} ms / {_pct(resets, 0.95):.0f} ms",
            "<= 200 ms",
        ],
        [f"clean-path throughput, 1PC check-then-skip, 1 worker, {args.messages} msgs", f"{rate:.0f} msg/s", ""],
        [
            "  end-to-end latency p50 / p95 (all submitted at once: mostly queueing)",
            f"{lat.get('p50', 0):.0f} ms / {lat.get('p95', 0):.0f} ms",
            "",
        ],
        ["  verdict", result.verdict.headline(), "CLEAN"],
    ]
    text = table(["measure", "value", "target"], rows)
    console.print(text)
    if not args.no_write:
        body = (
            f"Command: `txchaos bench stack --starts {args.starts} --resets {args.resets} "
            f"--messages {args.messages}` (local provider).\n\n{text}\n\n"
            "Throughput is messages over the run's submit-to-quiescence time, each message a STOMP "
            "transaction with a Postgres transaction inside, through Toxiproxy."
        )
        console.print(f"written to {write_section('Stack and first scenario (issue 2)', body)}")
    return 0


def _spec(messages: int, variant: str) -> ScenarioSpec:
    return ScenarioSpec(
        name="bench",
        variant=variant,
        handler="harness.patterns.onepc:check_then_skip",
        schema="onepc",
        effect_table="onepc_effects",
        options={"table": "onepc_effects"},
        messages=messages,
        timeout_s=max(60.0, messages / 20),
        settle_s=0.2,
    )


def run_seconds(run_dir: object) -> float:
    """Return the seconds from the first submission to the last downstream event (manifest time if none)."""
    import json
    from pathlib import Path

    from harness.ledger.reader import read_ledger

    events = read_ledger(Path(str(run_dir)) / "ledger").to_pydict()
    submits = [t for t, k in zip(events["ts_ns"], events["kind"], strict=True) if k == "submit"]
    downs = [t for t, k in zip(events["ts_ns"], events["kind"], strict=True) if k == "downstream"]
    if not submits or not downs:
        manifest = json.loads((Path(str(run_dir)) / "manifest.json").read_text())
        return float(manifest.get("took_s", 1.0))
    return float(max(downs) - min(submits)) / 1e9
