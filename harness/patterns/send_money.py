"""Send money through a non-transactional bank call, and catch the double deliveries.

The stage gets a payment order, asks the bank (``harness.patterns.bank``, a helper service)
to transfer, books the payment in its transaction and emits the outgoing message. The stage
transaction can roll the booking back, never the transfer.

- ``naive``: calls the bank on every delivery. When anything fails after the call (a crash, an
  unexpected exception), the booking rolls back and a redelivery calls the bank again: one
  transfer per delivery (duplicate-external-call).
- ``guarded``: the seed's operation-id state machine, on ``ctx.side`` (autocommit, outside the
  stage transaction). A delivery first claims the operation as CALLING, calls, then marks it
  DONE. A delivery that finds CALLING cannot know whether the bank executed the earlier call:
  it refuses and diverts the message to the DLQ with an alert, for a human to read the bank
  statement. One that finds DONE skips the call, books the payment if it is missing and
  re-emits. Any failure between the claim and DONE dead-letters with an alert too: once the
  request may have left, no way out of the stage leads to a second call.
- ``optimistic``: ``guarded`` that books and emits what it finds CALLING (a cover-up, for tests).

Options: ``bank_url`` (set by the run from ``Helper("bank", port=True)``); ``raise_after_call``,
operation numbers whose deliveries raise right after the call (the seed's untested "situation C").
The invariant (``violations``): never two transfers per operation; none only when the message
was dead-lettered and flagged; never a payment booked with no transfer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import text

from harness.clients.db import Connection, insert_once
from harness.ledger.schema import Kind
from harness.patterns import bank
from harness.worker.stage import StageContext

# The guarded stage's own crash points (after_external_call is a stage point of every stage).
POINTS = ("after_state_calling", "after_state_done")


class State(StrEnum):
    """The state of an operation id in ``payment_ops``; no row means never claimed."""

    CALLING = "calling"
    DONE = "done"


class Step(StrEnum):
    """What a delivery of the guarded stage does."""

    CALL = "call"  # it claimed the operation: call the bank
    REFUSE = "refuse"  # an earlier delivery called and never finished: in doubt
    COMPLETE = "complete"  # the transfer is made: skip the call, finish the bookkeeping


def step_for(found: State | None) -> Step:
    """Return the step of a delivery whose claim found ``found`` (None: this delivery claimed it)."""
    if found is None:
        return Step.CALL
    return Step.REFUSE if found is State.CALLING else Step.COMPLETE


def claim(side: Connection, op: str) -> tuple[Step, str | None]:
    """Claim ``op`` as CALLING unless a row exists; return the step and any known transfer id."""
    if insert_once(side, "payment_ops", {"op_id": op, "state": State.CALLING.value}):
        return step_for(None), None
    state, transfer_id = side.execute(
        text("SELECT state, transfer_id FROM payment_ops WHERE op_id = :op"), {"op": op}
    ).one()
    return step_for(State(state)), transfer_id


def mark_done(side: Connection, op: str, transfer_id: str) -> None:
    """Move ``op`` from CALLING to DONE with the bank's transfer id."""
    done = side.execute(
        text(
            "UPDATE payment_ops SET state = :d, transfer_id = :t, updated_at = now() WHERE op_id = :op AND state = :c"
        ),
        {"op": op, "t": transfer_id, "d": State.DONE.value, "c": State.CALLING.value},
    ).rowcount
    if done != 1:
        raise RuntimeError(f"operation {op} was not CALLING when its transfer {transfer_id} returned")


def release(side: Connection, op: str) -> None:
    """Forget the claim of ``op``: the request never reached the bank, so a replay may call."""
    side.execute(text("DELETE FROM payment_ops WHERE op_id = :op AND state = :c"), {"op": op, "c": State.CALLING.value})


class UnexpectedAfterCall(RuntimeError):
    """The bug right after the call that no test met (the seed's "situation C")."""


def _after_call(ctx: StageContext, transfer_id: str) -> None:
    if int(ctx.body.get("n", -1)) in ctx.options.get("raise_after_call", ()):
        raise UnexpectedAfterCall(f"situation C: failed right after transfer {transfer_id} of {ctx.op}")


def _order(ctx: StageContext) -> tuple[str, int]:
    url = ctx.options.get("bank_url")
    if not url:
        raise ValueError("no bank_url option: add Helper('bank', 'harness.patterns.bank:main', port=True) to the spec")
    return str(url), int(ctx.body.get("amount", 1))


def _book(ctx: StageContext, amount: int, transfer_id: str) -> None:
    ctx.db.execute(
        text("INSERT INTO payments (op_id, worker, amount, transfer_id) VALUES (:op, :w, :a, :t)"),
        {"op": ctx.op, "w": ctx.worker, "a": amount, "t": transfer_id},
    )
    ctx.record(Kind.EFFECT, table="payments", transfer=transfer_id)


