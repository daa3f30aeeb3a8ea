"""The only module that sets up SQLAlchemy engines (Postgres through psycopg 3)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from harness import resources
from harness.errors import ConfigError

SQL_DIR: Path = resources.fixture("sql")


def engine(
    url: str, *, pool_size: int = 2, autocommit: bool = False, creator: Callable[[], Any] | None = None
) -> Engine:
    """Return an engine for ``url``; ``autocommit`` for the non-transactional side connections;
    ``creator`` makes each DBAPI connection itself (``url`` then names only the dialect)."""
    kwargs: dict[str, object] = {"pool_size": pool_size, "max_overflow": 2, "pool_pre_ping": True}
    if autocommit:
        kwargs["isolation_level"] = "AUTOCOMMIT"
    if creator is not None:
        return sa.create_engine(url, creator=creator, **kwargs)
    return sa.create_engine(url, connect_args={"connect_timeout": 5}, **kwargs)


class DDL(Protocol):
    """A schema to apply: its SQL, where it comes from, and the (role, table, column) the run reads."""

    @property
    def source(self) -> str: ...

    @property
    def requires(self) -> tuple[tuple[str, str, str], ...]: ...

    def text(self) -> str: ...


def apply_schema(eng: Engine, schema: str | DDL) -> None:
    """Run ``schema``'s DDL (a built-in name: ``fixtures/sql/<name>.sql``), then check its tables.

    A failing statement or a missing table is the user's configuration, found before any worker
    starts: ConfigError naming the source, the statement and the fix.
    """
    if isinstance(schema, str):
        path = SQL_DIR / f"{schema}.sql"
        if "/" in schema or "\\" in schema or schema.startswith(".") or not path.is_file():
            raise ConfigError(f"no built-in schema {schema!r}", hint="name a file of fixtures/sql without '.sql'")
        requires: tuple[tuple[str, str, str], ...] = ()
        text, source = path.read_text(), f"built-in schema {schema!r}"
    else:
        text, source, requires = schema.text(), schema.source, schema.requires
    try:
        with eng.begin() as conn:
            conn.exec_driver_sql(text)
    except sa.exc.DBAPIError as exc:
        if is_connection_error(exc):
            raise
        raise ConfigError(f"the DDL of {source} failed: {_ddl_failure(text, exc)}", hint=_DDL_HINT) from exc
    _check_tables(eng, source, requires)


_DDL_HINT = (
    "fix that statement (it runs at the start of every run, so write CREATE TABLE IF NOT EXISTS); "
    "try it with psql against an empty database"
)


def _ddl_failure(text: str, exc: sa.exc.DBAPIError) -> str:
    """Describe the failing statement from the driver's error: its message, line and first line."""
    diag = getattr(exc.orig, "diag", None)
    message = getattr(diag, "message_primary", None) or str(exc.orig).strip().splitlines()[0]
    position = getattr(diag, "statement_position", None)
    if not position or not str(position).isdigit():
        return f"{message} (Postgres gave no position)"
    at = min(int(position) - 1, len(text))
    start = text.rfind(";", 0, at) + 1
    end = text.find(";", at)
    statement = text[start : end if end >= 0 else len(text)].strip()
    first = next((ln.strip() for ln in statement.splitlines() if ln.strip() and not ln.strip().startswith("--")), "")
    line = text.count("\n", 0, at) + 1
    return f"{message} at line {line}, in the statement starting {first[:120]!r}"


def _check_tables(eng: Engine, source: str, requires: tuple[tuple[str, str, str], ...]) -> None:
    sql = sa.text(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = :t"
    )
    with eng.connect() as conn:
        for role, table, column in requires:
            columns = {r[0] for r in conn.execute(sql, {"t": table})}
            if not columns:
                raise ConfigError(
                    f"{role} {table!r} does not exist after applying {source}",
                    hint=f"create table {table} in the schema, or set {role} to a table the schema creates",
                )
            if column not in columns:
                raise ConfigError(
                    f"{role} {table!r} has no column {column!r} (it has {', '.join(sorted(columns))})",
                    hint=f"add column {column} to {table} in the schema, or name the right column in the spec",
                )


def truncate_all(eng: Engine) -> list[str]:
    """Empty every table of the public schema in one statement; returns the table names."""
    with eng.begin() as conn:
        rows = conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).all()
        tables = [r[0] for r in rows]
        if tables:
            conn.exec_driver_sql("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY")
    return tables


