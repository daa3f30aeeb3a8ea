"""Finish an allure-results folder the way teams use Allure: categories, environment, executor, history.

Run by the CLI before it generates the HTML (`txchaos report`, `txchaos flagship`):

- ``categories.json``: one category per anomaly class, one for faults that never fired, one for
  incomplete runs, one for harness and stack failures. A passing test of a bad variant found its
  anomalies on purpose; ``annotate`` gives such a result a status message naming them (from its
  ``anomaly`` labels), so the Categories tab lists what the run caught, not only what failed.
- ``environment.properties``: the service versions, the provider, Python, txchaos, the seeds.
- ``executor.json``: from the CI's own variables (GitHub Actions, GitLab CI) when present; it
  numbers the build in the trend graphs.
- ``history/``: copied from the previous report, so the trend graphs carry the earlier runs.

>>> finish_results(Path("reports/allure-results"), previous=Path("reports/last/allure-report"))
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.verify.model import ANOMALY_CLASSES

__all__ = [
    "ANOMALY_LABEL",
    "VERDICT_LABEL",
    "annotate",
    "categories",
    "copy_history",
    "environment",
    "executor",
    "finish_results",
]

ANOMALY_LABEL = "anomaly"  # one label per class the verdict found (``allure.attach_verdict``)
VERDICT_LABEL = "verdict"  # the verdict's headline
UNFIRED = "Faults that never fired"
INCOMPLETE = "Incomplete runs"
HARNESS = "Harness and stack failures"


def categories() -> list[dict[str, Any]]:
    """Return the categories: each anomaly class, unfired faults, incomplete runs, harness failures.

    The message regexes match the verdict headline (``ANOMALIES: lost=1 [...]``, ``UNFIRED: ...``,
    ``INCOMPLETE: ...``) and the error families' names, in failed tests and annotated passed ones.
    """
    out: list[dict[str, Any]] = [
        {
            "name": HARNESS,
            "messageRegex": r"(?s).*(HarnessError|StackError|ConfigError|ServiceFailed|the stack cannot start).*",
            "matchedStatuses": ["failed", "broken"],
        },
        {
            "name": INCOMPLETE,
            "messageRegex": r"(?s).*(INCOMPLETE|IncompleteEvidence).*",
            "matchedStatuses": ["failed", "broken"],
        },
        {"name": UNFIRED, "messageRegex": r"(?s).*(UNFIRED|UnfiredFault).*", "matchedStatuses": ["failed", "broken"]},
    ]
    out += [
        {
            "name": f"Anomaly: {cls}",
            "messageRegex": rf"(?s).*(?<![\w-]){re.escape(cls)}=\d+.*",
            "matchedStatuses": ["failed", "passed"],
        }
        for cls in ANOMALY_CLASSES
    ]
    return out


def _pom_version(pom: Path, prop: str) -> str:
    m = re.search(rf"<{re.escape(prop)}>([^<]+)</", pom.read_text()) if pom.is_file() else None
    return m.group(1) if m else "unknown"


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _postgres_version(tools: Mapping[str, str]) -> str:
    m = re.search(r"postgresql/(\d+)", tools.get("postgres_bin", ""))
    return m.group(1) if m else "unknown"


def environment(*, provider: str, seeds: list[int], tools: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the report's environment: what ran, on what, with which seeds."""
    from harness import __version__
    from harness.resources import fixtures_dir
    from harness.stack.go_builds import DTM_VERSION, TOXIPROXY_VERSION

    tools = dict(tools or {})
    jars = fixtures_dir() / "jars"
    return {
        "ActiveMQ": _pom_version(jars / "activemq" / "pom.xml", "activemq.version"),
        "Kafka": _pom_version(jars / "kafka" / "pom.xml", "kafka.version"),
        "Postgres": _postgres_version(tools),
        "Toxiproxy": TOXIPROXY_VERSION.lstrip("v") + " (trapd)",
        "DTM": DTM_VERSION.lstrip("v"),
        "Spark": _dist_version("pyspark"),
        "provider": provider,
        "Python": platform.python_version(),
        "txchaos": __version__,
        "seed": ", ".join(str(s) for s in sorted(set(seeds))) or "-",
    }


