"""A poison message that crashes its consumer, every time (Mats3 seed: redeliveries).

A message that kills the consumer process (a native crash, an out-of-memory, a stack overflow)
never gets a NACK: the broker sees a dropped connection and redelivers at once, to the next
consumer, which dies too. Without the broker's redelivery plugin nothing counts those deliveries
(BROKER_FACTS.md), so the message is never dead-lettered and blocks its consumers forever.

- ``crashing``: processes orders, dies on a poison one  -> never-dead-lettered-poison (and stuck)
- ``attempt_counter``: counts deliveries per operation on a separate autocommit connection,
  before any work, and diverts the message to the DLQ with an alert after ``max_attempts``.
"""

from __future__ import annotations

import os
import signal

from sqlalchemy import text

from harness.clients.db import count_attempt
from harness.ledger.schema import Kind
from harness.worker.stage import StageContext

DEFAULT_MAX_ATTEMPTS = 3


def _process(ctx: StageContext) -> None:
    if ctx.body.get("poison"):
        # What a crash in a native library looks like from outside: the process is just gone.
        ctx.record(Kind.CRASH, point="poison", worker=ctx.worker)
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.db.execute(text("INSERT INTO poison_effects (op_id, worker) VALUES (:op, :w)"), {"op": ctx.op, "w": ctx.worker})
    ctx.record(Kind.EFFECT, table="poison_effects")
    ctx.send({"op": ctx.op, "from": ctx.stage})


def crashing(ctx: StageContext) -> None:
    """Process the order; a poison message kills the worker on every delivery."""
    _process(ctx)


def attempt_counter(ctx: StageContext) -> None:
    """Count this delivery outside the transaction first; divert after ``max_attempts`` deliveries."""
    limit = int(ctx.options.get("max_attempts", DEFAULT_MAX_ATTEMPTS))
    attempts = count_attempt(ctx.side, "poison_attempts", "attempts", ctx.op)
    if attempts > limit:
        ctx.dead_letter(f"poison: delivered {attempts} times, the limit is {limit}")
        return
    _process(ctx)
