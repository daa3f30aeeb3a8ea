"""Effects and invariants the user declares as SQL: checked before a run, snapshotted at its end.

A flow contract (``model.FlowContract``) may say what "applied once" means for the user's data:
``effect_sql`` returns ``(op_id, applied)`` per operation, each ``Invariant`` returns
``(actual, expected)`` (global) or ``(op_id, actual, expected)`` (per operation). The run layer
calls two functions of this module:

- ``check(engine, contract)`` right after the schema is applied, before any worker starts: every
  query runs once in a read-only transaction that is rolled back, and its result columns are
  held to the contract; a bad declaration is the user's configuration (``ConfigError``).
- ``snapshot(engine, contract, ledger, ops)`` at the end-state snapshot: the queries run on the
  final state and their results go to the ledger as residue (``ledger/schema.py``), where both
  engines judge them with the rules of ``model.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from harness.clients import db
from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.verify.model import INVARIANT_OP_PREFIX, FlowContract, Invariant

__all__ = ["Declaration", "check", "declarations", "snapshot"]

# Postgres type OIDs a count or an amount may come back as: smallint, integer, bigint, numeric.
INTEGER_TYPES = frozenset({21, 23, 20, 1700})
STATEMENT_TIMEOUT_MS = 60_000
SUSPECTS_SHOWN = 10  # op ids a broken global invariant names per list; the counts stay exact


@dataclass(frozen=True)
class Declaration:
    """One query of a contract: what it is called in messages, its SQL and the columns it must return."""

    what: str
    sql: str
    columns: tuple[str, ...]

    @property
    def example(self) -> str:
        return "SELECT " + ", ".join(f"... AS {c}" for c in self.columns) + " FROM ..."


def declarations(contract: FlowContract) -> list[Declaration]:
    """Return the contract's queries, effect first, each with the columns it must return."""
    out = []
    if contract.effect_sql:
        out.append(Declaration("the declared effect (effect_sql)", contract.effect_sql, ("op_id", "applied")))
    for inv in contract.invariants:
        cols = ("actual", "expected") if inv.scope == "global" else ("op_id", "actual", "expected")
        out.append(Declaration(f"invariant {inv.name!r} ({inv.scope})", inv.sql, cols))
    return out


def _run(engine: Engine, decl: Declaration, submitted: int) -> tuple[list[str], list[int | None], list[Any]]:
    """Run one declaration read-only and roll back; return its column names, type codes and rows."""
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            # a declaration waiting on a lock a stuck worker holds must not hang the run's close
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
            result = conn.execute(sa.text(decl.sql), {"submitted": submitted})
            if not result.returns_rows:
                raise ConfigError(
                    f"{decl.what} returns no rows: {decl.sql!r}",
                    hint=f"declare a query, e.g. {decl.example}",
                )
            description = list(result.cursor.description or ()) if result.cursor is not None else []
            names = [str(d[0]) for d in description]
            types = [d[1] if isinstance(d[1], int) else None for d in description]
            rows = [tuple(r) for r in result.all()]
        except sa.exc.DBAPIError as exc:
            if db.is_connection_error(exc):
                raise
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
            raise ConfigError(f"{decl.what} failed: {reason}; statement: {decl.sql!r}", hint=_fix(reason)) from exc
        finally:
            trans.rollback()
    return names, types, rows


def _fix(reason: str) -> str:
    if "does not exist" in reason:
        return "name tables and columns of the scenario's schema (the DDL applied before the run), or add them to it"
    if "statement timeout" in reason:
        return f"the query ran over {STATEMENT_TIMEOUT_MS // 1000} s: index the columns it joins or groups on"
    if "read-only transaction" in reason:
        return "a declaration only reads the final state: use SELECT, never INSERT, UPDATE, DELETE or DDL"
    return "fix the SQL so it runs on the scenario's schema (try it in psql on an empty copy first)"


def _check_columns(decl: Declaration, names: list[str], types: list[int | None]) -> None:
    if tuple(names) != decl.columns:
        raise ConfigError(
            f"{decl.what} returns columns ({', '.join(names)}), not ({', '.join(decl.columns)}): {decl.sql!r}",
            hint=f"select exactly those columns in that order, aliased: {decl.example}",
        )
    for name, code in zip(names, types, strict=False):
        if name != "op_id" and code is not None and code not in INTEGER_TYPES:
            raise ConfigError(
                f"{decl.what}: column {name!r} is not an integer (Postgres type oid {code}): {decl.sql!r}",
                hint=f"return a count or an amount in whole units, e.g. CAST(... AS bigint) AS {name}",
            )


