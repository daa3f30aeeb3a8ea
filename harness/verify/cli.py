"""Command-line entry points of issue 5: ``txchaos ledger synth`` and ``txchaos verify``.

Each ``*_main(argv)`` parses its own arguments and returns the exit code, so ``harness/cli.py``
only dispatches: 0 clean, 1 anomalies found, 2 bad input (with a ``Hint:`` line), 3 harness failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

from harness.errors import ConfigError, TxChaosError
from harness.verify.model import FlowContract
from harness.verify.verdict import Verdict


def _count(text: str) -> int:
    try:
        value = int(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of events (try 1e6 or 1000000)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--events must be at least 1, got {text}")
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

    if (args.out / "ledger").exists():
        sys.stderr.write(f"error: {args.out} already holds a ledger\nHint: pass a new --out folder or delete it\n")
        return 2
    started = time.perf_counter()
    run = synth_run(args.out, args.events, args.seed, args.anomaly_rate)
    manifest = json.loads((run / "manifest.json").read_text())
    sys.stdout.write(
        f"wrote {run} ({manifest['events']:,} events, {manifest['operations']:,} operations) "
        f"in {time.perf_counter() - started:.1f}s; injected {manifest['ground_truth']}\n"
    )
    return 0


def contract_of(run_dir: Path) -> FlowContract:
    """Return the flow contract recorded in the run's manifest, or the default one."""
    manifest = run_dir / "manifest.json"
    if not manifest.is_file():
        return FlowContract()
    meta = json.loads(manifest.read_text())
    # Synthetic runs record the contract at the top; live runs inside their scenario spec.
    raw = meta.get("contract") or meta.get("spec", {}).get("contract") or {}
    # Every field: a send-money run's min_external_calls changes which operations are lost.
    known = [f.name for f in fields(FlowContract)]
    return FlowContract(**{k: raw[k] for k in known if k in raw})


def verify_run(run_dir: Path, *, engine: str = "spark", master: str | None = None) -> Verdict:
    """Verify one run folder with the chosen engine and write its ``verdict.json``."""
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
    manifest = run_dir / "manifest.json"
    meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
    scenario, seed, contract = str(meta.get("scenario", "")), meta.get("seed"), contract_of(run_dir)
    if meta.get("variant"):
        scenario = f"{scenario}:{meta['variant']}"
    if engine == "spark":
        from harness.verify import spark  # starts a JVM: import only when asked

        verdict = spark.check_run(run_dir, contract, scenario=scenario, seed=seed, master=master)
    elif engine == "in-process":
        from harness.verify import checker

        verdict = checker.check_run(run_dir, contract, scenario=scenario, seed=seed)
    else:
        raise ConfigError(f"unknown engine {engine!r}", hint="use --engine spark or --engine in-process")
    # The replay steps live in the manifest; a re-verification must not drop them from the verdict.
    verdict = replace(verdict, steps=tuple(meta.get("steps", ())))
    verdict.write(run_dir / "verdict.json")
    return verdict


def verify_main(argv: Sequence[str] | None = None) -> int:
    """Run ``txchaos verify RUN_DIR [--engine spark|in-process] [--master URL]``; exit 0 clean, 1 anomalies."""
    parser = argparse.ArgumentParser(prog="txchaos verify", description="verify a run folder's ledger")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--engine", choices=("spark", "in-process"), default="spark")
    parser.add_argument("--master", default=None, help="Spark master URL (default local[*]), e.g. spark://host:7077")
    args = parser.parse_args(argv)
    try:
        verdict = verify_run(args.run_dir, engine=args.engine, master=args.master)
    except TxChaosError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    timing = " ".join(f"{k}={v}" for k, v in verdict.timing.items() if k in ("jvm_start_s", "job_s"))
    sys.stdout.write(f"{verdict.headline()}  [{verdict.engine} {timing}] -> {args.run_dir / 'verdict.json'}\n")
    return 0 if verdict.clean else 1
