"""A team brings the DDL of its own tables: a .sql file of its project, or SQL text (issue 13 part 4).

These need no service: the schema is checked where the spec is made or when the run begins.
tests/integration/test_example_project.py applies DDL to the stack's Postgres: a failing statement
and a missing effect table are refused before any worker starts, naming the statement and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ConfigError, ScenarioSpec
from harness.run.spec.schema import Schema
from tests.support import ONEPC, make_spec, refused

ORDERS = {**ONEPC, "name": "orders", "handler": "orders.handlers:naive", "effect_table": "orders"}


def spec(schema: object, **kw: object) -> ScenarioSpec:
    return make_spec(ORDERS, schema=schema, **kw)


def test_a_relative_sql_path_is_the_users_file_resolved_where_the_spec_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "orders.sql").write_text("CREATE TABLE IF NOT EXISTS orders (op_id text);\n")
    monkeypatch.chdir(tmp_path)
    s = spec("sql/orders.sql")
    monkeypatch.chdir("/")  # stored resolved: a later change of directory does not lose it
    assert isinstance(s.schema, Schema)
    assert s.schema.kind == "file"
    assert s.schema.value == str(tmp_path / "sql" / "orders.sql")
    assert "CREATE TABLE IF NOT EXISTS orders" in s.schema.text()
    assert s.schema.requires == (("effect_table", "orders", "op_id"),)


def test_a_schema_file_next_to_the_test_module(tmp_path: Path) -> None:
    (tmp_path / "orders.sql").write_text("CREATE TABLE IF NOT EXISTS orders (op_id text);\n")
    test_module = tmp_path / "test_orders.py"
    test_module.write_text("")
    assert Schema.file("orders.sql", relative_to=test_module).value == str(tmp_path / "orders.sql")


def test_inline_sql_and_builtin_names_still_work() -> None:
    s = spec(Schema.sql("CREATE TABLE IF NOT EXISTS orders (op_id text)"))
    assert s.schema.text().startswith("CREATE TABLE")  # type: ignore[union-attr]
    builtin = spec("onepc", effect_table="onepc_effects").schema
    assert isinstance(builtin, Schema)
    assert "onepc_effects" in builtin.text()


@pytest.mark.parametrize(
    ("value", "named", "fix"),
    [
        ("../../etc/passwd", "'../../etc/passwd'", "bare name"),
        ("/etc/passwd", "'/etc/passwd'", "bare name"),
        ("sql/../onepc", "'sql/../onepc'", "bare name"),
        ("missing/orders.sql", "no schema file", "working directory"),
        (42, "schema 42", "Schema.sql"),
    ],
)
def test_a_bad_schema_is_refused_where_the_spec_is_made(value: object, named: str, fix: str) -> None:
    refused(lambda: spec(value), named, fix)


def test_an_unknown_builtin_name_is_refused_before_the_run_starts() -> None:
    from harness.run.core.session import run_scenario

    bad = spec("orderz", handler="harness.patterns.onepc:naive")
    refused(lambda: run_scenario(bad, endpoints=None), "no built-in schema 'orderz'", "onepc")  # type: ignore[arg-type]


def test_an_empty_or_unreadable_schema_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sql"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        spec(str(empty))
    folder = tmp_path / "folder.sql"
    folder.mkdir()
    with pytest.raises(ConfigError, match="no schema file"):
        spec(str(folder))
    with pytest.raises(ConfigError, match="is empty"):
        Schema.sql("")
