"""The Spark cross-check of a finished run: agreement passes, a differing verdict is caught."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.run.core.crosscheck import SPARK_VERDICT, SparkCrossCheck
from harness.run.core.outcome import RunResult
from harness.run.spec.scenario import ScenarioSpec
from harness.verify.checker import check_run
from harness.verify.cli import contract_of

pytestmark = pytest.mark.spark


def test_spark_cross_check_agrees_then_catches_a_tampered_verdict(tmp_path: Path) -> None:
    from harness.ledger.synth import synth_run

    run = synth_run(tmp_path / "run", 20_000, seed=3, anomaly_rate=0.02)
    contract = contract_of(run)
    spec = ScenarioSpec(name="synth", variant="v", handler="mod:func", schema="s", effect_table="t", contract=contract)
    local = check_run(run, contract, scenario=spec.label, seed=spec.seed)
    assert not local.clean  # the synthetic ledger carries injected anomalies: a real comparison
    with SparkCrossCheck("local[2]") as spark:
        agreed = spark.verify(RunResult(run, local, spec))
        assert agreed.agree, agreed.diffs
        assert json.loads((run / SPARK_VERDICT).read_text())["engine"] == "spark"
        # One anomaly class counted differently and one witness dropped: both are reported.
        cls, count = next(iter(local.found().items()))
        tampered = replace(local, anomalies={**local.anomalies, cls: count + 1}, witnesses=local.witnesses[1:])
        caught = spark.verify(RunResult(run, tampered, spec))
    assert not caught.agree
    assert any(d.startswith(f"anomalies[{cls}]") for d in caught.diffs), caught.diffs
    assert any("only in spark: [(" in d for d in caught.diffs), caught.diffs
    assert "SPARK DISAGREES" in caught.line()


def test_a_session_stopped_by_someone_else_does_not_break_later_cross_checks(tmp_path: Path) -> None:
    # getOrCreate shares one session per process: a test module (or a `verify` call) that stopped
    # it used to turn every later scenario's cross-check into "Cannot call methods on a stopped
    # SparkContext" (CI: 30 scenario failures after the Spark unit tests).
    from harness.ledger.synth import synth_run
    from harness.verify import spark as engine

    run = synth_run(tmp_path / "run", 5_000, seed=4, anomaly_rate=0.02)
    contract = contract_of(run)
    spec = ScenarioSpec(name="synth", variant="v", handler="mod:func", schema="s", effect_table="t", contract=contract)
    local = check_run(run, contract, scenario=spec.label, seed=spec.seed)
    with SparkCrossCheck("local[2]") as spark:
        assert spark.verify(RunResult(run, local, spec)).agree
        engine.spark_session("local[2]").stop()  # someone else's stop of the shared session
        assert spark.verify(RunResult(run, local, spec)).agree
        # A verification without a session borrows the live one and leaves it running.
        assert engine.check_run(run, contract).found() == local.found()
        assert engine.session_alive(spark._spark())
