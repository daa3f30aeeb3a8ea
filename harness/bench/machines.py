"""Benchmark the Hypothesis state machines against the real stack, per pattern.

For each pattern's bad variant: how many examples and seconds until the first counterexample,
how long the shrunk counterexample is, and how many examples shrinking took. For its fixed
variant: examples per minute over a run of examples that all pass (pure example throughput).
No example database: every search starts from nothing, as on a fresh CI checkout.

Targets (issue 3): bad variants found in <= 60 s each; >= 30 examples/minute.
Run: ``txchaos bench machines [--patterns onepc,poison] [--fixed-examples 20] [--no-write]``.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import settings
from rich.console import Console

from harness.bench.report import bench_parser, table, write_section
from harness.machines.profiles import profile
from harness.machines.search import find_counterexample
from harness.machines.targets import TARGETS, Target
from harness.stack.base import Endpoints
from harness.stack.local import LocalProvider

__all__ = ["TARGETS", "Target", "main"]  # TARGETS lives in harness.machines.targets; kept here for old imports

console = Console(emoji=False, soft_wrap=True, markup=False)  # data, never markup


def _timed_run(machine: Any, examples: int) -> tuple[str, float]:
    """Run ``machine`` for up to ``examples`` examples; return the failure's text ("" if none) and the seconds taken."""
    started = time.monotonic()
    error = find_counterexample(machine, settings(profile(), max_examples=examples, database=None))
    return error, time.monotonic() - started


def _search(target: Target, endpoints: Endpoints, cap: int) -> dict[str, Any]:
    machine = target.machine(target.bad, endpoints, **target.attrs)
    found_error, took = _timed_run(machine, cap)
    found = machine.found_at
    return {
        "found": found is not None and target.anomaly in found_error,
        "first_example": found[0] if found else None,
        "first_s": found[1] if found else None,
        "steps": list(machine.last_steps) if found else [],
        "examples": machine.examples,
        "total_s": took,
    }


def _throughput(target: Target, endpoints: Endpoints, examples: int) -> dict[str, Any]:
    machine = target.machine(target.fixed, endpoints, **target.attrs)
    error, took = _timed_run(machine, examples)
    first_line = (error.splitlines() or [""])[0]
    return {"examples": machine.examples, "per_min": machine.examples / took * 60, "error": first_line}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("machines")
    parser.add_argument("--patterns", default=",".join(TARGETS), help=f"comma-separated, from {', '.join(TARGETS)}")
    parser.add_argument("--cap", type=int, default=100, help="most examples to search for a counterexample")
    parser.add_argument(
        "--fixed-examples", type=int, default=20, help="examples of each fixed variant, for examples/min"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.patterns.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown pattern(s) {unknown}; choose from {', '.join(TARGETS)}")

    rows: dict[str, list[list[object]]] = {}  # section -> its rows
    provider = LocalProvider()
    endpoints = provider.start()
    try:
        for name in names:
            target = TARGETS[name]()
            with console.status(f"{target.pattern}: searching for {target.anomaly}"):
                bad = _search(target, endpoints, args.cap)
            with console.status(f"{target.pattern}: {args.fixed_examples} examples of the fixed variant"):
                fixed = _throughput(target, endpoints, args.fixed_examples)
            first = (
                f"example {bad['first_example']}, {bad['first_s']:.0f} s"
                if bad["found"]
                else f"not found in {args.cap}"
            )
            row: list[object] = [
                target.pattern,
                target.anomaly,
                first,
                f"{len(bad['steps'])}: {' -> '.join(bad['steps'])}" if bad["found"] else "-",
                f"{bad['examples']} ({bad['total_s']:.0f} s)",
                f"{fixed['per_min']:.0f}" + (f" (FAILED: {fixed['error']})" if fixed["error"] else ""),
            ]
            rows.setdefault(_section(target), []).append([name, *row])
            console.print(" | ".join(str(c) for c in row))
    finally:
        provider.stop()
    headers = [
        "pattern",
        "bad variant's anomaly",
        "first counterexample",
        "shrunk steps",
        "examples incl. shrinking",
        "fixed examples/min",
    ]
    for section, section_rows in rows.items():
        text = table(headers, [row[1:] for row in section_rows])
        console.print(text)
        if args.no_write:
            continue
        patterns = ",".join(str(row[0]) for row in section_rows)
        body = (
            f"Command: `txchaos bench machines --patterns {patterns} --cap {args.cap} "
            f"--fixed-examples {args.fixed_examples}` (local provider, no example database).\n\n{text}\n\n"
            "Targets: first counterexample <= 60 s; >= 30 examples/minute. Each example is a real run: "
            "tables truncated, toxics removed, workers started, the program's steps, quiescence, verdict."
        )
        console.print(f"written to {write_section(section, body)}")
    return 0


def _section(target: Target) -> str:
    """Return the docs/benchmarks.md section of ``target``: one per issue (flow row)."""
    if target.bad.flow.name == "activemq":
        return "State machines per pattern (issue 3)"
    return "Kafka state machines per pattern (issue 4)"
