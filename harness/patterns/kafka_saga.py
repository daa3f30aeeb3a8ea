"""A saga over Kafka request/response topics: an orchestrator and two participants (seed: Kafka saga).

Three Kafka stages (``harness.worker.kafka_stage``), each a worker process:

- ``orchestrator`` consumes its inbox topic: the driver's saga starts and the participants'
  replies (and, with ``dlt_replies``, the participants' dead-letter topics). Saga state lives in
  Postgres (``sagas``): ``paying`` -> ``reserving`` -> ``completed``; a refused seat ->
  ``refunding`` -> ``compensated``; a refused payment -> ``compensated``. A reply that does not
  fit the saga's state (a participant's duplicate) is skipped. Each record it handles is kept in
  ``saga_inbox`` with the request it decided to send: the same record delivered again (the
  orchestrator died after its DB commit, before the request went out) re-sends that request.
  Without it (``resend=False``) that record finds its saga moved on, is skipped, and the
  saga waits for a reply to a request never sent (``stuck``).
- ``payment`` (steps ``pay`` and ``refund``) and ``seat`` (step ``seat``) consume their request
  topic, write the step's effect and decision in one Postgres transaction and reply on the
  orchestrator's inbox. A refusal (``refuse`` in the request) is a semantic error reply,
  recorded as the step's decision. A transient error (the first ``fail_times`` attempts, counted
  outside the transaction) is retried with exponential backoff, then dead-lettered (``-dlt``).

How a participant guards a step (``SagaOptions.participant``), under a crash after its DB
commit and before its reply is produced (Kafka redelivers the request: its offset was not
committed):

- ``participant_naive``: applies it again -> the step's effect twice (``duplicate-effect`` on
  ``<saga>.pay``); the saga still completes.
- ``participant_unique``: the step's unique key refuses the redelivery; the error is retried,
  then the request dead-lettered, and no reply ever comes: without ``dlt_replies`` the saga
  waits forever (``stuck`` on the saga, ``dead-lettered-with-effect`` on the step).
- ``participant_inbox``: claims the step's id with its effect; a redelivery skips the effect and
  replies with the stored decision -> clean (with the reply in a Kafka transaction with the
  offset, or after the DB commit: the inbox is what makes the step idempotent).

The saga's promise as an invariant (issue 15, ``SAGA_NET_SQL``, scope ``op``): a completed saga
charged its amount once, a compensated one nets zero. ``compensate=False`` (the bad orchestrator)
marks a saga whose seat was refused compensated without sending the refund: every row is there
once and every saga is final, so only the invariant sees the money kept.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from harness.clients.db import count_attempt
from harness.ledger.schema import Kind
from harness.patterns.saga_options import FINAL_STATES, step_op
from harness.worker.kafka_context import KafkaContext

EFFECT_TABLES = {"pay": "saga_payments", "refund": "saga_payments", "seat": "saga_seats"}

# Per final saga: what its payment steps moved (a refund row is negative) against what it owes.
SAGA_NET_SQL = (
    "SELECT s.saga_id AS op_id, coalesce(sum(p.amount) FILTER (WHERE p.status = 'ok'), 0)::bigint AS actual, "
    "(CASE WHEN s.state = 'completed' THEN s.amount ELSE 0 END)::bigint AS expected "
    "FROM sagas s LEFT JOIN saga_payments p ON p.saga_id = s.saga_id "
    "WHERE s.state IN ('completed', 'compensated') GROUP BY s.saga_id, s.state, s.amount"
)
SAGA_NET_LABEL = "net payment of the saga"


class TransientStepError(Exception):
    """A participant's step failed for a passing reason (retried with backoff, then dead-lettered)."""


