"""The barrier check-back against the real DTM server and real Postgres, both through Toxiproxy.

Services here are threads of the test process (the worker-process runner is not built yet): this
proves the check-back logic of harness.patterns.dtm_barrier, not crash behaviour.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import Engine, text

from harness import Endpoints
from harness.clients.db import apply_schema, engine
from harness.clients.dtm import DtmClient
from harness.patterns import dtm_barrier as barrier

pytestmark = [pytest.mark.integration, pytest.mark.dtm]


@pytest.fixture
def db(txchaos_stack: Endpoints) -> Iterator[Engine]:
    eng = engine(txchaos_stack.postgres_url)
    apply_schema(eng, "dtm_transfer")
    yield eng
    eng.dispose()


@pytest.fixture
def dtm(txchaos_stack: Endpoints) -> DtmClient:
    assert txchaos_stack.dtm is not None
    return DtmClient(txchaos_stack.dtm.host, txchaos_stack.dtm.port, timeout=2.0)


@pytest.fixture
def services(db: Engine) -> Iterator[str]:
    crashed: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, result: str) -> None:
            body = json.dumps({"dtm_result": result}).encode()
            self.send_response(200 if result == "SUCCESS" else 409)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # check-back: insert-ignore 'rollback', then read the reason
            gid = self.path.split("gid=")[1].split("&")[0]
            key = barrier.BarrierKey(gid)
            with db.begin() as conn:
                if not self.path.startswith("/check-naive"):  # the naive one only SELECTs
                    conn.execute(text(barrier.INSERT_IGNORE), key.params("rollback"))
                reason = conn.execute(text(barrier.SELECT_REASON), key.params("")).scalar()
            naive = self.path.startswith("/check-naive")
            answer = barrier.naive_checkback_answer(reason is not None) if naive else barrier.checkback_answer(reason)
            self._answer(answer)

        def do_POST(self) -> None:  # the credit branch
            gid = self.path.split("gid=")[1].split("&")[0]
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            guarded = "/credit-barrier" in self.path
            with db.begin() as conn:
                key = barrier.BarrierKey(gid, branch_id="01", op="action")
                if not guarded or conn.execute(text(barrier.INSERT_IGNORE), key.params("action")).rowcount == 1:
                    conn.execute(text("INSERT INTO dtm_credits (op_id, gid, amount) VALUES (:g, :g, 30)"), {"g": gid})
            if "crash-once" in self.path and gid not in crashed:  # committed, then no answer: DTM retries
                crashed.add(gid)
                self._answer("ONGOING")
                return
            self._answer("SUCCESS")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _wait_status(dtm: DtmClient, gid: str, want: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    status = None
    while time.monotonic() < deadline:
        trans = dtm.query(gid).get("transaction")
        status = None if trans is None else trans["status"]
        if status == want:
            return
        time.sleep(0.3)
    raise AssertionError(f"{gid}: status {status!r}, wanted {want!r}")


def _count(db: Engine, table: str, gid: str) -> int:
    with db.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE gid = :g"), {"g": gid}).scalar_one())


def test_committed_but_not_submitted_is_delivered_once(dtm: DtmClient, db: Engine, services: str) -> None:
    gid = f"it-{uuid.uuid4().hex[:12]}"
    dtm.call("POST", "prepare", barrier.msg_body(gid, f"{services}/credit", {}, checkback_url=f"{services}/check"))
    with db.begin() as conn:  # debit + barrier, then "crash": no submit
        conn.execute(text("INSERT INTO dtm_debits (op_id, gid, amount) VALUES (:g, :g, 30)"), {"g": gid})
        assert conn.execute(text(barrier.INSERT_IGNORE), barrier.BarrierKey(gid).params("msg")).rowcount == 1
    _wait_status(dtm, gid, "succeed")
    assert (_count(db, "dtm_debits", gid), _count(db, "dtm_credits", gid)) == (1, 1)


def test_not_committed_is_rolled_back_by_the_check_back(dtm: DtmClient, db: Engine, services: str) -> None:
    gid = f"it-{uuid.uuid4().hex[:12]}"
    dtm.call("POST", "prepare", barrier.msg_body(gid, f"{services}/credit", {}, checkback_url=f"{services}/check"))
    _wait_status(dtm, gid, "failed")
    with db.begin() as conn:  # the late local transaction loses the claim and must roll back
        assert conn.execute(text(barrier.INSERT_IGNORE), barrier.BarrierKey(gid).params("msg")).rowcount == 0
    assert (_count(db, "dtm_debits", gid), _count(db, "dtm_credits", gid)) == (0, 0)


def test_naive_check_back_loses_a_late_commit(dtm: DtmClient, db: Engine, services: str) -> None:
    gid = f"it-{uuid.uuid4().hex[:12]}"
    naive = barrier.msg_body(gid, f"{services}/credit", {}, checkback_url=f"{services}/check-naive")
    dtm.call("POST", "prepare", naive)
    with db.begin() as conn:  # in progress while DTM checks back: the SELECT sees nothing
        conn.execute(text("INSERT INTO dtm_debits (op_id, gid, amount) VALUES (:g, :g, 30)"), {"g": gid})
        assert conn.execute(text(barrier.INSERT_IGNORE), barrier.BarrierKey(gid).params("msg")).rowcount == 1
        _wait_status(dtm, gid, "failed")
    # committed after the check: a debit without a credit (the anomaly the runner must name "lost")
    assert (_count(db, "dtm_debits", gid), _count(db, "dtm_credits", gid)) == (1, 0)


@pytest.mark.parametrize(("path", "credits"), [("credit-barrier", 1), ("credit", 2)])
def test_branch_retried_after_its_commit(dtm: DtmClient, db: Engine, services: str, path: str, credits: int) -> None:
    gid = f"it-{uuid.uuid4().hex[:12]}"
    body = barrier.msg_body(gid, f"{services}/{path}?crash-once=1", {}, checkback_url=f"{services}/check")
    dtm.call("POST", "prepare", body)
    with db.begin() as conn:
        conn.execute(text(barrier.INSERT_IGNORE), barrier.BarrierKey(gid).params("msg"))
    dtm.call("POST", "submit", body)
    _wait_status(dtm, gid, "succeed")
    assert _count(db, "dtm_credits", gid) == credits
