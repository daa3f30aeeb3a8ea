"""Benchmark soaks against the machine's limit, side by side on one stack: ``txchaos bench soak``.

For each flow the benchmark measures, on the same stack and in the same run, the bare loop
(``harness.bench.bare``: the same broker and database work per message, no harness) and the soak's
clean path (``--nemesis none``), then the soak under the default nemesis and a naive variant's soak
with its anomaly counts, and a service soak with several instances. Every soak runs in a child
process of its own, so its driver's peak RSS is its own; each soak's ledger is then verified again
by the in-process engine and by Spark (``local[*]``), timed. Soak throughput is end to end: first
submission to the verdict. Every run of the pairs is metered too (``harness.bench.cpu``): a table
says how many µs of CPU an operation cost each role (workers, driver, broker, Postgres, Toxiproxy).

    txchaos bench soak [--activemq-ops 20000] [--naive-ops N] [--kafka-ops 200000] [--service-ops 5000]
                       [--workers 4] [--pairs 3] [--only pairs|nemesis] [--flow activemq|kafka] [--no-write]

``--flow`` runs one flow's pairs and soaks (no service soak) and needs ``--no-write``.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from rich.console import Console

from harness.bench.bare import BareResult, bare_activemq, bare_kafka
from harness.bench.cpu import CpuMeter, CpuUsage
from harness.bench.report import CHECKOUT, bench_parser, bench_stack, table, write_section
from harness.errors import HarnessError
from harness.ledger.reader import read_ledger
from harness.resources import scenarios_dir
from harness.run.spec.files import resolve
from harness.signals import Terminated, terminating
from harness.soak.driver import SUMMARY, run_soak
from harness.soak.nemesis import DEFAULT
from harness.soak.spec import Soak
from harness.stack.base import Endpoints
from harness.verify.checker import check_run
from harness.verify.cli import contract_of, verify_run

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup
SCENARIOS = scenarios_dir()
EXAMPLES = CHECKOUT / "examples" / "services"  # the example services live in a checkout only
NO_CRASH = tuple(k for k in DEFAULT if k not in ("crash", "freeze"))  # a service has no crash points


@dataclass(frozen=True)
class Case:
    """One soak of the benchmark: its row label and how to build it for ``ops`` operations."""

    label: str
    build: Callable[[int, int], Soak]  # (ops, workers) -> Soak
    size: str  # "activemq", "kafka" or "service": its flow, and which --*-ops sets its size
    versus: bool = False  # the clean path: compared with its flow's bare loop
    sized: str = ""  # another --*-ops that sets its size ("naive")

    @property
    def ops_key(self) -> str:
        return self.sized or self.size


def _onepc(variant: str, nemesis: tuple[str, ...]) -> Callable[[int, int], Soak]:
    def build(ops: int, workers: int) -> Soak:
        (spec,) = resolve(f"onepc_crash_gap:{variant}", 0, SCENARIOS)
        return Soak(spec, ops=ops, workers=workers, nemesis=nemesis, quiesce_s=300)

    return build


KAFKA_OPTIONS = {"batch_size": 500, "partitions": 3}  # the bare loop's batch and topic


def _kafka(nemesis: tuple[str, ...]) -> Callable[[int, int], Soak]:
    def build(ops: int, workers: int) -> Soak:
        (spec,) = resolve("kafka_consumer:inbox-offset-batch", 0, SCENARIOS)
        # What `txchaos soak kafka_consumer:inbox-offset-batch --workers 1 --option batch_size=500
        # --option partitions=3 --window OPS` runs: submitted as fast as the producer goes (no
        # window, as the bare loop's producer sends), consumed in batches of 500.
        return Soak(spec.with_options(KAFKA_OPTIONS), ops=ops, workers=1, nemesis=nemesis, window=ops, quiesce_s=300)

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
    Case("ActiveMQ 1PC stage `naive`, default nemesis", _onepc("naive", DEFAULT), "activemq", sized="naive"),
    Case("Kafka inbox consumer (batch 500, 3 partitions), `--nemesis none`", _kafka(()), "kafka", True),
    Case("Kafka inbox consumer (batch 500, 3 partitions), default nemesis", _kafka(DEFAULT), "kafka"),
    Case("service `py-fixed` (instances behind trap proxies), default nemesis", _service, "service"),
)


def _child(case: int, ops: int, workers: int, endpoints: str, out: Any) -> None:
    """Run one soak in this (spawned) process and send back its folder.

    A SIGTERM or SIGHUP heals, quiesces and closes the books, as it does for ``txchaos soak``.
    """
    with terminating():
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


def in_child(target: Callable[..., None], *args: object, label: str) -> Path:
    """Run ``target(*args, queue)`` in a spawned process; return the folder it puts on the queue.

    Interrupted here, the benchmark stops, but only once the child's soak has healed and closed its
    books: a SIGTERM or SIGHUP is passed on to the child (Ctrl-C reaches it by itself, from the
    terminal), and the folder it still sends back is named.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, queue))
    child.start()
    try:
        return _result_of(child, queue)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated) and child.is_alive():
            child.terminate()
        console.print(f"{label}: interrupted; waiting for the soak to heal and close its books", style="yellow")
        console.print(f"{label}: its run folder: {_result_of(child, queue)}", style="yellow")
        raise
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()