# -- the orchestrator ----------------------------------------------------------------------------
def _request(ctx: KafkaContext, saga: str, step: str, row: dict[str, Any]) -> dict[str, Any]:
    """Return the request ``step`` of ``saga`` (topic, key, body), as the orchestrator sends it."""
    topic = ctx.options["payment_topic"] if step in ("pay", "refund") else ctx.options["seat_topic"]
    body = {
        "type": "request",
        "saga": saga,
        "step": step,
        "amount": int(row["amount"]),
        "refuse": row["refuse"] == step,
        "fail_times": int(row["fail_times"]) if step == "seat" else 0,
    }
    return {"topic": str(topic), "key": step_op(saga, step), "body": body}


# (state, step, status) -> (next state, the request to send next or None)
TRANSITIONS: dict[tuple[str, str, str], tuple[str, str | None]] = {
    ("paying", "pay", "ok"): ("reserving", "seat"),
    ("paying", "pay", "failed"): ("compensated", None),
    ("reserving", "seat", "ok"): ("completed", None),
    ("reserving", "seat", "failed"): ("refunding", "refund"),
    ("refunding", "refund", "ok"): ("compensated", None),
}


def _decide(ctx: KafkaContext) -> dict[str, Any] | None:
    """Apply this record to its saga's state; return the request to send, if any."""
    body = ctx.body
    if body.get("type") == "start":
        saga = str(body["op"])
        row = {"amount": int(body.get("amount", 1)), "refuse": body.get("refuse"), "fail_times": 0}
        row["fail_times"] = int(body.get("fail_times", 0))
        started = ctx.db.execute(
            text(
                "INSERT INTO sagas (saga_id, state, amount, refuse, fail_times) VALUES (:s, 'paying', :a, :r, :f) "
                "ON CONFLICT DO NOTHING RETURNING 1"
            ),
            {"s": saga, "a": row["amount"], "r": row["refuse"], "f": row["fail_times"]},
        ).first()
        if started is None:
            ctx.record(Kind.SKIP, table="sagas", reason="saga already started")
            return None
        ctx.record(Kind.EFFECT, table="sagas", saga=saga, state="paying")
        return _request(ctx, saga, "pay", row)
    saga, step = str(body["saga"]), str(body["step"])
    # A request back from a dead-letter topic: the participant gave up on it, the step failed.
    dead = ctx.topic.endswith("-dlt")
    status = "failed" if dead else str(body["status"])
    found = ctx.db.execute(
        text("SELECT state, amount, refuse, fail_times FROM sagas WHERE saga_id = :s FOR UPDATE"), {"s": saga}
    ).first()
    move = TRANSITIONS.get((str(found[0]), step, status)) if found is not None else None
    if found is None or move is None:
        state = found[0] if found is not None else None
        ctx.record(Kind.SKIP, table="sagas", saga=saga, state=state, step=step, status=status, reason="stale reply")
        return None
    state, next_step = move
    if next_step == "refund" and not ctx.options.get("compensate", True):  # the cover-up: no refund sent
        state, next_step = "compensated", None
    ctx.db.execute(
        text("UPDATE sagas SET state = :st, updated_at = now() WHERE saga_id = :s"), {"st": state, "s": saga}
    )
    ctx.record(Kind.EFFECT, table="sagas", saga=saga, state=state, step=step, status=status, dead_lettered=dead)
    if next_step is None:
        return None
    row = {"amount": found[1], "refuse": found[2], "fail_times": found[3]}
    return _request(ctx, saga, next_step, row)


