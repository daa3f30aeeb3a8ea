"""Command-line entry points of issue 5: ``txchaos ledger synth`` and ``txchaos verify``.

Each ``*_main(argv)`` parses its own arguments and returns the exit code, so ``harness/cli.py``
only dispatches: 0 clean, 1 anomalies found, 2 bad input (with a ``Hint:`` line), 3 harness failure,
4 incomplete (the run folder does not hold the evidence for a full verdict).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, TxChaosError, error_lines
from harness.verify.model import FlowContract
from harness.verify.verdict import Verdict

MAX_SYNTH_EVENTS = 1_000_000_000  # 1e9 events is about 10 GB of parquet and hours of generation
VERDICT_FILES = {"in-process": "verdict.json", "spark": "verdict-spark.json"}  # the runner's names


def _count(text: str) -> int:
    try:
        value = int(float(text))
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of events (try 1e6 or 1000000)") from None
    if not 1 <= value <= MAX_SYNTH_EVENTS:
        raise argparse.ArgumentTypeError(
            f"--events {text} is out of range: pass 1 to 1e9 (1e9 events already take about 10 GB of disk)"
        )
    return value


def synth_main(argv: Sequence[str] | None = None) -> int:
    """Run ``txchaos ledger synth --events N --out DIR [--seed S] [--anomaly-rate R]``."""
    parser = argparse.ArgumentParser(prog="txchaos ledger synth", description="write a synthetic run folder")
    parser.add_argument("--events", type=_count, required=True, help="about this many events (1e6, 1e7, ...)")
    parser.add_argument("--out", type=Path, required=True, help="run folder to create")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--anomaly-rate", type=float, default=1e-3, help="share of operations with an anomaly")
    args = parser.parse_args(argv)
    from harness.ledger.synth import synth_run  # numpy-heavy: import only when asked

    started = time.perf_counter()
    try:
        run = synth_run(args.out, args.events, args.seed, args.anomaly_rate)
    except TxChaosError as exc:
        sys.stderr.write(error_lines(exc))
        return exc.exit_code
    manifest = json.loads((run / "manifest.json").read_text())
    sys.stdout.write(
        f"wrote {run} ({manifest['events']:,} events, {manifest['operations']:,} operations) "
        f"in {time.perf_counter() - started:.1f}s; injected {manifest['ground_truth']}\n"
    )
    return 0


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Return the run's ``manifest.json``; refuse a folder without a readable one (it holds the contract)."""
    manifest = run_dir / "manifest.json"
    fix = (
        "restore manifest.json from a copy of the run folder; without it the flow contract (which "
        "operations count as lost) is unknown, and txchaos does not guess it"
    )
    if not manifest.is_file():
        raise ConfigError(f"{manifest} is missing", hint=fix)
    try:
        meta = json.loads(manifest.read_text())
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{manifest} is not readable JSON ({exc})", hint=fix) from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{manifest} is not a JSON object", hint=fix)
    return meta


def contract_of(run_dir: Path) -> FlowContract:
    """Return the flow contract recorded in the run's manifest; refuse when there is none."""
    manifest = run_dir / "manifest.json"
    meta = read_manifest(run_dir)
    # Synthetic runs record the contract at the top; live runs inside their scenario spec.
    spec = meta.get("spec")
    raw = meta.get("contract") or (spec.get("contract") if isinstance(spec, dict) else None)
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{manifest} records no flow contract (neither 'contract' nor 'spec.contract')",
            hint='add the run\'s contract to the manifest, e.g. "contract": {"expects_downstream": true}; '
            "txchaos does not guess which operations count as lost",
        )
    # Every field: a send-money run's min_external_calls changes which operations are lost.
    known = {f.name for f in fields(FlowContract)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{manifest}: unknown contract field(s) {unknown}", hint=f"the fields are {sorted(known)}")
    try:
        return FlowContract(**raw)
    except ConfigError as exc:
        raise ConfigError(f"{manifest}: {str(exc).split(chr(10))[0]}", hint=exc.hint) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{manifest}: bad contract {raw} ({exc})", hint=f"the fields are {sorted(known)}") from None


def verify_run(run_dir: Path, *, engine: str = "spark", master: str | None = None, verbose: bool = False) -> Verdict:
    """Verify one run folder with the chosen engine and write its verdict (``VERDICT_FILES``).

    The manifest is required: it holds the flow contract. An interrupted or damaged folder gets a
    verdict whose outcome is ``incomplete``. ``verbose``: the Spark driver's JVM logs its warnings.
    """
    if not run_dir.is_dir():
        raise ConfigError(
            f"run folder {run_dir} does not exist",
            hint="pass the folder of one run, e.g. reports/runs/<run-id>, "
            "or make one with `txchaos ledger synth --events 1e6 --out DIR`",
        )
    if not (run_dir / "ledger").is_dir():
        raise ConfigError(
            f"{run_dir} has no ledger/ folder",
            hint="pass a run folder (it holds ledger/segments or ledger/events.parquet)",
        )
    if engine not in VERDICT_FILES:
        raise ConfigError(f"unknown engine {engine!r}", hint="use --engine spark or --engine in-process")
    meta = read_manifest(run_dir)
    scenario, seed, contract = str(meta.get("scenario", "")), meta.get("seed"), contract_of(run_dir)
    if meta.get("variant"):
        scenario = f"{scenario}:{meta['variant']}"
    if engine == "spark":
        from harness.verify import spark  # starts a JVM: import only when asked

        verdict = spark.check_run(run_dir, contract, scenario=scenario, seed=seed, master=master, verbose=verbose)
    else:
        from harness.verify import checker

        verdict = checker.check_run(run_dir, contract, scenario=scenario, seed=seed)
    # The replay steps live in the manifest; a re-verification must not drop them from the verdict.
    verdict = replace(verdict, steps=tuple(meta.get("steps", ())))
    verdict.write(run_dir / VERDICT_FILES[engine])
    return verdict


def exit_code(verdict: Verdict) -> int:
    """Return the exit code of a verdict: 0 clean, 1 anomalies, 4 incomplete (whatever was found),
    6 unfired (no anomaly, but a requested fault never fired)."""
    return verdict.exit_code


def verify_main(argv: Sequence[str] | None = None) -> int:
    """Run ``txchaos verify RUN_DIR [--engine spark|in-process] [--master URL]``; exit as ``exit_code``."""
    parser = argparse.ArgumentParser(prog="txchaos verify", description="verify a run folder's ledger")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--engine", choices=("spark", "in-process"), default="spark")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL, e.g. spark://host:7077 (default: the Spark Connect server of the stack "
        "`txchaos up` started, else local[*])",
    )
    parser.add_argument("--verbose", action="store_true", help="show the Spark JVM's log (warnings included)")
    args = parser.parse_args(argv)
    try:
        verdict = verify_run(args.run_dir, engine=args.engine, master=args.master, verbose=args.verbose)
    except TxChaosError as exc:
        sys.stderr.write(error_lines(exc))
        return exc.exit_code
    for note in verdict.notes:
        sys.stdout.write(f"note: {note}\n")
    timing = " ".join(f"{k}={v}" for k, v in verdict.timing.items() if k in ("jvm_start_s", "connect_s", "job_s"))
    # connect_s: the stack's Spark Connect server ran the job; jvm_start_s: a local driver did
    where = " via the stack's Spark Connect server" if "connect_s" in verdict.timing else ""
    out = args.run_dir / VERDICT_FILES[verdict.engine]
    sys.stdout.write(f"{verdict.headline()}  [{verdict.engine}{where} {timing}] -> {out}\n")
    return exit_code(verdict)