def column_values(eng: Engine, table: str, column: str, *, where_null: str | None = None) -> list[str]:
    """Return every value of ``table.column`` as text (the residue snapshot of an effect table).

    ``where_null``: only rows where that column is NULL (an outbox row never relayed).
    """
    where = f' WHERE "{where_null}" IS NULL' if where_null else ""
    # Through the driver's own cursor: SQLAlchemy's rows cost about as much again as the query
    # (a million-row effect table at the close of a soak: 0.75 s against 0.45 s).
    with eng.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None  # a connection checked out of the pool holds one
        with driver.cursor() as cur:
            cur.execute(f'SELECT "{column}" FROM "{table}"{where} ORDER BY 1')
            return [str(value) for (value,) in cur.fetchall()]


def duplicated_values(eng: Engine, table: str, column: str) -> list[str]:
    """Return the values of ``table.column`` that occur more than once (duplicate effects)."""
    sql = f'SELECT "{column}" FROM "{table}" GROUP BY 1 HAVING count(*) > 1 ORDER BY 1'
    with eng.connect() as conn:
        return [str(r[0]) for r in conn.execute(sa.text(sql))]


def insert_once(conn: Connection, table: str, row: Mapping[str, object]) -> bool:
    """Insert ``row`` into ``table`` unless a row with its ``op_id`` is there; return whether it did.

    The patterns' idempotence key: a redelivery of an operation finds the first delivery's row.
    """
    columns = ", ".join(row)
    values = ", ".join(f":{c}" for c in row)
    sql = f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT (op_id) DO NOTHING"
    return conn.execute(sa.text(sql), dict(row)).rowcount == 1


def count_attempt(conn: Connection, table: str, column: str, op: str) -> int:
    """Add one to ``table.column`` for ``op`` (a first attempt makes the row, at 1); return the count.

    On a connection outside the handler's transaction (``ctx.side``) the count survives the
    handler's rollback: it is how a handler knows which attempt at an operation this is.
    """
    sql = (
        f"INSERT INTO {table} (op_id, {column}) VALUES (:op, 1) "
        f"ON CONFLICT (op_id) DO UPDATE SET {column} = {table}.{column} + 1 RETURNING {column}"
    )
    return int(conn.execute(sa.text(sql), {"op": op}).scalar_one())


def ping(url: str) -> bool:
    """Return True when Postgres at ``url`` answers ``SELECT 1``."""
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 2})
    try:
        with eng.connect() as conn:
            return conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        eng.dispose()


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` unless it exists (CREATE DATABASE cannot run in a transaction)."""
    eng = sa.create_engine(admin_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            found = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
            if not found:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        eng.dispose()


def ensure_owner_role(admin_url: str, role: str, password: str, name: str) -> None:
    """Make ``role`` a login role that is *not* a superuser, with ``password``, owning database ``name``.

    The systems under test connect as ``role``: owning the database lets them create and empty
    their tables, and nothing more (no ``COPY ... TO PROGRAM``, no other database's data).
    Idempotent: a restarted server keeps the role; the password is set again.
    """
    for what, value in (("role", role), ("database", name)):
        if not value.replace("_", "").isalnum():
            raise ConfigError(f"{what} name {value!r} is not a plain identifier", hint="use letters, digits and _")
    quoted_pw = "'" + password.replace("'", "''") + "'"
    eng = sa.create_engine(admin_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            if not conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                conn.exec_driver_sql(f'CREATE ROLE "{role}"')
            attrs = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
            conn.exec_driver_sql(f'ALTER ROLE "{role}" WITH {attrs} PASSWORD {quoted_pw}')
            if not conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first():
                conn.exec_driver_sql(f'CREATE DATABASE "{name}" OWNER "{role}"')
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" OWNER TO "{role}"')
    finally:
        eng.dispose()


def is_integrity_error(exc: BaseException) -> bool:
    """Return True for a constraint violation (duplicate key and the like)."""
    return isinstance(exc, sa.exc.IntegrityError)


def is_connection_error(exc: BaseException) -> bool:
    """Return True when the database connection itself failed (not the statement)."""
    return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    )


__all__ = [
    "DDL",
    "Connection",
    "Engine",
    "apply_schema",
    "column_values",
    "duplicated_values",
    "engine",
    "ensure_database",
    "ensure_owner_role",
    "is_connection_error",
    "is_integrity_error",
    "ping",
    "truncate_all",
]
