"""A team brings the DDL of its own tables: a .sql file of its project, or SQL text (issue 13 part 4).

The first tests need no service: the schema is checked where the spec is made. The last ones
apply DDL to the real Postgres of the stack: a failing statement and a missing effect table are
refused before any worker starts, naming the file, the statement and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ConfigError, ScenarioSpec
from harness.run.schema import Schema


def spec(schema: object, **kw: object) -> ScenarioSpec:
    base: dict[str, object] = dict(
        name="orders", variant="naive", handler="orders.handlers:naive", schema=schema, effect_table="orders"
    )
    base.update(kw)
    return ScenarioSpec(**base)  # type: ignore[arg-type]


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
    with pytest.raises(ConfigError) as info:
        spec(value)
    assert named in str(info.value)
    assert fix in str(info.value)


def test_an_unknown_builtin_name_is_refused_before_the_run_starts() -> None:
    from harness.run.dispatch import run_spec

    with pytest.raises(ConfigError) as info:
        run_spec(spec("orderz", handler="harness.patterns.onepc:naive"), endpoints=None)  # type: ignore[arg-type]
    assert "no built-in schema 'orderz'" in str(info.value)
    assert "onepc" in str(info.value)


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


# -- against the real Postgres ---------------------------------------------------------------------
FAILING = """\
CREATE TABLE IF NOT EXISTS orders (
    op_id text PRIMARY KEY
);
-- the next statement has a typo
CREATE TABEL IF NOT EXISTS order_lines (
    op_id text
);
"""


@pytest.mark.integration
def test_failing_ddl_names_the_file_the_statement_and_the_fix(txchaos_stack: object, tmp_path: Path) -> None:
    from harness.clients import db

    path = tmp_path / "orders.sql"
    path.write_text(FAILING)
    schema = spec(str(path)).schema
    assert isinstance(schema, Schema)
    eng = db.engine(txchaos_stack.postgres_url)  # type: ignore[attr-defined]
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
    txchaos_stack: object, ddl: str, named: str, fix: str
) -> None:
    from harness.clients import db

    eng = db.engine(txchaos_stack.postgres_url)  # type: ignore[attr-defined]
    try:
        with eng.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS orders")
        with pytest.raises(ConfigError) as info:
            db.apply_schema(eng, spec(Schema.sql(ddl)).schema)  # type: ignore[arg-type]
    finally:
        with eng.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS orders; DROP TABLE IF EXISTS t5_other")
        eng.dispose()
    assert named in str(info.value)
    assert fix in str(info.value)