def orchestrator(ctx: KafkaContext) -> None:
    """Move a saga on by one record (a start or a reply); send the request that follows."""
    if not ctx.options.get("resend", True):  # the naive orchestrator: no record of what it sent
        req = _decide(ctx)
        if req is not None:
            ctx.send(req["body"], req["topic"], key=req["key"])
        return
    coords = {"t": ctx.topic, "p": ctx.partition, "o": ctx.offset}
    fresh = ctx.db.execute(
        text(
            'INSERT INTO saga_inbox (topic, part, "offset", op_id) VALUES (:t, :p, :o, :op) '
            "ON CONFLICT DO NOTHING RETURNING 1"
        ),
        {**coords, "op": ctx.op},
    ).first()
    if fresh is None:
        # This very record was handled before: its request may never have left. Send it again
        # (the participant's inbox drops a second copy).
        emitted = ctx.db.execute(
            text('SELECT emitted FROM saga_inbox WHERE topic = :t AND part = :p AND "offset" = :o'), coords
        ).scalar()
        ctx.record(Kind.SKIP, table="saga_inbox", reason="record already handled", resend=emitted is not None)
        if emitted is not None:
            req = json.loads(emitted)
            ctx.send(req["body"], req["topic"], key=req["key"])
        return
    req = _decide(ctx)
    if req is None:
        return
    ctx.db.execute(
        text('UPDATE saga_inbox SET emitted = :e WHERE topic = :t AND part = :p AND "offset" = :o'),
        {**coords, "e": json.dumps(req)},
    )
    ctx.send(req["body"], req["topic"], key=req["key"])


# -- the participants ----------------------------------------------------------------------------
def _transient(ctx: KafkaContext) -> None:
    """Fail the first ``fail_times`` attempts of this step (counted outside its transaction)."""
    fail_times = int(ctx.body.get("fail_times", 0))
    if fail_times <= 0:
        return
    n = count_attempt(ctx.side, "saga_attempts", "n", ctx.op)
    if n <= fail_times:
        raise TransientStepError(f"{ctx.op}: seat service unavailable (attempt {n} of {fail_times} failing)")


def _apply(ctx: KafkaContext, status: str) -> None:
    step = str(ctx.body["step"])
    table = EFFECT_TABLES[step]
    amount = int(ctx.body.get("amount", 1))
    ctx.db.execute(
        text(f"INSERT INTO {table} (op_id, saga_id, action, status, amount) VALUES (:op, :s, :a, :st, :am)"),
        {"op": ctx.op, "s": ctx.body["saga"], "a": step, "st": status, "am": -amount if step == "refund" else amount},
    )
    ctx.record(Kind.EFFECT, table=table, step=step, status=status)


def _reply(ctx: KafkaContext, status: str) -> None:
    ctx.send({"type": "reply", "saga": ctx.body["saga"], "step": ctx.body["step"], "status": status})


def _status(ctx: KafkaContext) -> str:
    return "failed" if ctx.body.get("refuse") else "ok"


def participant_naive(ctx: KafkaContext) -> None:
    """Apply the step and reply, trusting each request to arrive once."""
    _transient(ctx)
    status = _status(ctx)
    _apply(ctx, status)
    _reply(ctx, status)


def participant_unique(ctx: KafkaContext) -> None:
    """Apply the step under a unique key on its id: a redelivered request fails on it."""
    _transient(ctx)
    status = _status(ctx)
    ctx.db.execute(text("INSERT INTO saga_decisions (op_id, status) VALUES (:op, :st)"), {"op": ctx.op, "st": status})
    _apply(ctx, status)
    _reply(ctx, status)


def participant_inbox(ctx: KafkaContext) -> None:
    """Claim the step's id with its effect; a redelivery replies with the stored decision."""
    status = _status(ctx)
    claimed = ctx.db.execute(
        text("INSERT INTO saga_decisions (op_id, status) VALUES (:op, :st) ON CONFLICT DO NOTHING RETURNING 1"),
        {"op": ctx.op, "st": status},
    ).first()
    if claimed is None:
        stored = ctx.db.execute(text("SELECT status FROM saga_decisions WHERE op_id = :op"), {"op": ctx.op}).scalar()
        ctx.record(Kind.SKIP, table="saga_decisions", reason="step already applied", status=stored)
        _reply(ctx, str(stored))
        return
    _transient(ctx)  # after the claim: its rollback releases the claim for the retry
    _apply(ctx, status)
    _reply(ctx, status)


def is_final(state: str | None) -> bool:
    """Return whether a saga in ``state`` is over."""
    return state in FINAL_STATES
