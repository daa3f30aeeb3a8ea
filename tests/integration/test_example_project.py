"""txchaos from a team's own repository, as a new user gets it (issue 13).

``examples/orders-service`` is such a repository: its own package, schema and tests, using only the
plugin's fixtures. Here the txchaos wheel is built and installed (not editable) into a fresh
virtualenv outside the checkout, the example is copied outside it too, and its tests run against
the real stack with nothing set by hand but the provider. The naive handler must be caught
duplicating the crashed order; the inbox handler must be clean.

The other tests apply a team's DDL to the stack's Postgres: a failing statement and a missing
effect table are refused before any worker starts, naming the file, the statement and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import ConfigError, ScenarioSpec, Schema
from harness.stack.base import Endpoints
from tests.support import KAFKA, make_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "orders-service"
PIPELINE = REPO / "examples" / "ci" / "pipeline.sh"


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


@pytest.mark.integration
@pytest.mark.activemq
def test_the_example_project_runs_from_a_fresh_virtualenv(tmp_path: Path) -> None:
    # The environment a user has: no PYTHONPATH, no txchaos variables, not inside the checkout.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TXCHAOS_")}
    env = {k: v for k, v in env.items() if not k.startswith(("GITHUB_", "GITLAB_", "CI_"))}
    env.pop("VIRTUAL_ENV", None)
    took: dict[str, float] = {}

    started = time.monotonic()
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)], tmp_path, env, 300)
    (wheel,) = wheels.glob("txchaos-*.whl")
    took["build wheel"] = time.monotonic() - started

    project = tmp_path / "orders-service"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("reports", "__pycache__", "*.egg-info"))
    # The CI pipeline of examples/ci, as both YAMLs run it: a fresh virtualenv, the wheel installed
    # (not editable), `txchaos install`, the team's tests, the Allure report. Started from the folder
    # above the project, as CI often does: the workers (forked from a server started there) find
    # the team's package only through the import path pytest gave the test.
    ci = {**env, "TXCHAOS_PIP_SPEC": str(wheel), "TESTS": str(project), "OUT": "ci", "VENV": "venv"}
    started = time.monotonic()
    proc = _run(["bash", str(PIPELINE)], tmp_path, ci, 1500)
    took["pipeline"] = time.monotonic() - started
    junit = tmp_path / "ci" / "junit.xml"
    report = tmp_path / "ci" / "allure-report"
    assert (report / "index.html").is_file(), proc.stdout[-3000:]
    assert (report / "history" / "history-trend.json").is_file()
    assert (tmp_path / "ci" / "allure-results" / "categories.json").is_file()
    assert "no previous report with a history" in proc.stdout
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {
        "test_naive_handler_places_a_redelivered_order_twice",
        "test_inbox_handler_places_each_order_once",
        # The team's own consumer process under a wire trap (orders/consumer.py, no txchaos in it).
        "test_consumer_without_inbox_places_the_order_again",
        "test_consumer_with_inbox_places_each_order_once",
        # The txchaos_soak fixture: two workers under a nemesis of crash points, caught and held.
        "test_a_soak_catches_the_naive_handler_placing_an_order_twice",
        "test_the_inbox_handler_holds_under_the_same_soak",
    }
    assert all(not list(c) for c in cases.values()), proc.stdout[-6000:]  # no failure, error or skip
    # The verdicts themselves, from the plugin's summary (the run folders are under the project).
    assert "orders:naive" in proc.stdout
    assert "duplicate-effect=1 [naive-s0-op00003]" in proc.stdout
    assert "CLEAN" in proc.stdout.split("orders:inbox", 1)[1].splitlines()[0]
    assert "duplicate-effect=1 [consumer-naive-s0-op00003]" in proc.stdout
    assert "CLEAN" in proc.stdout.split("orders-consumer:consumer-inbox", 1)[1].splitlines()[0]
    assert list((tmp_path / "reports" / "runs").glob("*-orders-naive-s0-*"))
    soaks = [p for p in (tmp_path / "reports" / "runs").glob("*-orders-*") if (p / "soak.json").is_file()]
    assert len(soaks) == 2, soaks  # each with its schedule, summary and plot beside the ledger
    assert all((p / "nemesis.json").is_file() and (p / "soak.png").is_file() for p in soaks), soaks

    # The next pipeline takes this report's history (a CI cache holds it between pipelines), and
    # fails on the tests' exit code: a test that does not hold fails the pipeline.
    gate = project / "tests" / "test_gate.py"
    gate.write_text(GATE)
    nxt = {
        **ci,
        "OUT": "ci-2",
        "PREVIOUS_REPORT": str(report),
        "TESTS": str(gate),
        "PYTEST_ARGS": "-p no:cacheprovider",
    }
    second = subprocess.run(
        ["bash", str(PIPELINE)], cwd=tmp_path, env=nxt, capture_output=True, text=True, timeout=900, check=False
    )
    assert second.returncode == 1, second.stdout[-4000:] + second.stderr[-2000:]
    trend = json.loads((tmp_path / "ci-2" / "allure-report" / "history" / "history-trend.json").read_text())
    assert len(trend) == 2, trend
    failed = [c for c in ET.parse(tmp_path / "ci-2" / "junit.xml").getroot().iter("testcase") if list(c)]
    assert [c.get("name") for c in failed] == ["test_gate_catches_the_naive_handler_as_clean"]


# A test a team might write by mistake: it asserts the naive handler is clean, so the gate must fail.
GATE = """
from harness import Crash, ScenarioSpec, Schema


