"""A bank the send-money stage calls over HTTP: it executes every transfer it is told to.

``POST /transfers {"op": ..., "amount": ...}`` -> ``201 {"transfer_id": "T<n>"}``. The bank books
each transfer as a row of ``bank_transfers`` (autocommit; no constraint on ``op_id``: a bank
executes what it is told) and writes an ``EXTERNAL_CALL`` ledger event with the op id, so the
verdict counts transfers the bank really made, not calls a stage meant to make. The stage side
(``transfer``) must therefore not record the call itself.

Crash points: ``bank_before_transfer`` (the request arrived, nothing executed) and
``bank_after_transfer`` (executed, the answer never sent). Either way the caller sees a dropped
connection and cannot tell them apart; the supervisor restarts the bank on the same port.

The bank's own stage handlers credit deposits to its ``main`` account (``fixtures/sql/deposits.sql``,
issue 15): ``deposit_upsert`` (bad) books a deposit with an upsert that adds the amount again on a
redelivery and moves the balance in place, so a redelivery after the commit applies it twice and
adds no row: the row count is clean, the declared effect (``DEPOSIT_EFFECT_SQL``) and the balance
invariant (``BALANCE_SQL``) are not. ``deposit_once`` (fixed) moves the balance only when its
insert created the deposit.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import text

from harness.clients import db
from harness.ledger.schema import Kind
from harness.worker.base import HandlerContext
from harness.worker.process import ProcessContext

POINTS = ("bank_before_transfer", "bank_after_transfer")

# The deposits' promises as SQL (a scenario declares them on its FlowContract): how many times each
# deposit was credited, and the account's balance against the deposits' amounts counted once.
DEPOSIT_EFFECT_SQL = "SELECT op_id, credited / amount AS applied FROM deposits"
BALANCE_SQL = (
    "SELECT coalesce((SELECT balance FROM accounts WHERE id = 'main'), 0) AS actual, "
    "(SELECT coalesce(sum(amount), 0) FROM deposits)::bigint AS expected"
)
BALANCE_LABEL = "accounts.balance of main"

# (op, amount) -> the bank's transfer id. The transfer is executed when this returns.
Execute = Callable[[str, int], str]


class BankError(Exception):
    """The transfer call failed. ``sent`` False: the request never reached the bank (nothing done).

    ``sent`` True: the bank got the request and may or may not have executed it (in doubt).
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Handler(BaseHTTPRequestHandler):
    server: BankServer

    def do_POST(self) -> None:
        if self.path != "/transfers":
            self._reply(404, {"error": f"no such resource {self.path}; POST /transfers"})
            return
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            op, amount = str(request["op"]), int(request["amount"])
        except (ValueError, KeyError, TypeError) as exc:
            self._reply(400, {"error": f"bad transfer request: {exc!r}"})
            return
        self._reply(201, {"transfer_id": self.server.execute(op, amount)})

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        reply_json(self, status, body)


def reply_json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    """Answer the request ``handler`` serves with ``status`` and ``body`` as JSON."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class BankServer(ThreadingHTTPServer):
    """The bank's HTTP front on ``127.0.0.1:port`` (0: any free port), executing with ``execute``."""

    daemon_threads = True

    def __init__(self, port: int, execute: Execute) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.execute = execute

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def transfer(url: str, op: str, amount: int, *, timeout_s: float = 5.0, connect_for_s: float = 15.0) -> str:
    """Ask the bank at ``url`` to transfer ``amount`` for ``op``; return its transfer id.

    A refused connection is retried for ``connect_for_s`` (the request never left: safe to
    retry, and the bank may be restarting). Anything else raises ``BankError``. A killed bank is
    back in well under a second; the window is wide because a busy CI machine must not turn a
    restart into a "not transferred" that skips the very bank crash a scenario armed next.
    """
    body = json.dumps({"op": op, "amount": amount}).encode()
    deadline = time.monotonic() + connect_for_s
    while True:
        request = urllib.request.Request(
            f"{url}/transfers", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return str(json.loads(response.read())["transfer_id"])
        except urllib.error.HTTPError as exc:  # the bank answered: a 4xx refuses, a 5xx leaves it in doubt
            raise BankError(f"transfer {op}: the bank answered HTTP {exc.code}", sent=exc.code >= 500) from exc
        except urllib.error.URLError as exc:  # raised while connecting or sending
            if isinstance(exc.reason, ConnectionRefusedError):
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise BankError(f"the bank at {url} refused connections for {connect_for_s}s", sent=False) from exc
            raise BankError(f"transfer {op}: {exc.reason!r} while sending; in doubt", sent=True) from exc
        except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:  # while waiting for the answer
            raise BankError(f"transfer {op}: {exc!r} before the bank answered; in doubt", sent=True) from exc


def main(ctx: ProcessContext) -> None:
    """Serve the bank on ``ctx.options["port"]`` until the harness stops it."""
    engine = db.engine(ctx.endpoints.postgres_url, pool_size=4, autocommit=True)

    def execute(op: str, amount: int) -> str:
        ctx.crash_point("bank_before_transfer", op=op)
        with engine.connect() as conn:
            row_id = conn.execute(
                text("INSERT INTO bank_transfers (op_id, amount) VALUES (:op, :a) RETURNING id"),
                {"op": op, "a": amount},
            ).scalar_one()
        transfer_id = f"T{row_id}"
        ctx.record(Kind.EXTERNAL_CALL, op=op, dest="bank", transfer=transfer_id, amount=amount)
        ctx.crash_point("bank_after_transfer", op=op)
        return transfer_id

    serve_until_stopped(ctx, BankServer(int(ctx.options["port"]), execute), engine.dispose)


def serve_until_stopped(ctx: ProcessContext, server: ThreadingHTTPServer, cleanup: Callable[[], None]) -> None:
    """Serve ``server`` on a thread, say the process is ready, and until it is stopped; then close, then ``cleanup``."""
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    ctx.ready()
    try:
        while not ctx.stopping.wait(0.2):
            pass
    finally:
        server.shutdown()
        server.server_close()
        cleanup()


def _credit(ctx: HandlerContext, amount: int) -> None:
    # one row for the account whatever it was credited: the run's reset empties every table
    ctx.db.execute(
        text(
            "INSERT INTO accounts (id, balance) VALUES ('main', :a) "
            "ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance"
        ),
        {"a": amount},
    )
    ctx.record(Kind.EFFECT, table="deposits", amount=amount)


def deposit_upsert(ctx: HandlerContext) -> None:
    """Credit the deposit, adding the amount again if it is booked already (the bug: one row, twice the money)."""
    amount = int(ctx.body.get("amount", 1))
    ctx.db.execute(
        text(
            "INSERT INTO deposits (op_id, worker, amount, credited) VALUES (:op, :w, :a, :a) "
            "ON CONFLICT (op_id) DO UPDATE SET credited = deposits.credited + EXCLUDED.amount, updated_at = now()"
        ),
        {"op": ctx.op, "w": ctx.worker, "a": amount},
    )
    _credit(ctx, amount)
    ctx.send({"op": ctx.op, "from": ctx.stage})


def deposit_once(ctx: HandlerContext) -> None:
    """Credit the deposit only if this delivery booked it; a redelivery skips and re-emits."""
    amount = int(ctx.body.get("amount", 1))
    row = {"op_id": ctx.op, "worker": ctx.worker, "amount": amount, "credited": amount}
    if db.insert_once(ctx.db, "deposits", row):
        _credit(ctx, amount)
    else:
        ctx.record(Kind.SKIP, table="deposits", reason="deposit already credited")
    ctx.send({"op": ctx.op, "from": ctx.stage})
