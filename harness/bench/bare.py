"""Bare loops: the machine's limit for a flow, measured on the stack the soak benchmark runs on.

A bare loop does per message the same broker and database work as the harness's stage for that
flow, without the harness: no ledger, no supervision, no SQLAlchemy. The soak benchmark runs
them in the same run and on the same stack as the harness, so its figures read against what the
machine can do at all:

- ``bare_activemq``: best-effort 1PC stage processes (STOMP transaction around a Postgres
  transaction, check-then-insert of the effect) and a sink (``harness.bench.bare_activemq``);
- ``bare_kafka``: inbox-offset batch consumers (one Postgres transaction per batch, outputs,
  offsets committed after the DB commit) (``harness.bench.bare_kafka``).

Each creates its own uniquely named tables, queues and topics and removes them afterwards, and
raises ``HarnessError`` unless every message left exactly one effect: a fast loop that loses
messages is not a figure.

``python -m harness.bench.bare activemq|kafka [--messages N] ...`` starts a local stack, runs one
loop and prints its figure; it writes nothing (the soak benchmark records the figures).
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from harness.bench.bare_activemq import bare_activemq
from harness.bench.bare_kafka import bare_kafka
from harness.bench.bare_loop import BareResult
from harness.stack.local import LocalProvider

__all__ = ["BareResult", "bare_activemq", "bare_kafka", "main"]

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.bare", description=__doc__.splitlines()[0])
    flows = parser.add_subparsers(dest="flow", required=True)
    amq = flows.add_parser("activemq", help="best-effort 1PC stage processes over STOMP")
    amq.add_argument("--messages", type=int, default=20000, help="messages sent while the workers consume")
    amq.add_argument("--workers", type=int, default=4, help="stage processes")
    amq.add_argument(
        "--clients",
        choices=("raw", "libraries"),
        default="raw",
        help="raw: a socket STOMP client and psycopg (the limit); libraries: the stage's StompClient and SQLAlchemy",
    )
    kafka = flows.add_parser("kafka", help="inbox-offset batch consumers")
    kafka.add_argument("--messages", type=int, default=200000, help="records produced while consumed")
    kafka.add_argument("--consumers", type=int, default=1, help="consumer processes")
    kafka.add_argument("--partitions", type=int, default=3, help="partitions of the input topic")
    kafka.add_argument("--batch", type=int, default=500, help="records per poll and per DB transaction")
    for sub in (amq, kafka):
        sub.add_argument("--direct", action="store_true", help="bypass Toxiproxy (default: through it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    provider = LocalProvider()
    endpoints = provider.start()
    try:
        with console.status(f"bare {args.flow} loop, {args.messages} messages"):
            if args.flow == "activemq":
                result = bare_activemq(
                    endpoints,
                    messages=args.messages,
                    workers=args.workers,
                    via_proxy=not args.direct,
                    clients=args.clients,
                )
            else:
                result = bare_kafka(
                    endpoints,
                    messages=args.messages,
                    consumers=args.consumers,
                    partitions=args.partitions,
                    batch=args.batch,
                    via_proxy=not args.direct,
                )
    finally:
        provider.stop()
    headers = ["flow", "clients", "messages", "effect rows", "processes", "path", "seconds", "ops/s"]
    headers += ["consuming s", "ops/s consuming"]
    table = Table(*headers, title="bare loop (no harness)")
    path = "Toxiproxy" if result.via_proxy else "direct"
    r = result
    table.add_row(
        r.flow,
        r.clients if r.flow == "activemq" else "raw",
        str(r.messages),
        str(r.effects),
        str(r.workers),
        path,
        f"{r.seconds:.2f}",
        f"{r.ops_per_s:.0f}",
        f"{r.consume_seconds:.2f}",
        f"{r.consume_ops_per_s:.0f}",
    )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