def ledger_roles(run_dir: Path) -> dict[int, str]:
    """Return each writer process of a run's ledger as (pid -> role): its stage workers as
    ``workers``, the rest (the driver and its sink) as ``driver``."""
    writers = read_ledger(run_dir / "ledger").select(["src", "pid"]).group_by(["src", "pid"]).aggregate([])
    return {
        int(pid): "workers" if str(src).startswith("worker") else "driver"
        for src, pid in zip(writers["src"].to_pylist(), writers["pid"].to_pylist(), strict=True)
    }


def _soak(case: int, ops: int, workers: int, endpoints: Endpoints) -> dict[str, Any]:
    with console.status(f"{CASES[case].label}: {ops:,} ops"), CpuMeter() as meter:
        run_dir = in_child(_child, case, ops, workers, endpoints.to_json(), label=CASES[case].label)
    summary: dict[str, Any] = json.loads((run_dir / SUMMARY).read_text())
    summary["cpu"] = meter.usage()
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


def _running_rate(stats: dict[str, Any]) -> float:
    """Return a soak's operations a second from its first submission to its close: not end to end
    (its quiescence, books and verdict left out), to show what the run and what the close cost."""
    running = stats["wall_s"] - stats["close_s"]
    return stats["submitted"] / running if running > 0 else 0.0


def _bare(
    flow: str, messages: int, workers: int, endpoints: Endpoints, clients: str = "raw"
) -> tuple[BareResult, CpuUsage]:
    """Run the bare loop of ``flow`` ("activemq" or "kafka") on ``endpoints`` (``clients``: ActiveMQ's);
    return its figure and the CPU every process used while it ran."""
    if flow == "activemq":
        what = f"bare loop: ActiveMQ ({clients} clients), {messages:,} messages, {workers} processes"
        with console.status(what), CpuMeter() as meter:
            got = bare_activemq(endpoints, messages=messages, workers=workers, clients=clients)
    else:
        with console.status(f"bare loop: Kafka, {messages:,} records"), CpuMeter() as meter:
            got = bare_kafka(endpoints, messages=messages)
    return got, meter.usage()


def _soak_row(case: Case, s: dict[str, Any], verdict_note: str = "") -> list[object]:
    """Return a soak's row of the table: its figures, the nemesis that ran and its verdict."""
    stats = s["stats"]
    counts = ", ".join(f"{k}={v}" for k, v in s["counts"].items()) or "clean"
    return [
        case.label,
        f"{stats['submitted']:,}",
        f"{stats['wall_s']:.1f}",
        f"{stats['ops_per_s']:,.0f}",
        f"{stats['driving_rss_mb']:.0f} / {stats['driver_peak_rss_mb']:.0f}",
        f"{s['events']:,}",
        f"{s['inproc_s']:.1f}",
        f"{s['spark_s']:.1f} (job {s['spark_job_s']:.1f})" + ("" if s["spark_agrees"] else " DISAGREES"),
        f"{stats['windows']} windows, {stats['kills']} kills, {stats['crashes_armed']} arms",
        f"{counts}; {verdict_note}".strip("; "),
    ]


