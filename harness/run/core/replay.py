"""Run a folder's steps again: a counterexample replays from ``steps.jsonl``, no Hypothesis needed.

``load_steps(run_dir)`` reads the steps a run applied (``RunFolder.record``); ``replay(spec,
endpoints, steps)`` opens a fresh run of ``spec`` and applies them in order, then closes it. A
state machine's failure names its run folder: ``txchaos replay <folder>`` (or ``replay`` here with
the machine's spec) runs the same program on the same seed.

>>> result = replay(spec, endpoints, load_steps(Path("reports/runs/2026...-s3-1a2b")))
>>> result.verdict.found()
{'duplicate-effect': 1}
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from harness.errors import ConfigError
from harness.run.core.folder import STEPS
from harness.run.core.outcome import Progress, RunResult, _quiet
from harness.run.core.session import RunSession
from harness.run.spec.files import resolve
from harness.run.spec.scenario import ScenarioSpec
from harness.run.spec.steps import Step, from_record
from harness.stack.base import Endpoints


def load_steps(run_dir: Path) -> list[Step]:
    """Return the steps the run in ``run_dir`` applied, in order (a ConfigError names a bad line)."""
    path = Path(run_dir) / STEPS
    if not path.is_file():
        raise ConfigError(
            f"{run_dir} has no {STEPS}",
            hint="replay a run folder written by txchaos 0.1 or later (its steps are recorded as data)",
        )
    steps = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{number} is not JSON: {exc}", hint="the file is damaged: replay another run"
            ) from exc
        steps.append(from_record(record))
    return steps


def spec_of_folder(run_dir: Path, scenario: str | None = None) -> ScenarioSpec:
    """Return the spec the run in ``run_dir`` ran: its scenario's variant at its seed, from the scenario
    files (``scenario`` names the file or name when the folder's own is not found there), with the
    run's settle and timeout (a state machine's examples shorten them)."""
    path = Path(run_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        name, variant, seed = str(manifest["scenario"]), str(manifest["variant"]), int(manifest["seed"])
        record = manifest.get("spec", {})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} does not read: {exc}", hint="give a run folder txchaos wrote") from exc
    (spec,) = resolve(f"{scenario or name}:{variant}", seed)
    timing = {k: record[k] for k in ("settle_s", "timeout_s") if isinstance(record.get(k), int | float)}
    return replace(spec, **timing)


def replay(
    spec: ScenarioSpec,
    endpoints: Endpoints,
    steps: Iterable[Step],
    *,
    runs_root: Path | None = None,
    progress: Progress = _quiet,
) -> RunResult:
    """Open a fresh run of ``spec``, apply ``steps`` in order and close it; return the result."""
    session = RunSession(spec, endpoints, runs_root=runs_root, progress=progress)
    session.open(start_workers=False)
    try:
        for step in steps:
            session.apply(step)
        return session.close()
    finally:
        session._heal()
