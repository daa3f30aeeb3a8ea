"""Stage handlers for tests/integration/test_exit_paths.py: a system under test that loses an order.

Imported by the worker processes (``tests.integration.exit_paths_handlers:drop``), which start in
the repository, as pytest does.
"""

from __future__ import annotations

from sqlalchemy import text

from harness.ledger.schema import Kind
from harness.worker.stage import StageContext


def drop(ctx: StageContext) -> None:
    """Apply the effect of every order; send on all but the numbers in ``options["drop"]``.

    A dropped order is committed and acked with nothing sent: it never comes out, and the
    verdict must say ``lost`` as soon as the flow is idle, not at the run's timeout.
    """
    ctx.db.execute(
        text("INSERT INTO onepc_effects (op_id, worker, amount) VALUES (:op, :w, :a)"),
        {"op": ctx.op, "w": ctx.worker, "a": int(ctx.body.get("amount", 1))},
    )
    ctx.record(Kind.EFFECT, table="onepc_effects")
    if int(ctx.body["n"]) not in set(ctx.options.get("drop", ())):
        ctx.send({"op": ctx.op, "from": ctx.stage})