BARE_NAMES = {"activemq": "ActiveMQ ({workers} processes)", "kafka": "Kafka (1 consumer, batch 500)"}


def _bare_row(name: str, got: BareResult, note: str) -> list[object]:
    consuming = f"{got.consume_ops_per_s:,.0f} ops/s from the first message consumed"
    row: list[object] = [f"bare loop, {name}", f"{got.messages:,}", f"{got.seconds:.1f}", f"{got.ops_per_s:,.0f}"]
    return [*row, *["-"] * 5, f"{note} ({consuming})"]


CPU_ROLES = ("workers", "driver", "broker", "Postgres", "Toxiproxy", "other")
CPU_HEADERS = ["run", "ops", *(f"{role} µs" for role in CPU_ROLES), "all µs", "machine busy (stolen)"]


def cpu_row(label: str, ops: int, flow: str, usage: CpuUsage, named: dict[int, str]) -> list[object]:
    """Return a row of the CPU table: each role's CPU per operation (µs), all of it, and how busy
    the machine's cores were. ``broker`` is ``flow``'s broker (ActiveMQ or Kafka); the other
    broker's JVM, Spark and anything else go to ``other``."""
    roles = usage.by_role(named)
    broker = "ActiveMQ" if flow == "activemq" else "Kafka"
    spent = {role: roles.pop(role, 0.0) for role in ("workers", "driver", "Postgres", "Toxiproxy")}
    spent["broker"] = roles.pop(broker, 0.0)
    spent["other"] = sum(roles.values())
    per_op = [f"{spent[role] / ops * 1e6:,.0f}" for role in CPU_ROLES]
    total = sum(spent.values()) / ops * 1e6
    machine = f"{usage.busy_share:.0%} of {usage.cores} cores ({usage.stolen_share:.0%})"
    return [label, f"{ops:,}", *per_op, f"{total:,.0f}", machine]