def executor(env: Mapping[str, str]) -> dict[str, Any] | None:
    """Return ``executor.json`` for the CI named by ``env`` (GitHub Actions, GitLab CI), else None."""
    if env.get("GITHUB_ACTIONS") == "true":
        server = env.get("GITHUB_SERVER_URL", "")
        repo = env.get("GITHUB_REPOSITORY", "")
        run_id = env.get("GITHUB_RUN_ID", "")
        return {
            "name": "GitHub Actions",
            "type": "github",
            "buildOrder": int(env.get("GITHUB_RUN_NUMBER", "0") or 0),
            "buildName": f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{env.get('GITHUB_RUN_NUMBER', '?')}",
            "buildUrl": f"{server}/{repo}/actions/runs/{run_id}" if server and repo and run_id else "",
            "reportName": f"txchaos {repo}".strip(),
        }
    if env.get("GITLAB_CI") == "true":
        return {
            "name": "GitLab CI",
            "type": "gitlab",
            "buildOrder": int(env.get("CI_PIPELINE_IID", "0") or 0),
            "buildName": f"{env.get('CI_JOB_NAME', 'job')} #{env.get('CI_PIPELINE_IID', '?')}",
            "buildUrl": env.get("CI_JOB_URL", ""),
            "reportName": f"txchaos {env.get('CI_PROJECT_PATH', '')}".strip(),
        }
    return None


def _results(results_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(results_dir.glob("*-result.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # a torn result is Allure's to report, not ours to fail on
    return out


def annotate(results_dir: Path) -> int:
    """Give each passed result with ``anomaly`` labels a message naming them; return how many.

    Allure files a result under a category by its status message; a passing test of a bad
    variant has none, though its verdict found what the category names.
    """
    n = 0
    for path, result in _results(results_dir):
        labels = result.get("labels", ())
        found = [lab["value"] for lab in labels if lab.get("name") == ANOMALY_LABEL]
        said = [lab["value"] for lab in labels if lab.get("name") == VERDICT_LABEL]
        details = result.setdefault("statusDetails", {})
        if result.get("status") != "passed" or not found or not said or details.get("message"):
            continue
        details["message"] = "caught as expected: " + "\n".join(said)
        path.write_text(json.dumps(result))
        n += 1
    return n


def seeds_of(results_dir: Path) -> list[int]:
    """Return the seeds the results carry as their ``seed`` parameter."""
    seeds = []
    for _, result in _results(results_dir):
        for p in result.get("parameters", ()):
            if p.get("name") == "seed" and str(p.get("value", "")).strip("'\"").isdigit():
                seeds.append(int(str(p["value"]).strip("'\"")))
    return seeds


def copy_history(previous_report: Path | None, results_dir: Path) -> bool:
    """Copy ``previous_report/history`` into ``results_dir/history``; return whether there was one."""
    if previous_report is None:
        return False
    src = previous_report / "history"
    if not (src / "history-trend.json").is_file():
        return False
    dst = results_dir / "history"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return True


def _properties(values: Mapping[str, str]) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", " ").replace("=", "\\=").replace(":", "\\:")

    return "".join(f"{esc(k).replace(' ', '_')}={esc(v)}\n" for k, v in values.items())


def finish_results(
    results_dir: Path,
    *,
    previous: Path | None = None,
    provider: str = "local",
    tools: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write categories, environment, executor (in CI) and the previous history into ``results_dir``.

    Returns what it wrote, for the CLI to say.
    """
    env = os.environ if env is None else env
    (results_dir / "categories.json").write_text(json.dumps(categories(), indent=2))
    values = environment(provider=provider, seeds=seeds_of(results_dir), tools=tools)
    (results_dir / "environment.properties").write_text(_properties(values))
    ex = executor(env)
    if ex is not None:
        (results_dir / "executor.json").write_text(json.dumps(ex, indent=2))
    return {
        "annotated": annotate(results_dir),
        "history": copy_history(previous, results_dir),
        "executor": ex["name"] if ex else None,
        "environment": values,
    }