def naive(ctx: StageContext) -> None:
    """Transfer, then book and emit, trusting the stage transaction to cover the call as well."""
    url, amount = _order(ctx)
    transfer_id = bank.transfer(url, ctx.op, amount)
    _after_call(ctx, transfer_id)
    ctx.crash_point("after_external_call")
    _book(ctx, amount, transfer_id)
    ctx.send({"op": ctx.op, "from": ctx.stage, "transfer": transfer_id})


def guarded(ctx: StageContext) -> None:
    """Claim the operation before the call; refuse a delivery that finds the call unfinished."""
    _state_machine(ctx, trust_unfinished=False)


def optimistic(ctx: StageContext) -> None:
    """Like ``guarded``, but assume an unfinished call went through: book and emit, no alert.

    The cover-up the seed warns against, kept to prove the invariant check sees what the
    verdict cannot: a payment booked and emitted that the bank never made.
    """
    _state_machine(ctx, trust_unfinished=True)


def _state_machine(ctx: StageContext, *, trust_unfinished: bool) -> None:
    url, amount = _order(ctx)
    step, transfer_id = claim(ctx.side, ctx.op)
    if step is Step.REFUSE and not trust_unfinished:
        ctx.dead_letter(
            f"in doubt: an earlier delivery of {ctx.op} called the bank and never finished; "
            "read the bank statement before replaying"
        )
        return
    if step is Step.CALL:
        ctx.crash_point("after_state_calling")
        try:
            transfer_id = bank.transfer(url, ctx.op, amount)
            _after_call(ctx, transfer_id)
        except bank.BankError as exc:
            if not exc.sent:
                release(ctx.side, ctx.op)
            ctx.dead_letter(f"{'in doubt' if exc.sent else 'not transferred'}: {exc}")
            return
        except Exception as exc:
            if transfer_id is not None:  # the bank answered: the transfer is made, a replay must not repeat it
                mark_done(ctx.side, ctx.op, transfer_id)
            ctx.dead_letter(f"failed after the bank call (transfer {transfer_id}): {exc!r}")
            return
        ctx.crash_point("after_external_call")
        mark_done(ctx.side, ctx.op, transfer_id)
        ctx.crash_point("after_state_done")
    else:
        reason = "transfer already made" if step is Step.COMPLETE else "an unfinished call assumed made"
        ctx.record(Kind.SKIP, reason=reason, transfer=transfer_id)
    booked = ctx.db.execute(text("SELECT 1 FROM payments WHERE op_id = :op LIMIT 1"), {"op": ctx.op}).first()
    if not booked:  # a rolled-back delivery made the transfer but lost its booking
        _book(ctx, amount, transfer_id or "unknown")
    ctx.send({"op": ctx.op, "from": ctx.stage, "transfer": transfer_id})


@dataclass(frozen=True)
class Outcome:
    """What became of one payment order, read from a run's ledger."""

    transfers: int  # EXTERNAL_CALL events: written by the bank, one per executed transfer
    booked: int  # rows of the payments table at the end of the run
    dead_letters: int
    alerts: int


def outcomes(events: Iterable[Mapping[str, Any]]) -> dict[str, Outcome]:
    """Return the outcome of every submitted operation of a ledger (rows as ``read_ledger`` gives)."""
    counts: dict[str, Counter[str]] = {}
    submitted: set[str] = set()
    for event in events:
        op = event.get("op")
        if op is None:
            continue
        counts.setdefault(op, Counter())[event["kind"]] += 1
        if event["kind"] == Kind.SUBMIT:
            submitted.add(op)
    return {
        op: Outcome(
            transfers=counts[op][Kind.EXTERNAL_CALL],
            booked=counts[op][Kind.RESIDUE_EFFECT],
            dead_letters=counts[op][Kind.DEAD_LETTER],
            alerts=counts[op][Kind.ALERT],
        )
        for op in sorted(submitted)
    }


def violations(by_op: Mapping[str, Outcome]) -> list[str]:
    """Return one line per operation that breaks the send-money invariant (see the module doc)."""
    out = []
    for op, o in sorted(by_op.items()):
        if o.transfers > 1:
            out.append(f"{op}: {o.transfers} transfers")
        elif o.transfers == 0 and not (o.dead_letters and o.alerts):
            flagged = "dead-lettered without an alert" if o.dead_letters else "not dead-lettered"
            out.append(f"{op}: no transfer, and {flagged}")
        if o.booked and not o.transfers:
            out.append(f"{op}: booked with no transfer")
    return out
