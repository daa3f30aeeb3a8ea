"""Benchmark the Kafka at-least-once consumer with Postgres effects: clean-path throughput.

``txchaos bench kafka [--messages 30000] [--batch 500] [--workers 1]`` runs the consumer variants
of ``scenarios/kafka_consumer_scenario.py`` without crashes on one backlog each, prints messages/s
(first submission to last output record), and records them in docs/benchmarks.md. Target (issue
4): >= 3,000 messages/s for the at-least-once consumer with Postgres effects.

Every record goes through Toxiproxy both ways, its effect is a Postgres row (one DB transaction
per batch, one multi-row INSERT), its output an event on the output topic, and the offsets are
committed after each batch. The run's verdict must be clean: a fast run that loses records is
not a throughput figure.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from harness.bench.report import bench_parser, table, write_section
from harness.bench.stack import run_seconds
from harness.run.core.session import run_scenario
from harness.run.spec.flow import flow_named
from harness.run.spec.scenario import ScenarioSpec
from harness.stack.base import Endpoints
from harness.stack.local import LocalProvider

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup

# variant -> (handler, extra options, what it is)
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "naive-batch": ("naive_batch", {}, "naive at-least-once, offsets after the DB commit"),
    "inbox-offset-batch": ("inbox_offset_batch", {}, "inbox keyed by (topic, partition, offset)"),
    "transactional": ("inbox_offset_batch", {"commit": "transaction"}, "inbox + outputs and offsets in one Kafka tx"),
}


def spec(variant: str, messages: int, batch: int, workers: int, partitions: int) -> ScenarioSpec:
    """Return the clean-path run of ``variant`` on a backlog of ``messages`` records."""
    handler, extra, _ = VARIANTS[variant]
    return ScenarioSpec(
        name="bench_kafka",
        variant=variant,
        flow=flow_named("kafka"),
        handler=f"harness.patterns.kafka_consumer:{handler}",
        schema="kafka_consumer",
        effect_table="kafka_effects",
        options={"batch_size": batch, "db_tx": "batch", "partitions": partitions, **extra},
        messages=messages,
        workers=workers,
        timeout_s=max(60.0, messages / 200),
        settle_s=0.2,
    )


def _measure(endpoints: Endpoints, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    with console.status(f"{variant}: {args.messages} records, batch {args.batch}, {args.workers} worker(s)"):
        result = run_scenario(spec(variant, args.messages, args.batch, args.workers, args.partitions), endpoints)
    took = run_seconds(result.run_dir)
    rate = args.messages / took
    console.print(f"{variant}: {rate:.0f} msg/s ({took:.2f} s) {result.verdict.headline()}")
    return {"variant": variant, "rate": rate, "took": took, "verdict": result.verdict.headline()}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("kafka")
    parser.add_argument("--messages", type=int, default=30_000, help="records in each run's backlog")
    parser.add_argument("--batch", type=int, default=500, help="records per poll and per DB transaction")
    parser.add_argument("--workers", type=int, default=1, help="consumer processes in the group")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the input topic")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown or not chosen:
        parser.error(f"unknown variant(s) {unknown or chosen!r}: choose from {', '.join(VARIANTS)}")
    for v in chosen:
        spec(v, args.messages, args.batch, args.workers, args.partitions)  # bad values fail before any service

    provider = LocalProvider()
    endpoints = provider.start()
    try:
        results = [_measure(endpoints, v, args) for v in chosen]
    finally:
        provider.stop()
    rows: list[list[object]] = [
        [f"`{r['variant']}`: {VARIANTS[r['variant']][2]}", f"{r['rate']:.0f} msg/s", f"{r['took']:.2f} s", r["verdict"]]
        for r in results
    ]
    text = table(["consumer (clean path, no faults)", "throughput", "first submit to last output", "verdict"], rows)
    console.print(text)
    if not args.no_write:
        body = (
            f"Command: `txchaos bench kafka --messages {args.messages} --batch {args.batch} "
            f"--workers {args.workers} --partitions {args.partitions}` (local provider). Target: "
            ">= 3,000 msg/s for the at-least-once consumer with Postgres effects.\n\n"
            f"{text}\n\nEach run: a backlog of records on a {args.partitions}-partition topic, "
            f"{args.workers} consumer process(es) polling batches of {args.batch}, one Postgres "
            "transaction per batch (one multi-row INSERT of the effects, and of the inbox rows where "
            "there is an inbox), an output event per record, offsets committed after each batch; "
            "Kafka and Postgres both through Toxiproxy. Throughput is records over the time from the "
            "first submission to the last output record read back."
        )
        console.print(f"written to {write_section('Kafka at-least-once consumer throughput (issue 4)', body)}")
    return 0
