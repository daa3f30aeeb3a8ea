"""The DDL a run applies before its workers start: a built-in pattern's, a file of yours, or SQL text."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from importlib.resources.abc import Traversable
from pathlib import Path

from harness.clients import db
from harness.errors import ConfigError

_BUILTIN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")
Requirement = tuple[str, str, str]  # (what the spec calls it, table, column), e.g. ("effect_table", "orders", "op_id")


@dataclass(frozen=True)
class Schema:
    """The tables your handlers write, created (idempotently) at the start of every run.

    A ``ScenarioSpec`` takes one of these, or a string: ``"onepc"`` names a built-in pattern's
    schema, ``"sql/orders.sql"`` (any string ending in ``.sql``) is a file of yours, relative to
    the working directory (run pytest from your project's root, where its ``pyproject.toml`` is).

    >>> Schema.file("sql/orders.sql")                       # relative to the working directory
    >>> Schema.file("../sql/orders.sql", relative_to=__file__)  # relative to this test module
    >>> Schema.sql("CREATE TABLE IF NOT EXISTS orders (op_id text PRIMARY KEY)")
    >>> Schema.builtin("onepc")

    The DDL runs on every run before the tables are emptied: write ``CREATE TABLE IF NOT EXISTS``.
    ``requires`` lists the tables and columns the run reads (the spec fills in its effect and
    outbox tables); each is checked right after the DDL ran, before any worker starts.
    """

    kind: str  # "builtin", "file" or "sql"
    value: str  # the built-in name, the resolved file path, or the SQL text
    requires: tuple[Requirement, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "builtin":
            _check_builtin_name(self.value)
        elif self.kind == "file":
            _check_file(Path(self.value))
        elif self.kind == "sql":
            if not isinstance(self.value, str) or not self.value.strip():
                raise ConfigError(f"schema SQL {self.value!r} is empty", hint="give the CREATE TABLE statements")
        else:
            raise ConfigError(
                f"schema kind {self.kind!r} is unknown", hint="use Schema.builtin(), Schema.file() or Schema.sql()"
            )

    @classmethod
    def builtin(cls, name: str) -> Schema:
        """Return a built-in pattern's schema (``fixtures/sql/<name>.sql`` of txchaos)."""
        return cls("builtin", name)

    @classmethod
    def file(cls, path: str | os.PathLike[str], *, relative_to: str | os.PathLike[str] | None = None) -> Schema:
        """Return the schema in the ``.sql`` file ``path``, resolved now.

        A relative ``path`` is taken from ``relative_to`` (a folder, or a file's folder such as a
        test module's ``__file__``) or else from the working directory.
        """
        if not isinstance(path, str | os.PathLike):
            raise ConfigError(f"schema path {path!r} is not a path", hint="give the path of a .sql file as a string")
        base = Path.cwd() if relative_to is None else Path(relative_to)
        if relative_to is not None and base.is_file():
            base = base.parent
        return cls("file", str((base / Path(path)).resolve()))

    @classmethod
    def sql(cls, text: str) -> Schema:
        """Return a schema given as SQL text."""
        return cls("sql", text)

    @classmethod
    def of(cls, value: object) -> Schema:
        """Return ``value`` as a Schema: a Schema, a built-in name, or a path ending in ``.sql``."""
        if isinstance(value, Schema):
            return value
        if isinstance(value, os.PathLike) or (isinstance(value, str) and value.endswith(".sql")):
            return cls.file(value)
        if isinstance(value, str):
            return cls.builtin(value)
        raise ConfigError(
            f"schema {value!r} is neither a name, a .sql path nor a Schema",
            hint='write schema="onepc" (built-in), schema="sql/orders.sql" (your file) or schema=Schema.sql("...")',
        )

    def requiring(self, *requirements: Requirement) -> Schema:
        """Return this schema with ``requirements`` (tables and columns the run reads) to check."""
        return replace(self, requires=tuple(requirements))

    @property
    def source(self) -> str:
        """Name where the DDL comes from, for messages."""
        if self.kind == "builtin":
            return f"built-in schema {self.value!r}"
        if self.kind == "file":
            return f"schema file {self.value}"
        return "the schema SQL given in the spec"

    def check(self) -> None:
        """Check, before a run starts anything, that the DDL can be read (a built-in name exists)."""
        if self.kind == "builtin" and not _builtin_path(self.value).is_file():
            raise ConfigError(
                f"no built-in schema {self.value!r}",
                hint=f"use one of {', '.join(_builtin_names())}, or your own file: schema='sql/{self.value}.sql'",
            )
        if self.kind == "file":
            _check_file(Path(self.value))

    def text(self) -> str:
        """Return the DDL (a file is read again, so an edit between runs is seen)."""
        self.check()
        if self.kind == "builtin":
            return _builtin_path(self.value).read_text()
        if self.kind == "file":
            return Path(self.value).read_text()
        return self.value

    def __str__(self) -> str:
        if self.kind == "sql":
            return f"inline SQL ({len(self.value.splitlines())} lines)"
        return self.value


def _builtin_path(name: str) -> Traversable:
    return db.SQL_DIR / f"{name}.sql"


def _builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".sql") for p in db.SQL_DIR.iterdir() if p.name.endswith(".sql"))


def _check_builtin_name(name: object) -> None:
    # The name form is a bare name: "../x" or "/etc/x" would read files outside txchaos's SQL folder.
    if not isinstance(name, str) or not _BUILTIN.match(name):
        raise ConfigError(
            f"schema name {name!r} is not a built-in name",
            hint="a built-in name is a bare name such as 'onepc'; for your own DDL give a path ending in "
            "'.sql' or Schema.sql('CREATE TABLE ...')",
        )


def _check_file(path: Path) -> None:
    if path.suffix != ".sql":
        raise ConfigError(f"schema file {path} does not end in .sql", hint="name the DDL file <something>.sql")
    if not path.is_file():
        raise ConfigError(
            f"no schema file {path}",
            hint=f"a relative path is taken from the working directory ({Path.cwd()}): run pytest from your "
            "project's root, give an absolute path, or Schema.file(path, relative_to=__file__)",
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"schema file {path} cannot be read: {exc}", hint="make it a readable UTF-8 text file"
        ) from exc
    if not text.strip():
        raise ConfigError(
            f"schema file {path} is empty", hint="write the CREATE TABLE IF NOT EXISTS statements into it"
        )
