"""The CI examples run the one pipeline script a test runs (tests/integration/test_example_project.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"
CALL = "bash examples/ci/pipeline.sh"


def _load(name: str) -> Any:
    return yaml.safe_load((CI / name).read_text())


def test_github_actions_runs_the_pipeline_keeps_the_history_and_publishes_the_report() -> None:
    steps = _load("github-actions.yml")["jobs"]["chaos"]["steps"]
    runs = [s for s in steps if CALL in str(s.get("run", ""))]
    assert len(runs) == 1
    assert runs[0]["env"]["PREVIOUS_REPORT"] == "previous-report"
    restore = [s for s in steps if "cache/restore" in str(s.get("uses"))]
    save = [s for s in steps if "cache/save" in str(s.get("uses"))]
    assert restore[0]["with"]["path"] == save[0]["with"]["path"] == "previous-report/history"
    assert steps.index(restore[0]) < steps.index(runs[0]) < steps.index(save[0])
    upload = next(s for s in steps if "upload-artifact" in str(s.get("uses")))
    assert upload["if"] == "always()"
    assert "reports/ci/allure-report" in upload["with"]["path"]
    assert "reports/ci/junit.xml" in upload["with"]["path"]


def test_gitlab_ci_runs_the_pipeline_keeps_the_history_and_publishes_junit() -> None:
    job = _load("gitlab-ci.yml")["chaos"]
    assert job["script"] == [CALL]
    assert job["variables"]["PREVIOUS_REPORT"] == "previous-report"
    assert any(c["paths"] == ["previous-report/history"] for c in job["cache"])
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["reports"]["junit"] == "reports/ci/junit.xml"
    assert "reports/ci/allure-report" in job["artifacts"]["paths"]


def test_the_pipeline_fails_on_the_tests_exit_code_and_keeps_it_past_the_report() -> None:
    script = (CI / "pipeline.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert script.rstrip().endswith('exit "$code"')
    assert "--junitxml" in script
    assert "--alluredir" in script
