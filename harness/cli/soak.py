"""``txchaos soak SCENARIO[:VARIANT]``: a long run under a nemesis, one ledger judged by both engines.

Options mirror ``Soak`` (``harness.soak``): ``--duration 10m`` or ``--ops N``, ``--workers K``,
``--rate R`` (open loop; none: as fast as the flow goes, at most ``--window N`` in flight),
``--seed S``, ``--nemesis`` (``default``, ``none``, a comma list of kinds, or a soak folder's
``nemesis.json`` to run that schedule again), ``--option KEY=VALUE`` (one of the scenario's
options for this soak: a Kafka consumer's ``batch_size`` and ``partitions``), ``--provider`` and
``--master`` (the Spark verification's master; ``--engine in-process`` skips Spark). Exit codes
as ``txchaos run``; an interrupted soak exits 3 (4 when its evidence is incomplete) after it
healed, closed its books and printed what it judged. So does one the disk's room stopped early
(``harness.soak.room``); one that cannot fit is refused before the stack starts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from harness.cli.output import console, expectation, verdict_line
from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.soak.driver import SoakResult, SoakStats

LOG_EVERY_S = 10.0  # between progress lines when the output is not a terminal


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], seed: object) -> None:
    from harness.cli.args import SCENARIO_HELP, SEED_HELP

    p = sub.add_parser("soak", help="a long run of SCENARIO[:VARIANT] under a fault schedule; one verdict")
    p.add_argument("scenario", help=SCENARIO_HELP)
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--duration", default=None, help="how long to submit: 90s, 10m, 1h (default 60s)")
    bound.add_argument("--ops", type=int, default=None, help="how many operations to submit")
    p.add_argument("--workers", type=int, default=2, help="worker processes (a service's instances); default 2")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="operations a second (open loop); default: closed loop (a DTM flow, which counts no output while "
        "it runs: 20 ops/s)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=0,
        help="closed loop: operations in flight at most (default 50 per worker, at least 200, and four "
        "batches per partition for a flow that consumes in batches)",
    )
    p.add_argument("--seed", type=seed, default=0, help=SEED_HELP)  # type: ignore[arg-type]
    p.add_argument(
        "--nemesis",
        default="default",
        # the kinds are spelled out, not imported: the parser is built for every command (a test holds them equal)
        help="default | none | a comma list of latency,reset,partition,timeout,kill,pause,freeze,crash,broker,"
        "postgres | a soak folder's nemesis.json",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one of the scenario's options for this soak (repeat it), e.g. --option batch_size=500",
    )
    p.add_argument("--provider", choices=("auto", "local", "docker"), default=None)
    p.add_argument("--engine", choices=("spark", "in-process"), default="spark", help="the second verification")
    p.add_argument("--master", default=None, help="Spark master for the verification (default local[*])")
    p.set_defaults(func=cmd_soak)


def build_soak(args: argparse.Namespace) -> object:
    """Return the ``Soak`` the arguments describe; every bad value is refused here, before any service starts."""
    from harness.run.spec.files import resolve
    from harness.soak.nemesis import SCHEDULE_FILE, Schedule, parse_kinds
    from harness.soak.spec import Soak, parse_duration

    specs = resolve(args.scenario, args.seed)
    if len(specs) != 1:
        raise ConfigError(
            f"soak {args.scenario!r} names {len(specs)} variants",
            hint=f"name one: {args.scenario}:VARIANT, VARIANT one of {', '.join(s.variant for s in specs)}",
        )
    nemesis: tuple[str, ...] | Schedule
    given = Path(args.nemesis)
    if args.nemesis.endswith(".json") or given.is_dir():
        path = given / SCHEDULE_FILE if given.is_dir() else given
        if not path.is_file():
            raise ConfigError(
                f"--nemesis {args.nemesis}: no such schedule", hint=f"pass a soak folder's {SCHEDULE_FILE}"
            )
        nemesis = Schedule.from_records(json.loads(path.read_text()))
    else:
        nemesis = parse_kinds(args.nemesis)
    _check_verification(args.engine, args.master)
    duration = parse_duration(args.duration) if args.duration is not None else None
    spec = specs[0].with_options(parse_options(args.option)) if args.option else specs[0]
    return Soak(
        spec,
        ops=args.ops,
        duration_s=duration,
        workers=args.workers,
        rate=args.rate,
        window=args.window,
        seed=args.seed,
        nemesis=nemesis,
    )


def _check_verification(engine: str, master: str | None) -> None:
    """Refuse a ``--master`` the verification at the end would meet only after the whole soak ran."""
    if master is None:
        return
    if engine != "spark":
        raise ConfigError(
            f"--master {master} with --engine {engine}",
            hint="--master is the Spark verification's master: drop it, or verify with --engine spark",
        )
    from harness.verify.spark.session import check_master

    check_master(master)


def parse_options(given: list[str]) -> dict[str, object]:
    """Return ``--option KEY=VALUE`` pairs as options: a VALUE that reads as JSON (``500``, ``true``)
    is that value, any other is text."""
    out: dict[str, object] = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--option {item!r} is not KEY=VALUE", hint="write it as e.g. --option batch_size=500")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def cmd_soak(args: argparse.Namespace) -> int:
    from harness import paths
    from harness.cli.stacks import running_stack
    from harness.soak.driver import nemesis_note, run_soak, schedule_of, soak_spec
    from harness.soak.room import check_room
    from harness.soak.spec import Soak

    soak = build_soak(args)
    assert isinstance(soak, Soak)
    check_room(soak, paths.runs_root())  # before any service starts
    spec = soak_spec(soak)
    note = nemesis_note(soak, spec, schedule_of(soak, spec))  # a schedule that would test nothing is refused here
    if note:
        console.print(f"nemesis: {note}", style="yellow")
    with running_stack(args.provider) as endpoints:
        with console.status(Text(soak.label)) as status:  # a str would be read as markup
            # A terminal gets a status line redrawn each second; a log (CI, a pipe) a line each 10 s,
            # where a status line would show nothing at all until the soak ends.
            def progress(line: str) -> None:
                if console.is_terminal:
                    status.update(Text(line))
                else:
                    console.print(line)

            every = 1.0 if console.is_terminal else LOG_EVERY_S
            result = run_soak(soak, endpoints, progress=progress, progress_every_s=every)
        code = show_soak(result, args.scenario, args.option or [])
        if args.engine == "spark" and result.verdict.outcome != "incomplete":
            code = max(code, _spark_agrees(result, args.master))
    if result.stats.interrupted:
        return 4 if result.verdict.outcome == "incomplete" else 3
    return code


def _phases(stats: SoakStats) -> str:
    """Say where a soak's wall time went: submitting, then (when they took time) draining the backlog
    under the nemesis and the final heal, then closing (quiescence, books, verdict)."""
    phases = [("submitting", stats.submit_s), ("draining", stats.drain_s), ("final heal", stats.heal_s)]
    shown = [f"{name} {s:.1f}s" for name, s in phases if name == "submitting" or s >= 0.1]
    return ", ".join([*shown, f"closing {stats.close_s:.1f}s"])


def show_soak(result: SoakResult, scenario: str | None = None, options: list[str] | None = None) -> int:
    """Print the soak's figures, counts per class and a witness sample; return the verdict's exit code."""
    from harness.reporting.soak_plots import render_soak
    from harness.soak.driver import RECOVER_S

    stats, verdict = result.stats, result.verdict
    plot = render_soak(result)
    console.print(verdict_line(result.soak.label, verdict))
    said = expectation(result)  # a naive variant's soak exists to show its anomalies, as a run does
    if said:
        console.print(said)
    console.print(
        f"  {stats.submitted:,} ops in {stats.wall_s:.1f}s end to end ({stats.ops_per_s:,.0f} ops/s; "
        f"{_phases(stats)}); {stats.windows} fault window(s), "
        f"{stats.kills} kill(s), {stats.crashes_armed} crash(es) armed, {stats.worker_restarts} worker restart(s); "
        f"driver RSS {stats.driving_rss_mb:.0f} MB while driving, {stats.driver_peak_rss_mb:.0f} MB at the peak"
    )
    if stats.recover_s:
        waits = sorted(stats.recover_s)
        console.print(
            f"  after {len(waits)} broker or database restart(s) the flow moved again in "
            f"{waits[0]:.1f}-{waits[-1]:.1f}s"
            + (
                f"; after {stats.unrecovered} nothing came out for {RECOVER_S:.0f}s (the service did not recover)"
                if stats.unrecovered
                else ""
            )
        )
    note = result.nemesis_note  # what ran, where the line before the start said what was drawn
    if note:
        console.print(f"  nemesis: {note}", style="yellow")
    console.print(f"  run folder: {result.run_dir}  (soak.json, nemesis.json, steps.jsonl, {plot.name})")
    from harness.soak.driver import SUMMARY, again_command

    # the sample the driver wrote into soak.json: its kills were read from the ledger once, there
    sample: dict[str, list[dict[str, Any]]] = json.loads((result.run_dir / SUMMARY).read_text())["witnesses"]
    for anomaly, witnesses in sample.items():
        for w in witnesses:
            during = ", ".join([*map(_window, w["faults"]), *w["crashes"]]) or "no fault window or kill"
            if w.get("said") and not w["faults"] and not w["crashes"]:  # a check of the books at the close
                console.print(f"  {anomaly}: {w['said']}")
            else:
                after = f"; {w['after']}" if w.get("after") else ""
                console.print(f"  {anomaly}: op {w['op']} during {during}{after}")
    if stats.error:
        console.print(f"  {stats.error}", style="red")
        console.print(
            "  every fault healed, books closed; the verdict is incomplete: see driver-error.txt", style="yellow"
        )
    elif stats.stopped:
        console.print(
            f"  {stats.stopped}; every fault healed, books closed, the verdict covers what ran", style="yellow"
        )
    elif stats.interrupted:
        console.print("  interrupted: every fault healed, books closed, the verdict covers what ran", style="yellow")
    if not verdict.clean:
        console.print(f"  again: {again_command(result.run_dir, scenario, options)}")
    return 0 if verdict.clean else verdict.exit_code


def _window(fault: dict[str, object]) -> str:
    """Return a fault window of a witness in words: ``pause for 3.5s``."""
    took = fault.get("duration_ms")
    return f"{fault.get('fault', '?')}" + (f" for {float(took) / 1000:.1f}s" if isinstance(took, int | float) else "")


def _spark_agrees(result: SoakResult, master: str | None) -> int:
    """Verify the soak's folder with Spark too; return 3 when the engines disagree, else 0."""
    from harness.verify.assemble import compare_verdicts
    from harness.verify.cli import verify_run

    started = time.monotonic()
    with console.status("verifying the ledger with Spark"):
        spark = verify_run(result.run_dir, engine="spark", master=master)
    diffs = compare_verdicts(result.verdict, spark)
    took = time.monotonic() - started
    if diffs:
        console.print(f"  Spark disagrees ({took:.1f}s): {'; '.join(diffs[:3])}", style="red")
        return 3
    job = spark.timing.get("job_s", 0.0)
    console.print(f"  Spark agrees: {took:.1f}s (job {job:.1f}s); in-process verdict in verdict.json")
    return 0