def _pairs(
    flow: str, ops: int, workers: int, pairs: int, endpoints: Endpoints, cpu: list[list[object]]
) -> list[list[object]]:
    """Return the rows of ``pairs`` bare-loop/clean-soak pairs of ``flow``, run one after the other
    (bare, soak, bare, soak...), and a last row with the ratio's median and range. Add to ``cpu``
    a row per run: where its CPU went (``cpu_row``).

    One pair moves by about as much as the gap it measures (a 20,000-op ActiveMQ soak gives
    239-276 ops/s run to run on one stack), so a single ratio says little; interleaving puts each
    soak beside the bare loop measured right before it, on the stack as it is then.

    For ActiveMQ each pair also runs the bare loop on the stage's own clients (``StompClient`` and
    SQLAlchemy, ``bare_activemq(clients="libraries")``): the soak against it is what the harness
    itself adds, the libraries' loop against the limit what those clients cost.
    """
    index, case = next((i, c) for i, c in enumerate(CASES) if c.size == flow and c.versus)
    rows: list[list[object]] = []
    ratios: list[float] = []
    running: list[float] = []  # the same, the soak's close left out (``_running_rate``)
    own: list[float] = []  # soak / the libraries' loop (ActiveMQ)
    name = BARE_NAMES[flow].format(workers=workers)
    for n in range(1, pairs + 1):
        got, used = _bare(flow, ops, workers, endpoints)
        rows.append(_bare_row(name, got, f"pair {n}: the machine's limit"))
        cpu.append(cpu_row(f"pair {n}: bare loop, {name}", got.messages, flow, used, dict(got.roles)))
        libs = None
        if flow == "activemq":
            libs, used = _bare(flow, ops, workers, endpoints, clients="libraries")
            share = f"{libs.ops_per_s / got.ops_per_s:.0%} of the limit"
            label = f"{name}, on StompClient and SQLAlchemy"
            rows.append(_bare_row(label, libs, f"pair {n}: the stage's clients, {share}"))
            cpu.append(cpu_row(f"pair {n}: bare loop, {label}", libs.messages, flow, used, dict(libs.roles)))
        s = _soak(index, ops, workers, endpoints)
        soaked = s["stats"]["submitted"]
        cpu.append(cpu_row(f"pair {n}: {case.label}", soaked, flow, s["cpu"], ledger_roles(s["run_dir"])))
        ratios.append(s["stats"]["ops_per_s"] / got.ops_per_s)
        rate = _running_rate(s["stats"])
        running.append(rate / got.ops_per_s)
        note = (
            f"pair {n}: {ratios[-1]:.0%} of the bare loop; {rate:,.0f} ops/s "
            f"({running[-1]:.0%}) with its close ({s['stats']['close_s']:.1f} s) left out"
        )
        if libs is not None:
            own.append(s["stats"]["ops_per_s"] / libs.ops_per_s)
            note += f", {own[-1]:.0%} of the loop on its clients"
        rows.append(_soak_row(case, s, note))
    spread = f"{min(ratios):.0%}-{max(ratios):.0%}"
    median = f"**median {statistics.median(ratios):.0%}** (range {spread}); the target is 85 %"
    median += (
        f"; with the soaks' close left out a median {statistics.median(running):.0%} "
        f"({min(running):.0%}-{max(running):.0%})"
    )
    rows.append([f"**{case.label}: soak / bare loop over {pairs} pair(s)**", *["-"] * 8, median])
    if own:
        spread = f"{min(own):.0%}-{max(own):.0%}"
        rows.append(
            [
                f"**{case.label}: soak / the loop on StompClient and SQLAlchemy**",
                *["-"] * 8,
                f"median {statistics.median(own):.0%} (range {spread}): what the harness itself adds",
            ]
        )
    return rows


