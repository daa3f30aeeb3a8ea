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
    env.pop("VIRTUAL_ENV", None)
    took: dict[str, float] = {}

    started = time.monotonic()
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)], tmp_path, env, 300)
    (wheel,) = wheels.glob("txchaos-*.whl")
    took["build wheel"] = time.monotonic() - started

    started = time.monotonic()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 120)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)], tmp_path, env, 600)
    took["install wheel"] = time.monotonic() - started

    started = time.monotonic()
    _run([str(venv / "bin" / "txchaos"), "install"], tmp_path, env, 900)
    took["txchaos install"] = time.monotonic() - started

    project = tmp_path / "orders-service"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("reports", "__pycache__", "*.egg-info"))
    junit = tmp_path / "junit.xml"
    started = time.monotonic()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # Started from the folder above the project, as CI often does: the workers (forked from a server
    # started there) find the team's package only through the import path pytest gave the test.
    argv = [str(python), "-m", "pytest", str(project), "--txchaos-provider", "local", f"--junitxml={junit}"]
    proc = _run(argv, tmp_path, env, 600)
    took["example tests"] = time.monotonic() - started
    print(", ".join(f"{k} {v:.0f} s" for k, v in took.items()))

    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {
        "test_naive_handler_places_a_redelivered_order_twice",
        "test_inbox_handler_places_each_order_once",
        # The team's own consumer process under a wire trap (orders/consumer.py, no txchaos in it).
        "test_consumer_without_inbox_places_the_order_again",
        "test_consumer_with_inbox_places_each_order_once",
    }
    assert all(not list(c) for c in cases.values()), proc.stdout[-6000:]  # no failure, error or skip
    # The verdicts themselves, from the plugin's summary (the run folders are under the project).
    assert "orders:naive" in proc.stdout
    assert "duplicate-effect=1 [naive-s0-op00003]" in proc.stdout
    assert "CLEAN" in proc.stdout.split("orders:inbox", 1)[1].splitlines()[0]
    assert "duplicate-effect=1 [consumer-naive-s0-op00003]" in proc.stdout
    assert "CLEAN" in proc.stdout.split("orders-consumer:consumer-inbox", 1)[1].splitlines()[0]
    assert list((tmp_path / "reports" / "runs").glob("*-orders-naive-s0-*"))


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