def test_gate_catches_the_naive_handler_as_clean(txchaos_run):
    spec = ScenarioSpec(
        name="orders", variant="naive", handler="orders.handlers:place_order_naive",
        schema=Schema.file("../orders.sql", relative_to=__file__), effect_table="orders", messages=6,
        crashes=(Crash("after_db_commit", op_index=3),),
    )
    assert txchaos_run(spec).verdict.clean
"""


# -- a team's DDL against the stack's Postgres ------------------------------------------------------
FAILING = """\
CREATE TABLE IF NOT EXISTS orders (
    op_id text PRIMARY KEY
);
-- the next statement has a typo
CREATE TABEL IF NOT EXISTS order_lines (
    op_id text
);
"""


def _spec(schema: object) -> ScenarioSpec:
    return ScenarioSpec(
        name="orders", variant="v", handler="orders.handlers:naive", schema=schema, effect_table="orders"
    )  # type: ignore[arg-type]


@pytest.mark.integration
def test_failing_ddl_names_the_file_the_statement_and_the_fix(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    from harness.clients import db

    path = tmp_path / "orders.sql"
    path.write_text(FAILING)
    schema = _spec(str(path)).schema
    assert isinstance(schema, Schema)
    eng = db.engine(txchaos_stack.postgres_url)
    try:
        with pytest.raises(ConfigError) as info:
            db.apply_schema(eng, schema)
    finally:
        eng.dispose()
    text = str(info.value)
    assert str(path) in text
    assert "line 5" in text
    assert "CREATE TABEL IF NOT EXISTS order_lines" in text
    assert "Hint:" in text
    assert info.value.exit_code == 2


@pytest.mark.integration
@pytest.mark.parametrize(
    ("ddl", "named", "fix"),
    [
        ("CREATE TABLE IF NOT EXISTS t5_other (op_id text);", "effect_table 'orders' does not exist", "create table"),
        ("CREATE TABLE IF NOT EXISTS orders (id text);", "has no column 'op_id'", "add column op_id"),
    ],
)
def test_the_effect_table_is_checked_right_after_the_schema(
    txchaos_stack: Endpoints, ddl: str, named: str, fix: str
) -> None:
    from harness.clients import db

    schema = _spec(Schema.sql(ddl)).schema
    assert isinstance(schema, Schema)
    eng = db.engine(txchaos_stack.postgres_url)
    try:
        with eng.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS orders")
        with pytest.raises(ConfigError) as info:
            db.apply_schema(eng, schema)
    finally:
        with eng.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS orders; DROP TABLE IF EXISTS t5_other")
        eng.dispose()
    assert named in str(info.value)
    assert fix in str(info.value)


@pytest.mark.integration
@pytest.mark.kafka
def test_the_exported_run_scenario_runs_a_kafka_spec_on_kafka(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    # Before: harness.run_scenario was the ActiveMQ runner and ran this spec as STOMP workers,
    # reporting dead-lettered=10 instead of the duplicate a crash before the offset commit makes.
    import json

    import harness

    spec = make_spec(
        KAFKA,  # the Kafka consumer pattern's naive handler and tables
        name="kafka_api",
        messages=10,
        options={"batch_size": 5, "partitions": 1},
        crashes=(harness.Crash("before_offset_commit", op_index=2),),
        timeout_s=60,
    )
    result = harness.run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    kinds = {json.loads(p.read_text())["kind"] for p in (result.run_dir / "workers").glob("*.json")}
    assert kinds == {"kafka"}
    assert set(result.verdict.found()) == {"duplicate-effect"}, result.verdict.headline()