HEADERS = ["run", "ops", "wall s", "ops/s (end to end)", "driver RSS MB (driving / peak)", "ledger events"]
HEADERS += ["in-process verify s", "Spark verify s", "nemesis", "verdict; vs bare loop"]
PAIRS_SECTION = "Soak runs against the bare loop (issue 32)"
CPU_NOTE = (
    "Where each run's CPU went, in µs of CPU per operation (`harness.bench.cpu`: every process's CPU "
    "time read from `/proc` every 0.5 s over the run's whole window, start-up and clean-up included). "
    "`workers`: the stage's processes; `driver`: the soak's driver and sink, or the bare loop's "
    "producer and sink; `broker`: the flow's broker; `other`: everything else on the machine (the "
    "benchmark itself, the idle broker of the other flow). `machine busy`: the cores' busy share over "
    "the window, from `/proc/stat`; `stolen`: the share the hypervisor gave to other machines while "
    "this one had work (a shared host slows every process at once)."
)
NEMESIS_SECTION = "Soak runs under the nemesis (issue 32)"
PARTS = ("pairs", "nemesis")
FLOWS = ("activemq", "kafka")  # in the order the benchmark runs them


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("soak")
    parser.add_argument("--activemq-ops", type=int, default=20_000)
    parser.add_argument(
        "--naive-ops", type=int, help="the naive variant's soak (default: --activemq-ops; its anomalies show early)"
    )
    parser.add_argument("--kafka-ops", type=int, default=200_000)
    parser.add_argument("--service-ops", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=4, help="ActiveMQ workers (and bare-loop processes)")
    parser.add_argument(
        "--pairs", type=int, default=3, help="bare-loop/clean-soak pairs per flow, interleaved (default 3)"
    )
    parser.add_argument(
        "--only",
        choices=PARTS,
        help="pairs: each flow's clean soaks beside its bare loop; nemesis: the soaks under the default "
        "nemesis, the naive variant and the service (default: both, each in its own section)",
    )
    parser.add_argument(
        "--flow",
        choices=FLOWS,
        help="only this flow's runs, and no service soak (print only: needs --no-write, since each "
        "section of docs/benchmarks.md holds every flow's rows)",
    )
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs}: give 1 or more (3 shows the run-to-run spread)")
    if args.flow and not args.no_write:
        parser.error(
            f"--flow {args.flow}: writing would replace the sections of docs/benchmarks.md with this flow's "
            "rows alone and drop the other's; add --no-write to print the figures, or leave --flow out"
        )
    naive = args.activemq_ops if args.naive_ops is None else args.naive_ops
    ops = {"activemq": args.activemq_ops, "naive": naive, "kafka": args.kafka_ops, "service": args.service_ops}
    for case in CASES:  # every soak is valid before any service starts
        case.build(ops[case.ops_key], args.workers)
    parts = (args.only,) if args.only else PARTS
    sections: dict[str, list[list[object]]] = {}
    cpu: list[list[object]] = []  # the pairs' CPU table
    with bench_stack() as endpoints:
        for flow in (args.flow,) if args.flow else FLOWS:
            # Each flow's limit is measured right before its soaks: a million-record Kafka fill
            # leaves the broker flushing for a while, which an ActiveMQ soak after it would pay.
            if "pairs" in parts:
                flow_rows = _pairs(flow, ops[flow], args.workers, args.pairs, endpoints, cpu)
                sections.setdefault("pairs", []).extend(flow_rows)
            if "nemesis" in parts:
                for i, case in enumerate(CASES):
                    if case.size == flow and not case.versus:
                        sections.setdefault("nemesis", []).append(
                            _soak_row(case, _soak(i, ops[case.ops_key], args.workers, endpoints))
                        )
        if "nemesis" in parts and not args.flow:
            index = next(i for i, c in enumerate(CASES) if c.size == "service")
            sections["nemesis"].append(_soak_row(CASES[index], _soak(index, ops["service"], args.workers, endpoints)))
    sizes = f"--activemq-ops {args.activemq_ops} --kafka-ops {args.kafka_ops}"
    naive_size = "" if args.naive_ops is None else f" --naive-ops {args.naive_ops}"
    for part, rows in sections.items():
        text = table(HEADERS, rows)
        if part == "pairs":
            text += f"\n\n{CPU_NOTE}\n\n{table(CPU_HEADERS, cpu)}"
        console.print(text)
        if args.no_write:
            continue
        if part == "pairs":
            title = PAIRS_SECTION
            command = f"txchaos bench soak --only pairs {sizes} --workers {args.workers} --pairs {args.pairs}"
            what = (
                "Each flow's clean path (`--nemesis none`) beside its bare loop (`harness.bench.bare`: the "
                "same broker and database work per message without the harness), in interleaved pairs on "
                "one stack in one run, so each soak stands beside the limit measured right before it. Soak "
                "throughput is end to end, first submission to the in-process verdict; a bare loop's producer "
                "sends its input while its workers consume (as a soak submits while its flow runs), and its "
                "time runs from the first send to the last output (from the first message consumed, in "
                "its note: the figure this table gave before 2026-11-28)."
            )
        else:
            title = NEMESIS_SECTION
            command = (
                f"txchaos bench soak --only nemesis {sizes}{naive_size} --service-ops {args.service_ops} "
                f"--workers {args.workers}"
            )
            what = (
                "The soaks under the default nemesis: the fixed ActiveMQ stage, its naive variant with its "
                "anomaly counts, the Kafka inbox consumer, and a service with several instances. Throughput "
                "is end to end, first submission to the in-process verdict."
            )
        body = (
            f"Command: `{command}` (one stack; every soak in a child process of its own). {what} Verify "
            "columns re-verify the finished folder (in-process, then Spark `local[*]` with its JVM start)."
            f"\n\n{text}\n\nRun folders: `reports/runs/` (`$TXCHAOS_REPORTS`)."
        )
        console.print(f"written to {write_section(title, body)}")
    return 0
