"""Postgres reads ``harness.clients.pg_array``'s literals back as the values they came from."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from harness import Endpoints
from harness.clients import db
from harness.clients.pg_array import array_literal

pytestmark = pytest.mark.integration

AWKWARD = ["plain", "b,c", "{d}", " e ", "", "NULL", 'say "hi"', "back\\slash", "tab\tnew\nline", "ünï", None]


def test_postgres_reads_the_literals_back_unchanged(txchaos_stack: Endpoints) -> None:
    eng = db.engine(txchaos_stack.postgres_direct_url, pool_size=1)
    try:
        with eng.connect() as conn:
            texts, ints, big = conn.execute(
                sa.text("SELECT CAST(:t AS text[]), CAST(:i AS int[]), CAST(:b AS bigint[])"),
                {"t": array_literal(AWKWARD), "i": array_literal([0, -7, None]), "b": array_literal([2**40])},
            ).one()
            rows = conn.execute(
                sa.text("SELECT * FROM unnest(CAST(:t AS text[]), CAST(:i AS int[]))"),
                {"t": array_literal(["x", "y"]), "i": array_literal([1, 2])},
            ).all()
    finally:
        eng.dispose()
    assert texts == AWKWARD
    assert ints == [0, -7, None]
    assert big == [2**40]
    assert [tuple(r) for r in rows] == [("x", 1), ("y", 2)]
