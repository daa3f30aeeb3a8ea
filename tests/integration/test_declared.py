"""Declared effects and invariants against the real Postgres of a local stack (issue 15).

``declared.check`` runs each declaration once, read-only, and refuses a bad one with the statement
and the fix; ``declared.snapshot`` evaluates them on the final state. The deposit handlers of
``patterns/bank.py`` run here on real Postgres transactions (a redelivery after the commit is a
second committed transaction of the same message); only their outgoing message is kept in a list,
no broker is claimed to be exercised.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness import Endpoints
from harness.clients import db
from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.patterns import bank, kafka_saga
from harness.stack.reset import Resetter
from harness.verify import declared
from harness.verify.checker import check_run
from harness.verify.model import FlowContract, Invariant

pytestmark = pytest.mark.integration

BALANCE = Invariant("balance", bank.BALANCE_SQL, label=bank.BALANCE_LABEL)
CONTRACT = FlowContract(expects_downstream=False, effect_sql=bank.DEPOSIT_EFFECT_SQL, invariants=(BALANCE,))


@pytest.fixture
def engine(txchaos_stack: Endpoints, txchaos_reset: Resetter) -> Iterator[sa.Engine]:
    eng = db.engine(txchaos_stack.postgres_url)
    db.apply_schema(eng, "deposits")
    yield eng
    eng.dispose()


@dataclass
class _Context:
    """A stage context on a real transaction; what the handler sends is kept in ``sent``."""

    op: str
    body: dict[str, Any]
    db: sa.Connection
    options: dict[str, Any] = field(default_factory=dict)
    worker: str = "worker-0"
    stage: str = "deposits"
    topic: str = "input"
    sent: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    recorded: list[Kind] = field(default_factory=list)

    @property
    def side(self) -> sa.Connection:
        raise AssertionError("the deposit handlers use no side connection")

    def send(self, body: dict[str, Any], dest: str | None = None, *, key: str | None = None) -> None:
        self.sent.append((body, dest))

    def record(self, kind: Kind, **detail: Any) -> None:
        self.recorded.append(kind)

    def crash_point(self, name: str) -> None:
        pass

    def dead_letter(self, reason: str) -> None:
        raise AssertionError(reason)


def _deliver(eng: sa.Engine, handler: Callable[[Any], None], op: str, amount: int) -> None:
    with eng.begin() as conn:  # one delivery: the stage's transaction, committed
        handler(_Context(op, {"amount": amount}, conn))


def _close_books(tmp: Path, eng: sa.Engine, ops: dict[str, int]) -> list[str]:
    """Write the run's books as the run layer does: submissions, the effect table, the declared residue."""
    (tmp / "manifest.json").write_text(json.dumps({"complete": True, "contract": {}}))
    with LedgerWriter(tmp / "ledger", "driver") as d:
        for op in ops:
            d.emit(Kind.SUBMIT, op=op)
        for op in db.column_values(eng, "deposits", "op_id"):
            d.emit(Kind.RESIDUE_EFFECT, op=op, dest="deposits")
        return declared.snapshot(eng, CONTRACT, d, list(ops))


@pytest.mark.parametrize("fixed", [False, True], ids=["deposit_upsert", "deposit_once"])
def test_a_redelivered_deposit_is_caught_by_the_declared_checks_only_when_applied_twice(
    engine: sa.Engine, tmp_path: Path, fixed: bool
) -> None:
    declared.check(engine, CONTRACT)
    handler = bank.deposit_once if fixed else bank.deposit_upsert
    ops = {"op-1": 400, "op-2": 40, "op-3": 560}
    for op, amount in ops.items():
        _deliver(engine, handler, op, amount)
    _deliver(engine, handler, "op-2", 40)  # redelivered after its commit (a crash before the ack)
    steps = _close_books(tmp_path, engine, ops)
    assert check_run(tmp_path, FlowContract(expects_downstream=False)).clean  # one row per deposit either way
    v = check_run(tmp_path, CONTRACT)
    if fixed:
        assert v.clean, v.headline()
        assert steps[-1] == "invariant balance: accounts.balance of main = 1000, expected 1000"
        return
    assert v.found() == {"duplicate-effect": 1, "invariant-broken": 1}
    assert v.ops("duplicate-effect") == {"op-2"}
    assert "accounts.balance of main = 1,040, expected 1,000: op op-2 applied more than once" in v.headline()


