"""Can the broker's journal sync go? ActiveMQ killed -9 while senders commit: ``txchaos bench journal``.

Issue 32 asks to raise the ActiveMQ ceiling through the broker's settings only where that changes
no semantics the faults test, and to show that a broker kill -9 then loses nothing the broker
acknowledged. KahaDB's ``journalDiskSyncStrategy`` is the largest such setting (the issue measured
634 to 768 ops/s with it off). This benchmark runs each configuration on a local stack of its own:
``SENDERS`` threads each commit one persistent message per STOMP transaction and wait for the
COMMIT's RECEIPT (what the stage worker does), the broker is killed -9 after a random moment,
restarted on the same data, and its queue drained. A message whose commit was receipted and is
missing after the restart is lost. The commits per second of the senders before the kill are the
raw broker figure (no database, no harness), labelled as such.

    txchaos bench journal [--trials 10] [--seed 0] [--no-write]
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass

from rich.console import Console

from harness.bench.report import bench_parser, table, write_measured
from harness.clients.activemq import StompClient, drain
from harness.errors import HarnessError
from harness.faults.broker import kill_service, restart_service
from harness.stack.base import Endpoints

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup
SENDERS = 4
CONFIGS = (
    ("activemq.xml", "`always` (as shipped)"),
    ("activemq-journal-periodic.xml", "`periodic`"),
)
SECTION = "Broker journal sync under kill -9 (issue 32)"


@dataclass(frozen=True)
class KillTrial:
    """One kill: what the senders saw committed, and what the restarted broker still held."""

    committed: int  # commits whose RECEIPT came back before the kill
    lost: tuple[str, ...]  # of those, the bodies missing after the restart
    send_s: float  # how long the senders ran before the kill
    restart_s: float


def _sender(ep: Endpoints, queue: str, n: int, stop: threading.Event, done: list[str], lock: threading.Lock) -> None:
    """Commit ``n-0``, ``n-1``, ... one per transaction until ``stop`` or the broker dies; record each
    body whose COMMIT was receipted."""
    try:
        client = StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0))
    except HarnessError:  # the kill came first: this sender committed nothing
        return
    i = 0
    try:
        while not stop.is_set():
            body = f"{n}-{i}"
            i += 1
            tx = client.begin()
            client.send(queue, body, transaction=tx)
            client.commit(tx)  # returns once the broker's RECEIPT for the COMMIT is in
            with lock:
                done.append(body)
    except HarnessError:  # the broker was killed under it: that is the trial
        return
    finally:
        with suppress(HarnessError, OSError):
            client.close()


def kill_during_commits(ep: Endpoints, *, seconds: float, senders: int = SENDERS) -> KillTrial:
    """Let ``senders`` threads commit for ``seconds``, kill -9 ActiveMQ, restart it and drain the
    trial's queue; return what was receipted and what of it is gone."""
    queue = f"txchaos.journal.{uuid.uuid4().hex[:8]}"
    done: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_sender, args=(ep, queue, n, stop, done, lock), daemon=True) for n in range(senders)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    killed = False
    try:
        time.sleep(seconds)
        kill_service(ep, "activemq")
        killed = True
        send_s = time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        if killed:  # healing: the broker comes back whatever stops the trial
            restart_s = restart_service(ep, "activemq")
    with lock:
        committed = set(done)
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as client:
        found = {m.body for m in drain(client, [queue], idle_s=1.0, max_s=120)}
    return KillTrial(len(committed), tuple(sorted(committed - found)), send_s, restart_s)


def _trials(config: str, trials: int, rng: random.Random) -> list[KillTrial]:
    from harness.stack.local import LocalProvider

    provider = LocalProvider(activemq_config=config)
    ep = provider.start()
    try:
        out = []
        for n in range(1, trials + 1):
            trial = kill_during_commits(ep, seconds=rng.uniform(0.5, 2.0))
            console.print(
                f"{config} trial {n}: {trial.committed:,} committed, {len(trial.lost)} lost "
                f"{list(trial.lost[:3])} (restart {trial.restart_s:.1f} s)"
            )
            out.append(trial)
        return out
    finally:
        provider.stop()


HEADERS = ["journalDiskSyncStrategy", "kills", "commits receipted", "commits/s before the kill (4 senders, raw)"]
HEADERS += ["receipted then lost", "kills that lost one", "lost, e.g."]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("journal")
    parser.add_argument("--trials", type=int, default=10, help="kills per configuration (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the moment of each kill")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: give 1 or more (10 shows whether a loss is rare)")
    rng = random.Random(args.seed)
    rows: list[list[object]] = []
    for config, label in CONFIGS:
        got = _trials(config, args.trials, rng)
        committed = sum(t.committed for t in got)
        lost = [body for t in got for body in t.lost]
        rate = committed / sum(t.send_s for t in got)
        rows.append([label, len(got), f"{committed:,}", f"{rate:,.0f}", len(lost), sum(1 for t in got if t.lost)])
        rows[-1].append(", ".join(lost[:3]) or "-")
    text = table(HEADERS, rows)
    console.print(text)
    if not args.no_write:
        command = f"txchaos bench journal --trials {args.trials} --seed {args.seed}"
        what = (
            "Each configuration on a local stack of its own: 4 threads commit one persistent message per "
            "STOMP transaction and wait for the COMMIT's RECEIPT; after 0.5-2 s (seeded) ActiveMQ is killed "
            "-9, restarted on the same data, and the trial's queue drained. A receipted message missing "
            "after the restart is lost. The commit rate is the senders' alone (no database, no harness)."
        )
        write_measured(SECTION, command, what, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
