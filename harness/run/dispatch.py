"""Run a scenario with the run lifecycle of the broker its spec names: ActiveMQ, Kafka (a stage, a saga,
CQRS entity events) or DTM."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.run.runner import RunResult, run_scenario
from harness.run.spec import ScenarioSpec
from harness.stack.base import Endpoints


def _quiet(_: str) -> None:
    return None


def run_spec(
    spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Callable[[str], None] = _quiet
) -> RunResult:
    """Run ``spec`` with the run lifecycle of its broker and return the result."""
    if spec.broker == "kafka":
        from harness.run.kafka_runner import run_kafka_scenario

        return run_kafka_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker == "kafka_saga":
        from harness.run.saga_runner import run_saga_scenario

        return run_saga_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker == "kafka_cqrs":
        from harness.run.cqrs_runner import run_cqrs_scenario

        return run_cqrs_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker == "dtm":
        from harness.run.dtm_runner import run_dtm_scenario

        return run_dtm_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    return run_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
