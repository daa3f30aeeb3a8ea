"""A transfer by DTM 2-phase message: the business service and the credit branch, as helper processes.

``service`` serves ``POST /transfer {"op", "amount", "hold_s"}`` (the driver's requests) and
``GET /checkback?gid=...`` (DTM's check-back). A transfer is the seed's DoAndSubmitDB: prepare
the message at DTM, debit with the barrier row (reason ``msg``) in one local transaction,
commit, submit. ``branch`` serves DTM's ``POST /credit?gid=...``: the credit, guarded by its own
barrier row unless ``options["barrier"]`` is false. Both run as worker processes the harness
kills at named points and restarts on the same port; DTM calls them directly, their calls to DTM
go through the ``dtm`` proxy (where the faults are).

Ledger events, per operation (the DTM gid is ``<op>.<run tag>``, in ``msg``):

- service: ``deliver`` (request in), ``prepare`` (DTM took it), ``effect`` (debit written),
  ``db_commit`` then ``submit`` (the debit committed: the message now exists, whatever DTM
  knows), ``broker_commit`` (DTM took the submit), ``db_rollback`` (the check-back claimed the
  barrier first), ``error`` (a call or the local transaction failed; its outcome is resolved
  as the check-back would, or left to DTM's check-back);
- check-back: ``broker_commit`` (answered SUCCESS, by="checkback") or ``abort_prepared``
  (answered FAILURE);
- branch: ``deliver``, ``effect`` (credit written), ``skip`` (its barrier found a retry),
  ``db_commit``.

``checkback="naive"`` only SELECTs the barrier row (the bug): a local transaction still open
when DTM asks is answered FAILURE, then commits: a debit whose message DTM has dropped. A
request's ``hold_s`` makes its local transaction that long one: it stays open until DTM checks
it back (then commits ``CHECKED_GRACE_S`` later), or ``hold_s`` at most.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sqlalchemy import text

from harness.clients import db
from harness.clients.dtm import DtmClient
from harness.errors import ConfigError, HarnessError
from harness.ledger.schema import Kind
from harness.patterns.bank import reply_json, serve_until_stopped
from harness.patterns.dtm_barrier import (
    CHECKBACK_SUCCESS,
    INSERT_IGNORE,
    SELECT_REASON,
    BarrierKey,
    checkback_answer,
    msg_body,
    naive_checkback_answer,
)
from harness.worker.process import ProcessContext

# The service's points, in the order a transfer passes them, then the branch's.
SERVICE_POINTS = ("after_prepare", "before_local_commit", "after_local_commit", "after_submit")
BRANCH_POINTS = ("branch_before_commit", "branch_after_commit")
POINTS = (*SERVICE_POINTS, *BRANCH_POINTS)
CHECKBACKS = ("barrier", "naive")
BRANCH_ID = "01"  # DTM numbers a message's steps 01, 02, ...
# A held transaction commits this long after its check-back began: the check-back's own
# statements (a SELECT, or an insert that then waits on the row lock) take milliseconds.
CHECKED_GRACE_S = 0.3

DEBIT = "INSERT INTO dtm_debits (op_id, gid, amount) VALUES (:op, :gid, :amount)"
CREDIT = "INSERT INTO dtm_credits (op_id, gid, amount) VALUES (:op, :gid, :amount)"


def gid_of(op: str, tag: str) -> str:
    """Return the DTM gid of ``op`` in the run tagged ``tag`` (gids must not repeat across runs)."""
    return f"{op}.{tag}"


def op_of(gid: str) -> str:
    """Return the operation id inside a gid made by ``gid_of``."""
    return gid.rsplit(".", 1)[0]


def check_back(engine: db.Engine, gid: str, *, naive: bool) -> str:
    """Decide a prepared message: SUCCESS (the local transaction committed) or FAILURE.

    The barrier form claims the row with reason ``rollback`` first: the insert waits on the
    row lock of a local transaction still in progress, and once it wins, that transaction can
    never commit its own row. The naive form only reads.
    """
    key = BarrierKey(gid)
    with engine.begin() as conn:
        if not naive:
            conn.execute(text(INSERT_IGNORE), key.params("rollback"))
        reason = conn.execute(text(SELECT_REASON), key.params("")).scalar()
    return naive_checkback_answer(reason is not None) if naive else checkback_answer(reason)


def money(engine: db.Engine) -> tuple[int, int]:
    """Return (debited, credited): the sums of the committed debits and credits."""
    with engine.connect() as conn:
        debited = conn.execute(text("SELECT coalesce(sum(amount), 0) FROM dtm_debits")).scalar_one()
        credited = conn.execute(text("SELECT coalesce(sum(amount), 0) FROM dtm_credits")).scalar_one()
    return int(debited), int(credited)


def _dtm_reply(handler: BaseHTTPRequestHandler, result: str) -> None:
    # DTM reads 200 as SUCCESS and 409 as FAILURE; anything else is retried later.
    reply_json(handler, 200 if result == CHECKBACK_SUCCESS else 409, {"dtm_result": result})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[tuple[str, str], Callable[[BaseHTTPRequestHandler, dict[str, str], bytes], None]]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        route = self.server.routes.get((method, url.path))
        if route is None:
            reply_json(self, 404, {"error": f"no route {method} {url.path}"})
            return
        try:
            route(self, query, body)
        except Exception as exc:  # the caller (driver or DTM) retries or gives up; never kill the server
            reply_json(self, 500, {"error": repr(exc)})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(ctx: ProcessContext, routes: dict[Any, Any], cleanup: Callable[[], None]) -> None:
    server = _Server(("127.0.0.1", int(ctx.options["port"])), _Handler)
    server.routes = routes
    serve_until_stopped(ctx, server, cleanup)


class _Refused(Exception):
    """The check-back claimed the barrier first: this local transaction must not commit."""


def service(ctx: ProcessContext) -> None:
    """Serve the business service (transfers and the check-back) until the harness stops it."""
    opts = ctx.options
    checkback = str(opts.get("checkback", "barrier"))
    if checkback not in CHECKBACKS:
        raise ConfigError(f"checkback={checkback!r}", hint=f"use one of {', '.join(CHECKBACKS)}")
    naive = checkback == "naive"
    tag, interval = str(opts["gid_tag"]), int(opts.get("interval_s", 2))
    branch_url, own_url = str(opts["branch_url"]), f"http://127.0.0.1:{opts['port']}"
    ep = ctx.endpoints.dtm
    if ep is None:
        raise HarnessError("this stack has no DTM server", hint="start a new stack: `txchaos down && txchaos up`")
    dtm = DtmClient(ep.host, ep.port, timeout=3.0)
    engine = db.engine(ctx.endpoints.postgres_url, pool_size=6)
    # gid -> set when DTM first checks it back: a held local transaction waits for that.
    checked: dict[str, threading.Event] = {}

    def resolve(op: str, gid: str, body: dict[str, Any]) -> str:
        """After a local transaction failed for an unknown reason, decide as the check-back would."""
        answer = check_back(engine, gid, naive=naive)
        if answer == CHECKBACK_SUCCESS:  # it committed after all (an ambiguous commit)
            ctx.record(Kind.SUBMIT, op=op, msg=gid, dest="dtm", by="resolve")
            dtm.call("POST", "submit", body)
            ctx.record(Kind.BROKER_COMMIT, op=op, msg=gid, dest="dtm", by="resolve")
            return "submitted"
        ctx.record(Kind.ABORT_PREPARED, op=op, msg=gid, dest="dtm", by="resolve")
        dtm.call("POST", "abort", {"gid": gid, "trans_type": "msg"})
        return "aborted"

    def transfer(handler: BaseHTTPRequestHandler, _: dict[str, str], raw: bytes) -> None:
        req = json.loads(raw)
        op, amount, hold = str(req["op"]), int(req["amount"]), float(req.get("hold_s", 0))
        gid = gid_of(op, tag)
        ctx.record(Kind.DELIVER, op=op, msg=gid, dest="transfer", attempt=1)
        payload = {"op": op, "amount": amount}
        body = msg_body(gid, f"{branch_url}/credit", payload, checkback_url=f"{own_url}/checkback", interval_s=interval)
        try:
            dtm.call("POST", "prepare", body)
        except HarnessError as exc:  # nothing done yet: the transfer is refused (DTM may still check back)
            ctx.record(Kind.ERROR, op=op, msg=gid, dest="dtm", error=f"prepare: {exc}")
            reply_json(handler, 503, {"result": "not prepared", "error": str(exc)})
            return
        ctx.record(Kind.PREPARE, op=op, msg=gid, dest="dtm")
        ctx.crash_point("after_prepare", op=op, msg=gid)
        try:
            with engine.begin() as conn:
                conn.execute(text(DEBIT), {"op": op, "gid": gid, "amount": amount})
                if conn.execute(text(INSERT_IGNORE), BarrierKey(gid).params("msg")).rowcount != 1:
                    raise _Refused
                ctx.record(Kind.EFFECT, op=op, msg=gid, dest="dtm_debits", amount=amount)
                # A long local transaction: still open when DTM checks back (hold_s at most).
                if hold and checked.setdefault(gid, threading.Event()).wait(hold):
                    time.sleep(CHECKED_GRACE_S)
                ctx.crash_point("before_local_commit", op=op, msg=gid)
        except _Refused:
            ctx.record(Kind.DB_ROLLBACK, op=op, msg=gid, dest="dtm_debits", why="the check-back claimed the barrier")
            reply_json(handler, 409, {"result": "rolled back"})
            return
        except Exception as exc:  # rolled back, or committed with the answer lost: resolve() tells
            ctx.record(Kind.ERROR, op=op, msg=gid, dest="dtm_debits", error=f"local transaction: {exc!r}")
            try:
                result = resolve(op, gid, body)
            except Exception as again:  # DTM's own check-back decides later
                ctx.record(Kind.ERROR, op=op, msg=gid, error=f"resolve: {again!r}")
                result = "unresolved"
            reply_json(handler, 503, {"result": result, "error": repr(exc)})
            return
        ctx.record(Kind.DB_COMMIT, op=op, msg=gid, dest="dtm_debits")
        ctx.record(Kind.SUBMIT, op=op, msg=gid, dest="dtm")
        ctx.crash_point("after_local_commit", op=op, msg=gid)
        try:
            dtm.call("POST", "submit", body)
            ctx.record(Kind.BROKER_COMMIT, op=op, msg=gid, dest="dtm")
        except HarnessError as exc:  # committed: the check-back will answer SUCCESS
            ctx.record(Kind.ERROR, op=op, msg=gid, dest="dtm", error=f"submit: {exc}")
        ctx.crash_point("after_submit", op=op, msg=gid)
        reply_json(handler, 200, {"result": "committed"})

    def checkback_route(handler: BaseHTTPRequestHandler, query: dict[str, str], _: bytes) -> None:
        gid = query["gid"]
        op = op_of(gid)
        checked.setdefault(gid, threading.Event()).set()
        answer = check_back(engine, gid, naive=naive)
        kind = Kind.BROKER_COMMIT if answer == CHECKBACK_SUCCESS else Kind.ABORT_PREPARED
        ctx.record(kind, op=op, msg=gid, dest="dtm", by="checkback", answer=answer)
        _dtm_reply(handler, answer)

    routes = {("POST", "/transfer"): transfer, ("GET", "/checkback"): checkback_route}
    _serve(ctx, routes, engine.dispose)


def branch(ctx: ProcessContext) -> None:
    """Serve the credit branch until the harness stops it; ``options["barrier"]`` guards retries."""
    guarded = bool(ctx.options.get("barrier", True))
    engine = db.engine(ctx.endpoints.postgres_url, pool_size=4)

    def credit(handler: BaseHTTPRequestHandler, query: dict[str, str], raw: bytes) -> None:
        gid = query["gid"]
        payload = json.loads(raw)
        op, amount = str(payload["op"]), int(payload["amount"])
        ctx.record(Kind.DELIVER, op=op, msg=gid, dest="credit")
        with engine.begin() as conn:
            key = BarrierKey(gid, branch_id=query.get("branch_id", BRANCH_ID), op="action")
            if guarded and conn.execute(text(INSERT_IGNORE), key.params("action")).rowcount != 1:
                ctx.record(Kind.SKIP, op=op, msg=gid, dest="dtm_credits", why="barrier row exists: a retry")
            else:
                conn.execute(text(CREDIT), {"op": op, "gid": gid, "amount": amount})
                ctx.record(Kind.EFFECT, op=op, msg=gid, dest="dtm_credits", amount=amount)
            ctx.crash_point("branch_before_commit", op=op, msg=gid)
        ctx.record(Kind.DB_COMMIT, op=op, msg=gid, dest="dtm_credits")
        ctx.crash_point("branch_after_commit", op=op, msg=gid)
        _dtm_reply(handler, CHECKBACK_SUCCESS)

    _serve(ctx, {("POST", "/credit"): credit}, engine.dispose)
