"""The only module that sets up SQLAlchemy engines (Postgres through psycopg 3)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from harness import resources
from harness.errors import HarnessError

SQL_DIR: Path = resources.fixture("sql")


def engine(url: str, *, pool_size: int = 2, autocommit: bool = False) -> Engine:
    """Return an engine for ``url``; ``autocommit`` for the non-transactional side connections."""
    kwargs: dict[str, object] = {"pool_size": pool_size, "max_overflow": 2, "pool_pre_ping": True}
    if autocommit:
        kwargs["isolation_level"] = "AUTOCOMMIT"
    return sa.create_engine(url, connect_args={"connect_timeout": 5}, **kwargs)


def apply_schema(eng: Engine, name: str) -> None:
    """Run ``fixtures/sql/<name>.sql`` (idempotent DDL)."""
    path = SQL_DIR / f"{name}.sql"
    if not path.exists():
        raise HarnessError(f"no schema file {path}")
    with eng.begin() as conn:
        conn.exec_driver_sql(path.read_text())


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
    with eng.connect() as conn:
        return [str(r[0]) for r in conn.execute(sa.text(f'SELECT "{column}" FROM "{table}"{where} ORDER BY 1'))]


def duplicated_values(eng: Engine, table: str, column: str) -> list[str]:
    """Return the values of ``table.column`` that occur more than once (duplicate effects)."""
    sql = f'SELECT "{column}" FROM "{table}" GROUP BY 1 HAVING count(*) > 1 ORDER BY 1'
    with eng.connect() as conn:
        return [str(r[0]) for r in conn.execute(sa.text(sql))]


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


def is_integrity_error(exc: BaseException) -> bool:
    """Return True for a constraint violation (duplicate key and the like)."""
    return isinstance(exc, sa.exc.IntegrityError)


def is_connection_error(exc: BaseException) -> bool:
    """Return True when the database connection itself failed (not the statement)."""
    return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    )


__all__ = [
    "Connection",
    "Engine",
    "apply_schema",
    "column_values",
    "duplicated_values",
    "engine",
    "ensure_database",
    "is_connection_error",
    "is_integrity_error",
    "ping",
    "truncate_all",
]
