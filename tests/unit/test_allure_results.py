"""The allure-results folder is finished as teams use Allure: categories, environment, executor, history."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.reporting.allure_results import (
    HARNESS,
    INCOMPLETE,
    UNFIRED,
    annotate,
    categories,
    copy_history,
    environment,
    executor,
    finish_results,
)
from harness.verify.model import ANOMALY_CLASSES
from harness.verify.verdict import Verdict


def _category(message: str, status: str) -> list[str]:
    """Return the categories a result with ``message`` and ``status`` falls in (Java's matches() = fullmatch)."""
    return [
        c["name"] for c in categories() if status in c["matchedStatuses"] and re.fullmatch(c["messageRegex"], message)
    ]


def test_one_category_per_anomaly_class_and_one_per_failure_family() -> None:
    names = [c["name"] for c in categories()]
    assert names[:3] == [HARNESS, INCOMPLETE, UNFIRED]
    assert names[3:] == [f"Anomaly: {cls}" for cls in ANOMALY_CLASSES]
    found = Verdict({"duplicate-effect": 2, "lost": 1}, (), {}, "in-process").headline()
    assert _category(f"AssertionError: {found}", "failed") == ["Anomaly: lost", "Anomaly: duplicate-effect"]
    # "dead-lettered" must not match inside "dead-lettered-with-effect"
    assert _category("ANOMALIES: dead-lettered-with-effect=1 [op-1]", "passed") == [
        "Anomaly: dead-lettered-with-effect"
    ]
    assert _category("UnfiredFault: svc:naive: trap x on op y never fired", "failed") == [UNFIRED]
    assert _category("INCOMPLETE: the run never closed its books", "failed") == [INCOMPLETE]
    assert _category("HarnessError: Postgres did not start", "broken") == [HARNESS]
    assert _category("", "passed") == []


def test_environment_names_every_service_version_and_the_seeds() -> None:
    env = environment(provider="local", seeds=[7, 3, 7], tools={"postgres_bin": "/usr/lib/postgresql/15/bin"})
    assert env["ActiveMQ"].startswith("6.1.")
    assert env["Kafka"].startswith("4.1.")
    assert env["Postgres"] == "15"
    assert env["Toxiproxy"].startswith("2.12.")
    assert env["DTM"] == "1.19.0"
    assert env["Spark"][0].isdigit()
    assert (env["provider"], env["seed"]) == ("local", "3, 7")
    assert env["Python"][0] == "3"
    assert env["txchaos"]


def test_executor_comes_from_the_ci_variables_present() -> None:
    gh = executor(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_SERVER_URL": "https://example.invalid",
            "GITHUB_REPOSITORY": "team/orders",
            "GITHUB_RUN_ID": "99",
            "GITHUB_RUN_NUMBER": "12",
            "GITHUB_WORKFLOW": "chaos",
        }
    )
    assert gh is not None
    assert (gh["type"], gh["buildOrder"], gh["buildName"]) == ("github", 12, "chaos #12")
    assert gh["buildUrl"] == "https://example.invalid/team/orders/actions/runs/99"
    gl = executor({"GITLAB_CI": "true", "CI_PIPELINE_IID": "5", "CI_JOB_NAME": "chaos", "CI_JOB_URL": "u"})
    assert gl is not None
    assert (gl["type"], gl["buildOrder"], gl["buildUrl"]) == ("gitlab", 5, "u")
    assert executor({}) is None


def _result(results: Path, name: str, status: str, labels: list[tuple[str, str]], seed: int) -> Path:
    path = results / f"{name}-result.json"
    body = {
        "uuid": name,
        "name": name,
        "status": status,
        "labels": [{"name": k, "value": v} for k, v in labels],
        "parameters": [{"name": "seed", "value": str(seed)}],
    }
    path.write_text(json.dumps(body))
    return path


def test_a_passing_test_of_a_bad_variant_is_filed_under_what_it_caught(tmp_path: Path) -> None:
    caught = [("anomaly", "duplicate-effect"), ("verdict", "ANOMALIES: duplicate-effect=1 [op-3]")]
    bad = _result(tmp_path, "bad", "passed", caught, 7)
    fixed = _result(tmp_path, "fixed", "passed", [("verdict", "CLEAN: no anomaly")], 7)
    assert annotate(tmp_path) == 1
    message = json.loads(bad.read_text())["statusDetails"]["message"]
    assert _category(message, "passed") == ["Anomaly: duplicate-effect"]
    assert "statusDetails" not in json.loads(fixed.read_text()) or not json.loads(fixed.read_text())[
        "statusDetails"
    ].get("message")
    assert annotate(tmp_path) == 0  # idempotent: a message once written is kept


def test_finish_results_writes_categories_environment_executor_and_the_previous_history(tmp_path: Path) -> None:
    results = tmp_path / "allure-results"
    results.mkdir()
    _result(results, "t", "passed", [], 11)
    previous = tmp_path / "previous-report"
    (previous / "history").mkdir(parents=True)
    (previous / "history" / "history-trend.json").write_text('[{"data": {"passed": 1}}]')
    done = finish_results(results, previous=previous, provider="docker", env={"GITLAB_CI": "true"})
    assert done["history"] is True
    assert done["executor"] == "GitLab CI"
    assert json.loads((results / "categories.json").read_text()) == categories()
    props = (results / "environment.properties").read_text()
    assert "provider=docker\n" in props
    assert "seed=11\n" in props
    assert json.loads((results / "executor.json").read_text())["type"] == "gitlab"
    assert (results / "history" / "history-trend.json").read_text() == '[{"data": {"passed": 1}}]'
    assert copy_history(tmp_path / "nowhere", results) is False
    assert copy_history(None, results) is False
    # every file written holds something: no empty attachment or property file
    assert all(p.stat().st_size > 0 for p in results.rglob("*") if p.is_file())