def check(engine: Engine, contract: FlowContract) -> None:
    """Run every declaration of ``contract`` once against the real schema, then roll back.

    Raises ``ConfigError`` naming the statement and the fix for a query that fails, writes,
    names an unknown table or returns other columns than the contract needs. Call it after the
    schema is applied and before any worker starts.
    """
    for decl in declarations(contract):
        names, types, _rows = _run(engine, decl, submitted=0)
        _check_columns(decl, names, types)


def _int(decl: Declaration, column: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | Decimal) or value != int(value):
        raise ConfigError(
            f"{decl.what}: {column} = {value!r} at the end of the run is not a whole number: {decl.sql!r}",
            hint=f"return a count or an amount in whole units, never NULL: e.g. coalesce(sum(...), 0) AS {column}",
        )
    return int(value)


def snapshot(
    engine: Engine,
    contract: FlowContract,
    ledger: LedgerWriter,
    ops: Collection[str],
    *,
    step: Callable[[str], object] | None = None,
) -> list[str]:
    """Evaluate the declared effect and invariants on the final state and write them to ``ledger``.

    ``ops`` are the ids of the submitted operations (``:submitted`` binds to their number).
    Returns one line per declaration, each also passed to ``step`` (the run folder's step log).
    A contract without declarations costs nothing: no query runs.
    """
    steps: list[str] = []
    applied: dict[str, int] = {}
    decls = declarations(contract)
    if contract.effect_sql:
        decl = decls.pop(0)
        names, types, rows = _run(engine, decl, submitted=len(ops))
        _check_columns(decl, names, types)
        for op, n in rows:
            applied[str(op)] = applied.get(str(op), 0) + _int(decl, "applied", n)
        for op, n in sorted(applied.items()):
            ledger.emit(Kind.RESIDUE_DECLARED, op=op, dest="effect_sql", applied=n)
        steps.append(f"snapshot declared effect: {len(applied)} operations")
    suspects = _suspects(applied, ops) if contract.effect_sql else {}
    for inv, decl in zip(contract.invariants, decls, strict=True):
        names, types, rows = _run(engine, decl, submitted=len(ops))
        _check_columns(decl, names, types)
        steps.append(_record(ledger, inv, decl, rows, suspects))
    if step is not None:
        for line in steps:
            step(line)
    return steps


def _suspects(applied: dict[str, int], ops: Collection[str]) -> dict[str, Any]:
    twice = sorted(op for op, n in applied.items() if n > 1)
    never = sorted(op for op in ops if applied.get(op, 0) == 0)
    return {
        "applied_twice": twice[:SUSPECTS_SHOWN],
        "applied_twice_n": len(twice),
        "not_applied": never[:SUSPECTS_SHOWN],
        "not_applied_n": len(never),
    }


def _record(
    ledger: LedgerWriter, inv: Invariant, decl: Declaration, rows: Sequence[Any], suspects: dict[str, Any]
) -> str:
    """Write one invariant's result; return its step line."""
    info: dict[str, Any] = {"invariant": inv.name, "label": inv.shown, "scope": inv.scope}
    if inv.scope == "global":
        if len(rows) != 1:
            raise ConfigError(
                f"{decl.what} returned {len(rows)} rows at the end of the run, not one: {decl.sql!r}",
                hint="aggregate to one row (sum, count), or declare it with scope='op'",
            )
        actual, expected = _int(decl, "actual", rows[0][0]), _int(decl, "expected", rows[0][1])
        holds = actual == expected
        op = None if holds else INVARIANT_OP_PREFIX + inv.name
        ledger.emit(
            Kind.RESIDUE_INVARIANT,
            op=op,
            dest="invariant",
            **info,
            actual=actual,
            expected=expected,
            holds=holds,
            **({} if holds else suspects),
        )
        return f"invariant {inv.name}: {inv.shown} = {actual}, expected {expected}" + ("" if holds else " (broken)")
    broken = 0
    for op_id, a, e in rows:
        actual, expected = _int(decl, "actual", a), _int(decl, "expected", e)
        if actual != expected:
            broken += 1
            ledger.emit(
                Kind.RESIDUE_INVARIANT,
                op=str(op_id),
                dest="invariant",
                **info,
                actual=actual,
                expected=expected,
                holds=False,
            )
    ledger.emit(Kind.RESIDUE_INVARIANT, dest="invariant", **info, checked=len(rows), broken=broken, holds=not broken)
    return f"invariant {inv.name}: {broken} of {len(rows)} operations broken"
