"""Benchmark services under test: traps in the window, the clean path's cost, the state machine's search.

``txchaos bench services [--window 100] [--ops 2000] [--rounds 7] [--examples 40] [--only py,go,node]``
runs the example services of a txchaos checkout (``examples/services``; none imports txchaos) on
the ``txchaos up`` stack named by ``$TXCHAOS_ENDPOINTS``, or a local stack of its own:

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
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from types import ModuleType

from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from rich.console import Console

from harness.bench.report import CHECKOUT, bench_parser, bench_stack, table, write_section
from harness.clients import db
from harness.errors import ConfigError
from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.machines.profiles import profile
from harness.machines.service import service_machine
from harness.run.dispatch import run_spec
from harness.run.scenarios import load_file
from harness.run.spec import Crash
from harness.stack.base import Endpoints

console = Console(highlight=False, emoji=False, soft_wrap=True)
EXAMPLES = CHECKOUT / "examples" / "services" / "services_scenario.py"


def examples() -> ModuleType:
    """Import the example services' scenario module of the checkout (refused outside one)."""
    if not EXAMPLES.exists():
        raise ConfigError(
            f"the example services are not here ({EXAMPLES})", hint="run the benchmark from a txchaos checkout"
        )
    return load_file(EXAMPLES)


def window(ex: ModuleType, ep: Endpoints, n: int) -> tuple[int, int, float]:
    """Return (firings in the window, firings, seconds) of ``n`` armed pg_after_commit kills on py-naive."""
    crashes = tuple(Crash("pg_after_commit", op_index=i) for i in range(n))
    spec = ex.scenario("py", "naive", messages=n, crashes=crashes, timeout_s=60 + 3 * n)
    started = time.monotonic()
    result = run_spec(spec, ep)
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


def throughput(ex: ModuleType, ep: Endpoints, name: str, ops: int, relays: bool) -> float:
    """Return operations per second of fixed service ``name`` over ``ops`` operations, no trap armed."""
    spec = ex.scenario(name, "fixed", messages=ops, timeout_s=120)
    assert spec.service is not None
    spec = replace(spec, service=replace(spec.service, relays=relays))
    result = run_spec(spec, ep)
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    first = min(e["ts_ns"] for e in events if e["kind"] == Kind.SUBMIT.value)
    last = max(e["ts_ns"] for e in events if e["kind"] == Kind.DOWNSTREAM.value)
    if not result.verdict.clean:
        raise ConfigError(f"{spec.label} is not clean without faults: {result.verdict.headline()}", hint="fix it first")
    return float(ops / ((last - first) / 1e9))


def clean_path(
    ex: ModuleType, ep: Endpoints, names: list[str], ops: int, rounds: int
) -> tuple[list[list[object]], float]:
    """Return a table row per service and the worst slowdown in percent (medians of alternating rounds)."""
    rows: list[list[object]] = []
    worst = 0.0
    for name in names:
        plain: list[float] = []
        trapped: list[float] = []
        for _ in range(rounds):
            with console.status(f"clean path of {name}: {ops} operations, without and with relays"):
                plain.append(throughput(ex, ep, name, ops, relays=False))
                trapped.append(throughput(ex, ep, name, ops, relays=True))
        a, b = statistics.median(plain), statistics.median(trapped)
        slower = (a / b - 1) * 100
        worst = max(worst, slower)
        added = f"{(1 / b - 1 / a) * 1e6:.0f} µs"
        spread = f"{min(plain):.0f}-{max(plain):.0f} / {min(trapped):.0f}-{max(trapped):.0f}"
        rows.append([ex.EXAMPLES[name].folder, f"{a:.0f}", f"{b:.0f}", f"{slower:+.1f} %", added, spread])
    return rows, worst


def search(ex: ModuleType, ep: Endpoints, names: list[str], cap: int, shrink: bool) -> list[list[object]]:
    """Return a table row per naive service: found, example number and seconds to the first counterexample."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    rows: list[list[object]] = []
    for name in names:
        spec = ex.scenario(name, "naive", messages=1, timeout_s=20)
        machine = service_machine(spec, ep)
        error = ""
        with console.status(f"service state machine on {name}-naive"):
            try:
                search = settings(profile(), max_examples=cap, database=None, phases=phases)
                run_state_machine_as_test(machine, settings=search)
            except AssertionError as exc:
                error = str(exc)
        found = machine.found_at
        anomaly = ex.EXAMPLES[name].naive_anomaly
        last = machine.last_result
        error += "" if last is None else last.verdict.headline()  # the failing example's verdict
        rows.append(
            [
                f"{ex.EXAMPLES[name].folder} naive",
                anomaly,
                "yes" if found and anomaly in error else "**no**",
                found[0] if found else "-",
                f"{found[1]:.1f} s" if found else "-",
                " -> ".join(machine.last_steps) if found else "-",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("services")
    parser.add_argument("--window", type=int, default=100, help="armed pg_after_commit traps to count (0: skip)")
    parser.add_argument("--ops", type=int, default=2000, help="operations per clean-path run (0: skip)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating clean-path rounds per service")
    parser.add_argument("--examples", type=int, default=40, help="state machine examples at most per service (0: skip)")
    parser.add_argument("--only", default="py,go,node", help="example services to measure")
    parser.add_argument("--shrink", action="store_true", help="also shrink each counterexample (minutes)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    ex = examples()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(ex.EXAMPLES))
    if unknown:
        raise ConfigError(f"--only names unknown services {unknown}", hint=f"choose from {', '.join(ex.EXAMPLES)}")
    parts: list[str] = [
        f"Command: `txchaos bench services --window {args.window} --ops {args.ops} --rounds {args.rounds} "
        f"--examples {args.examples} --only {args.only}{' --shrink' if args.shrink else ''}`"
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
            rows, worst = clean_path(ex, ep, names, args.ops, args.rounds)
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
            text = table(headers, search(ex, ep, names, args.examples, args.shrink))
            console.print(text)
            parts.append(
                f"Search: the service state machine (`harness.machines.service`), at most {args.examples} "
                f"examples, no example database, {'shrunk' if args.shrink else 'not shrunk (--shrink shrinks)'}; "
                f"the steps are the {'shrunk' if args.shrink else 'first'} counterexample's. "
                f"Target: each naive variant found within 60 s.\n\n{text}"
            )
    if not args.no_write:
        path = write_section("Services under test (issue 16)", "\n\n".join(parts))
        console.print(f"written to {path}")
    return 0
