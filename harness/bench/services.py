"""Benchmark services under test: traps in the window, the clean path's cost, the state machine's search.

``txchaos bench services [--window 100] [--ops 2000] [--rounds 7] [--examples 40] [--only py,go,node]``
runs the example services of a txchaos checkout (``examples/services``, and the JVM services
``jms`` in ``examples/jms-service`` and ``spring-kafka`` in ``examples/spring-kafka-service``; none
imports txchaos) on the ``txchaos up`` stack named by ``$TXCHAOS_ENDPOINTS``, or a local stack of
its own:

- window: one run of the Python service's naive variant with ``pg_after_commit`` (kill) armed on
  every one of ``--window`` operations. A firing is in the window when its operation's effect is
  committed (the row is there) and the broker commit was never sent: the message came back and,
  with no inbox, was applied a second time. Target (issue 16): every one.
- clean path: each fixed service processes ``--ops`` operations with no trap armed, through its
  trap proxies (twins of the stack's proxies inside Toxiproxy) and with ``relays=False`` (the
  stack's proxies themselves), rounds alternating; throughput is the operations over the time
  from the first submit to the last output (ledger times). 300 operations are about a second of
  work, where one scheduling hiccup moved the figure by 20 %: the defaults give each run several
  seconds. Target: <= 10 % slower with the traps.
- search: the service state machine on each naive variant: examples and seconds to the first
  counterexample. Target: within 60 s.
- start (``--starts N``): N one-operation runs of each fixed service from its build cache; the
  seconds from the run's start to the service's readiness line (the run's reset of schema, queues
  and toxics included). Target (issue 29): a JVM service in a few seconds.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType

from hypothesis import Phase, settings
from rich.console import Console

from harness.bench.report import CHECKOUT, bench_parser, bench_stack, table, write_section
from harness.clients import db
from harness.errors import ConfigError
from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.machines.profiles import profile
from harness.machines.search import find_counterexample
from harness.machines.service import service_machine
from harness.run.core.session import run_scenario
from harness.run.spec.files import load_file
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.stack.base import Endpoints

console = Console(highlight=False, emoji=False, soft_wrap=True, markup=False)  # data, never markup
EXAMPLES = CHECKOUT / "examples" / "services" / "services_scenario.py"
SECTION = "Services under test (issue 16)"


JVM = {  # name -> (scenario file, fixed variant, naive variant's anomaly)
    "jms": (CHECKOUT / "examples" / "jms-service" / "jms_scenario.py", "check", "duplicate-effect"),
    "spring-kafka": (
        CHECKOUT / "examples" / "spring-kafka-service" / "spring_kafka_scenario.py",
        "indexed",
        "duplicate-effect",
    ),
}


@dataclass(frozen=True)
class Target:
    """One example service the benchmark measures: its label, its two scenarios, what its naive one breaks."""

    folder: str
    fixed: Callable[..., ScenarioSpec]
    naive: Callable[..., ScenarioSpec]
    naive_anomaly: str


def _load(path: Path) -> ModuleType:
    if not path.exists():
        raise ConfigError(
            f"the example services are not here ({path})", hint="run the benchmark from a txchaos checkout"
        )
    return load_file(path)


def examples() -> ModuleType:
    """Import the example services' scenario module of the checkout (refused outside one)."""
    return _load(EXAMPLES)


def targets(names: list[str]) -> dict[str, Target]:
    """Return the measured services by name (``py``, ``go``, ``node``, ``jms``, ``spring-kafka``)."""
    ex = examples()
    known = [*ex.EXAMPLES, *JVM]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ConfigError(f"--only names unknown services {unknown}", hint=f"choose from {', '.join(known)}")
    out: dict[str, Target] = {}
    for name in names:
        if name in JVM:
            path, fixed, anomaly = JVM[name]
            mod = _load(path)
            out[name] = Target(path.parent.name, partial(mod.scenario, fixed), partial(mod.scenario, "naive"), anomaly)
        else:
            e = ex.EXAMPLES[name]
            out[name] = Target(
                e.folder, partial(ex.scenario, name, "fixed"), partial(ex.scenario, name, "naive"), e.naive_anomaly
            )
    return out


