"""Does a STOMP subscription's COMMIT slow as it ages? ``txchaos bench acks``.

A stage worker consumes one message at a time and ACKs it inside a STOMP transaction, which it
then commits (the best-effort 1PC stage's broker side). ActiveMQ 6.1.8's STOMP subscription keeps
every ACK made in a transaction in a list, and each COMMIT scans that list; it empties the list on
COMMIT only for ``client`` acks, never for ``client-individual`` ones. So with ``client-individual``
every COMMIT costs more than the one before, for as long as the subscription lives.

For each ack mode the benchmark fills a queue of its own with ``--messages`` messages, then one
subscriber (prefetch 1, straight to the broker: the broker's cost, not Toxiproxy's) receives,
ACKs in a transaction and commits each, waiting for the COMMIT's RECEIPT. It prints the ACKs per
second of each block of ``--block`` messages: flat for ``client``, falling for ``client-individual``.
The stage subscribes with ``client`` acks (``StageWorker._subscribe``); this shows why.

    txchaos bench acks [--messages 30000] [--block 5000] [--no-write]
"""

from __future__ import annotations

import time
import uuid

from rich.console import Console

from harness.bench.report import bench_parser, bench_stack, table, write_measured
from harness.clients.activemq import StompClient, drain
from harness.errors import HarnessError
from harness.stack.base import Endpoints

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup
MODES = ("client-individual", "client")
SECTION = "STOMP transacted ACKs over a subscription's life (issue 32)"


def blocks(endpoints: Endpoints, mode: str, messages: int, block: int) -> list[float]:
    """Return the ACKs per second of each ``block`` of ``messages`` acked and committed one by one
    on one subscription with ``mode`` acks; the queue is the run's own and is left empty."""
    ep = endpoints.stomp
    host, port = ep.upstream_host, ep.upstream_port
    queue = f"txchaos.bench.acks.{mode}.{uuid.uuid4().hex[:8]}"
    with StompClient(host, port) as producer:
        for i in range(messages):
            producer.send(queue, f"m-{i}")
    rates: list[float] = []
    with StompClient(host, port) as consumer:
        consumer.subscribe(queue, ack=mode, prefetch=1)
        started = time.perf_counter()
        for i in range(messages):
            msg = consumer.receive(10.0)
            if msg is None:
                raise HarnessError(f"{queue}: message {i} of {messages} did not come within 10 s")
            tx = consumer.begin()
            consumer.ack(msg, transaction=tx)
            consumer.commit(tx)
            if (i + 1) % block == 0:
                now = time.perf_counter()
                rates.append(block / (now - started))
                started = now
    with StompClient(host, port) as left:  # nothing may be left: every COMMIT was receipted
        rest = sum(1 for _ in drain(left, [queue], max_s=5.0))
    if rest:
        raise HarnessError(f"{queue}: {rest} message(s) still queued after every ACK was committed")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("acks")
    parser.add_argument("--messages", type=int, default=30_000, help="messages per ack mode (default 30000)")
    parser.add_argument("--block", type=int, default=5_000, help="messages per measured block (default 5000)")
    args = parser.parse_args(argv)
    if args.block < 1 or args.messages < args.block:
        parser.error(
            f"--messages {args.messages} --block {args.block}: give a block of 1 or more, at most the messages"
        )
    rows: list[list[object]] = []
    with bench_stack() as endpoints:
        for mode in MODES:
            with console.status(f"{mode}: {args.messages:,} messages, one transaction each"):
                rates = blocks(endpoints, mode, args.messages, args.block)
            rows.append([f"`{mode}`", *(f"{r:,.0f}" for r in rates), f"{rates[-1] / rates[0]:.0%}"])
            console.print(f"{mode}: " + ", ".join(f"{r:,.0f}" for r in rates) + " ACKs/s per block")
    edges = [f"{b * args.block:,}-{(b + 1) * args.block:,}" for b in range(args.messages // args.block)]
    text = table(["ack mode", *edges, "last / first"], rows)
    console.print(text)
    if not args.no_write:
        command = f"txchaos bench acks --messages {args.messages} --block {args.block}"
        what = (
            "One subscriber per ack mode, prefetch 1, straight to the broker (no Toxiproxy): receive, ACK in "
            "a STOMP transaction, COMMIT with a RECEIPT, message by message on a queue filled beforehand. "
            "ACKs per second of each block of messages, in the order they were consumed. ActiveMQ 6.1.8 "
            "keeps a subscription's transacted `client-individual` ACKs for as long as it lives and scans "
            "them on every COMMIT, so those commits slow as the subscription ages; `client` acks are "
            "dropped at each COMMIT. The stage subscribes with `client` acks and a prefetch of 1, where a "
            "cumulative ACK acks exactly the one message in flight."
        )
        write_measured(SECTION, command, what, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