BAD = [
    ("SELEC op_id, 1 AS applied FROM deposits", "syntax error", "fix the SQL"),
    ("SELECT op_id, 1 AS applied FROM deposit", 'relation "deposit" does not exist', "scenario's schema"),
    ("SELECT op_id, amount FROM deposits", r"returns columns \(op_id, amount\), not \(op_id, applied\)", "aliased"),
    ("SELECT op_id, 'x' AS applied FROM deposits", "is not an integer", "whole units"),
    ("UPDATE deposits SET credited = 0 RETURNING op_id, credited AS applied", "read-only transaction", "only reads"),
    ("DO $$ BEGIN PERFORM 1; END $$", "returns no rows", "declare a query"),
]


@pytest.mark.parametrize(("sql", "said", "fix"), BAD, ids=[b[1][:20] for b in BAD])
def test_a_bad_declared_effect_is_refused_before_the_run(engine: sa.Engine, sql: str, said: str, fix: str) -> None:
    with pytest.raises(ConfigError, match=said) as info:
        declared.check(engine, FlowContract(effect_sql=sql))
    assert sql in str(info.value)  # the statement is named
    assert fix in (info.value.hint or "")


def test_a_bad_invariant_is_refused_with_its_name(engine: sa.Engine) -> None:
    op_scoped = Invariant("net", "SELECT sum(balance) AS actual, 0 AS expected FROM accounts", scope="op")
    with pytest.raises(ConfigError, match=r"invariant 'net' \(op\) returns columns \(actual, expected\)"):
        declared.check(engine, FlowContract(invariants=(op_scoped,)))
    declared.check(engine, CONTRACT)  # the good declarations pass, and nothing was written by checking
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM deposits")).scalar_one() == 0


SAGA_NET = Invariant("saga-net", kafka_saga.SAGA_NET_SQL, scope="op", label=kafka_saga.SAGA_NET_LABEL)


def _run_saga(eng: sa.Engine, saga: str, refuse: str | None, compensate: bool) -> None:
    """Carry one saga through the orchestrator and the inbox participants, each record one committed
    transaction on real Postgres; the records between them are routed here instead of by Kafka."""
    options = {"payment_topic": "payments", "seat_topic": "seats", "resend": False, "compensate": compensate}
    pending: list[tuple[dict[str, Any], str | None]] = [
        ({"type": "start", "op": saga, "amount": 100, "refuse": refuse}, None)
    ]
    while pending:
        body, dest = pending.pop(0)
        handler = kafka_saga.orchestrator if dest is None else kafka_saga.participant_inbox
        op = saga if dest is None else f"{saga}.{body['step']}"
        with eng.begin() as conn:
            ctx = _Context(op, body, conn, options=options, topic=dest or "orchestrator")
            handler(ctx)
        pending += ctx.sent


@pytest.mark.parametrize("compensate", [False, True], ids=["marks-compensated", "refunds"])
def test_a_saga_compensated_without_its_refund_breaks_only_the_net_zero_invariant(
    txchaos_stack: Endpoints, txchaos_reset: Resetter, tmp_path: Path, compensate: bool
) -> None:
    eng = db.engine(txchaos_stack.postgres_url)
    db.apply_schema(eng, "kafka_saga")
    contract = FlowContract(expects_downstream=False, invariants=(SAGA_NET,))
    declared.check(eng, contract)
    _run_saga(eng, "saga-1", "seat", compensate)  # the seat is refused: the payment must be refunded
    _run_saga(eng, "saga-2", None, compensate)
    with eng.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT saga_id, state FROM sagas")).all())
        rows = conn.execute(sa.text("SELECT op_id, count(*) FROM saga_payments GROUP BY 1 ORDER BY 1")).all()
    # every saga final, every step's row there once: the row-level checks have nothing to catch
    assert states == {"saga-1": "compensated", "saga-2": "completed"}
    assert {op: n for op, n in rows} == {"saga-1.pay": 1, "saga-2.pay": 1} | (
        {"saga-1.refund": 1} if compensate else {}
    )
    (tmp_path / "manifest.json").write_text(json.dumps({"complete": True, "contract": {}}))
    with LedgerWriter(tmp_path / "ledger", "driver") as d:
        for saga, state in states.items():
            d.emit(Kind.SUBMIT, op=saga)
            d.emit(Kind.RESIDUE_EFFECT, op=saga, dest="sagas", state=state)  # final: as the saga run books it
        logged: list[str] = []
        declared.snapshot(eng, contract, d, list(states), step=logged.append)
    eng.dispose()
    assert logged == [f"invariant saga-net: {0 if compensate else 1} of 2 operations broken"]
    assert check_run(tmp_path, FlowContract(expects_downstream=False)).clean
    v = check_run(tmp_path, contract)
    if compensate:
        assert v.clean, v.headline()
        return
    assert v.found() == {"invariant-broken": 1}
    assert v.broken_promises() == ["invariant-broken: net payment of the saga = 100, expected 0 for op saga-1"]
