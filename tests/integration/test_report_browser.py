"""The generated report, opened in a real (headless) browser, shows what a team reads in it.

Two runs of the flagship's crash-gap scenario against the real stack, each under pytest with
``--alluredir`` as a team's CI runs it; ``txchaos report`` turns the first into a report, then the
second into one that takes the first's history, with GitHub Actions' variables set. Chromium then
renders the single-file report: the Categories tab lists the anomaly classes the bad variants
caught, the overview shows the service versions and the executor, and the trend has two points.

With ``TXCHAOS_SCREENSHOTS=DIR`` it also writes the screenshots docs/reports.md shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.reporting.browser import dump_dom, find_chromium, screenshot
from harness.stack.base import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.activemq]
ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "scenarios/onepc_crash_gap_scenario.py"
CI = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_WORKFLOW": "chaos",
    "GITHUB_RUN_NUMBER": "2",
    "GITHUB_RUN_ID": "2002",
    "GITHUB_REPOSITORY": "team/orders",
    "GITHUB_SERVER_URL": "http://127.0.0.1",
}


def _text(dom: str) -> str:
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def _pytest(results: Path, endpoints: Path, env: dict[str, str], select: str) -> None:
    cmd = [sys.executable, "-m", "pytest", SCENARIO, "-k", select, "-q", "-p", "no:cacheprovider"]
    cmd += [f"--alluredir={results}", f"--txchaos-endpoints={endpoints}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _report(results: Path, out: Path, env: dict[str, str], *extra: str) -> Path:
    cmd = [sys.executable, "-m", "harness.cli", "report", str(results), "--out", str(out), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "index.html"


def _trend_drawn(dom: str) -> bool:
    start = dom.find('class="history-trend"')
    return start >= 0 and "chart__axis_y" in dom[start:]


def test_the_report_shows_categories_environment_executor_and_a_two_point_trend(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    try:
        chromium = find_chromium()
    except ConfigError as exc:
        pytest.skip(f"no browser and not root to install one (`./txchaos test` installs chromium as root): {exc}")
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(txchaos_stack.to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GITLAB_", "CI_"))}
    env |= {"TXCHAOS_REPORTS": str(tmp_path / "reports"), "COLUMNS": "200"}
    env.pop("TXCHAOS_SPARK_VERIFY", None)
    _pytest(tmp_path / "results-1", endpoints, env, "0-")  # seed 0: naive, naive-unique, check-then-skip
    first = _report(tmp_path / "results-1", tmp_path / "report-1", env)
    assert (first.parent / "history" / "history-trend.json").is_file(), "a single-file report keeps its history"
    _pytest(tmp_path / "results-2", endpoints, env, "0-naive")
    index = _report(tmp_path / "results-2", tmp_path / "report-2", env | CI, "--history", str(first.parent))

    categories = _text(dump_dom(chromium, index, "categories"))
    assert "Anomaly: duplicate-effect" in categories, categories[:2000]
    assert "Anomaly: dead-lettered-with-effect" in categories, categories[:2000]
    overview_dom = dump_dom(chromium, index, ready=_trend_drawn, what="the trend chart's axes")
    overview = _text(overview_dom)
    for shown in ("Environment", "ActiveMQ 6.1.", "Kafka 4.1.", "Toxiproxy 2.12.", "DTM 1.19.0"):
        assert shown in overview, f"{shown!r} not on the overview: {overview[:2000]}"
    assert "GitHub Actions" in overview
    assert "chaos #2" in overview
    trend = overview_dom[overview_dom.index('class="history-trend"') :]
    trend = trend[: trend.index("chart__axis_y")]
    assert trend.count('class="slice"') == 2, "the trend holds this run and the previous one"

    shots = os.environ.get("TXCHAOS_SCREENSHOTS")
    if shots:
        screenshot(chromium, index, "categories", Path(shots) / "report-categories.png")
        screenshot(chromium, index, "", Path(shots) / "report-overview.png", size=(1100, 1000))