def window(ex: ModuleType, ep: Endpoints, n: int) -> tuple[int, int, float]:
    """Return (firings in the window, firings, seconds) of ``n`` armed pg_after_commit kills on py-naive."""
    crashes = tuple(Crash("pg_after_commit", op_index=i) for i in range(n))
    spec = ex.scenario("py", "naive", messages=n, crashes=crashes, timeout_s=60 + 3 * n)
    started = time.monotonic()
    result = run_scenario(spec, ep)
    took = time.monotonic() - started
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    fired = {e["op"] for e in events if e["kind"] == Kind.CRASH.value and e["point"] == "pg_after_commit"}
    # Twice applied = committed before the kill, and the message came back: its ACK never went out.
    twice = result.verdict.ops("duplicate-effect")
    engine = db.engine(ep.postgres_url)
    try:
        committed = set(db.column_values(engine, "py_effects", "op_id"))
    finally:
        engine.dispose()
    return len(fired & twice & committed), len(fired), took


def throughput(target: Target, ep: Endpoints, ops: int, relays: bool) -> float:
    """Return operations per second of ``target``'s fixed service over ``ops`` operations, no trap armed."""
    spec = target.fixed(messages=ops, timeout_s=120 + ops // 10)
    assert spec.service is not None
    spec = replace(spec, service=replace(spec.service, relays=relays))
    result = run_scenario(spec, ep)
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    first = min(e["ts_ns"] for e in events if e["kind"] == Kind.SUBMIT.value)
    last = max(e["ts_ns"] for e in events if e["kind"] == Kind.DOWNSTREAM.value)
    if not result.verdict.clean:
        raise ConfigError(f"{spec.label} is not clean without faults: {result.verdict.headline()}", hint="fix it first")
    return float(ops / ((last - first) / 1e9))


def clean_path(measured: dict[str, Target], ep: Endpoints, ops: int, rounds: int) -> tuple[list[list[object]], float]:
    """Return a table row per service and the worst slowdown in percent (medians of alternating rounds)."""
    rows: list[list[object]] = []
    worst = 0.0
    for name, target in measured.items():
        plain: list[float] = []
        trapped: list[float] = []
        for _ in range(rounds):
            with console.status(f"clean path of {name}: {ops} operations, without and with relays"):
                plain.append(throughput(target, ep, ops, relays=False))
                trapped.append(throughput(target, ep, ops, relays=True))
        a, b = statistics.median(plain), statistics.median(trapped)
        slower = (a / b - 1) * 100
        worst = max(worst, slower)
        added = f"{(1 / b - 1 / a) * 1e6:.0f} µs"
        spread = f"{min(plain):.0f}-{max(plain):.0f} / {min(trapped):.0f}-{max(trapped):.0f}"
        rows.append([target.folder, f"{a:.0f}", f"{b:.0f}", f"{slower:+.1f} %", added, spread])
    return rows, worst


def search(measured: dict[str, Target], ep: Endpoints, cap: int, shrink: bool) -> list[list[object]]:
    """Return a table row per naive service: found, example number and seconds to the first counterexample."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    rows: list[list[object]] = []
    for name, target in measured.items():
        spec = target.naive(messages=1, timeout_s=20)
        machine = service_machine(spec, ep)
        with console.status(f"service state machine on {name}-naive"):
            search_settings = settings(profile(), max_examples=cap, database=None, phases=phases)
            error = find_counterexample(machine, search_settings)
        found = machine.found_at
        anomaly = target.naive_anomaly
        last = machine.last_result
        error += "" if last is None else last.verdict.headline()  # the failing example's verdict
        rows.append(
            [
                f"{target.folder} naive",
                anomaly,
                "yes" if found and anomaly in error else "**no**",
                found[0] if found else "-",
                f"{found[1]:.1f} s" if found else "-",
                " -> ".join(machine.last_steps) if found else "-",
            ]
        )
    return rows


def startup(measured: dict[str, Target], ep: Endpoints, n: int) -> list[list[object]]:
    """Return a table row per service: seconds from a one-operation run's start to its instances' readiness."""
    rows: list[list[object]] = []
    for name, target in measured.items():
        took: list[float] = []
        for _ in range(n):
            with console.status(f"start of {name} from its build cache"):
                result = run_scenario(target.fixed(messages=1, timeout_s=60), ep)
            events = read_ledger(result.run_dir / "ledger").to_pylist()
            start = min(e["ts_ns"] for e in events if e["kind"] == Kind.RUN_START.value)
            ready = [p.stat().st_mtime_ns for p in (result.run_dir / "workers").glob("*.ready")]
            if not ready:
                raise ConfigError(
                    f"{name}: no instance of the run in {result.run_dir} got ready", hint="read its logs/"
                )
            took.append((max(ready) - start) / 1e9)
        rows.append([target.folder, n, f"{statistics.median(took):.2f}", f"{min(took):.2f}-{max(took):.2f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("services")
    parser.add_argument("--window", type=int, default=100, help="armed pg_after_commit traps to count (0: skip)")
    parser.add_argument("--ops", type=int, default=2000, help="operations per clean-path run (0: skip)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating clean-path rounds per service")
    parser.add_argument("--examples", type=int, default=40, help="state machine examples at most per service (0: skip)")
    parser.add_argument("--only", default="py,go,node", help="example services to measure (also jms, spring-kafka)")
    parser.add_argument("--starts", type=int, default=0, help="one-operation runs per service to time its start")
    parser.add_argument("--shrink", action="store_true", help="also shrink each counterexample (minutes)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    ex = examples()
    measured = targets([n for n in args.only.split(",") if n])  # refused before any service starts
    parts: list[str] = [
        f"Command: `txchaos bench services --window {args.window} --ops {args.ops} --rounds {args.rounds} "
        f"--examples {args.examples} --starts {args.starts} --only {args.only}{' --shrink' if args.shrink else ''}`"
    ]
    with bench_stack() as ep:
        parts[0] += f" ({ep.provider} provider)."
        if args.window:
            with console.status(f"{args.window} armed pg_after_commit traps on the Python service"):
                in_window, fired, took = window(ex, ep, args.window)
            line = (
                f"Window: **{in_window} of {args.window}** armed `pg_after_commit` traps (kill) on the Python "
                f"service's naive variant fired in the window ({fired} fired, one run, {took:.0f} s with "
                f"{fired} restarts): each operation's effect committed and its message back (the ACK never "
                "sent), so applied twice. Target: all of them."
            )
            console.print(line)
            parts.append(line)
        if args.ops:
            rows, worst = clean_path(measured, ep, args.ops, args.rounds)
            headers = [
                "service (fixed)",
                "ops/s, no trap",
                "ops/s, trap proxies",
                "slower by",
                "added per op",
                "rounds' range, no trap / traps",
            ]
            text = table(headers, rows)
            console.print(text)
            verdict = "met" if worst <= 10 else "**not met**"
            parts.append(
                f"Clean path: {args.ops} operations per run, no trap armed, median of {args.rounds} alternating "
                "rounds; with the traps, every message of every connection of the service is parsed by the "
                "trap toxic inside Toxiproxy (no extra hop). Target: <= 10 % slower.\n\n"
                f"{text}\n\nWorst slowdown {worst:+.1f} %: the target is {verdict}."
            )
        if args.examples:
            headers = ["naive service", "anomaly", "found", "example", "first counterexample after", "steps"]
            text = table(headers, search(measured, ep, args.examples, args.shrink))
            console.print(text)
            parts.append(
                f"Search: the service state machine (`harness.machines.service`), at most {args.examples} "
                f"examples, no example database, {'shrunk' if args.shrink else 'not shrunk (--shrink shrinks)'}; "
                f"the steps are the {'shrunk' if args.shrink else 'first'} counterexample's. "
                f"Target: each naive variant found within 60 s.\n\n{text}"
            )
        if args.starts:
            headers = ["service (fixed)", "runs", "run start to ready, median s", "range s"]
            text = table(headers, startup(measured, ep, args.starts))
            console.print(text)
            parts.append(
                f"Start: {args.starts} one-operation runs per service from its build cache; the seconds from the "
                "run's start (its reset of schema, queues and toxics included) to the last instance's readiness "
                f"line. Target (issue 29): a JVM service in a few seconds.\n\n{text}"
            )
    if not args.no_write:
        # the JVM services keep a section of their own
        title = "JVM services, by txchaos bench services (issue 29)" if set(measured) & set(JVM) else SECTION
        path = write_section(title, "\n\n".join(parts))
        console.print(f"written to {path}")
    return 0
