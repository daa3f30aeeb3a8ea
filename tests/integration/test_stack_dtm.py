"""The DTM server of the real stack: reached only through its proxy, and it survives kill -9.

The check-back endpoint is a small HTTP server in this test process: DTM calls it directly (the
proxy fronts DTM's own API, which is where the harness injects faults).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness import Endpoints
from harness.clients.dtm import DtmClient
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.faults import KillBroker, active

pytestmark = [pytest.mark.integration, pytest.mark.dtm]


@pytest.fixture
def dtm(txchaos_stack: Endpoints) -> DtmClient:
    assert txchaos_stack.dtm is not None, "this stack has no DTM server: start a new one"
    return DtmClient(txchaos_stack.dtm.host, txchaos_stack.dtm.port, timeout=2.0)


class _CheckBack(BaseHTTPRequestHandler):
    """Answers every check-back with FAILURE (409): the local transaction rolled back."""

    calls: list[str]

    def do_GET(self) -> None:
        self.calls.append(self.path)
        body = json.dumps({"dtm_result": "FAILURE", "message": "rolled back"}).encode()
        self.send_response(409)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def check_back() -> Iterator[tuple[str, list[str]]]:
    calls: list[str] = []
    handler = type("Handler", (_CheckBack,), {"calls": calls})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="dtm-check-back", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()


def _status(dtm: DtmClient, gid: str) -> str | None:
    trans = dtm.query(gid).get("transaction")
    return None if trans is None else str(trans["status"])


def test_dtm_answers_through_its_proxy(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin, dtm: DtmClient) -> None:
    ep = txchaos_stack.dtm
    assert ep is not None
    route = proxies.proxies()[ep.proxy]
    assert route["listen"].endswith(f":{ep.port}")
    assert route["upstream"] == f"{ep.upstream_host}:{ep.upstream_port}"
    assert ep.port != ep.upstream_port
    assert dtm.version() == "v1.19.0"
    assert dtm.url == txchaos_stack.dtm_url


def test_disabling_the_dtm_proxy_breaks_the_client(proxies: ToxiproxyAdmin, dtm: DtmClient) -> None:
    assert dtm.answers(), "dtm should answer through its proxy"
    proxies.set_enabled("dtm", False)
    assert not dtm.answers(), "dtm still answers with its proxy disabled: a client bypasses Toxiproxy"
    proxies.set_enabled("dtm", True)
    assert dtm.answers()


def test_kill9_and_restart_keep_a_prepared_message(
    txchaos_stack: Endpoints, dtm: DtmClient, check_back: tuple[str, list[str]]
) -> None:
    url, calls = check_back
    gid = f"txchaos-it-{uuid.uuid4().hex[:12]}"
    prepared_at = time.monotonic()
    dtm.call(
        "POST",
        "prepare",
        {
            "gid": gid,
            "trans_type": "msg",
            "steps": [{"action": f"{url}/action"}],
            "payloads": ["{}"],
            "query_prepared": f"{url}/query",
            # Per-message timings: the first poll, ~2 s after prepare, already finds it timed out and
            # checks back. (The server's own floor is 10 s, and the embedded store re-polls at that.)
            "retry_interval": 2,
            "timeout_to_fail": 2,
        },
    )
    assert _status(dtm, gid) == "prepared"
    with active(KillBroker("dtm").on(txchaos_stack)) as fault:
        assert not dtm.answers(), "dtm answers after kill -9"
    assert fault.restart_s is not None
    assert fault.restart_s < 5
    assert _status(dtm, gid) == "prepared", "the prepared message did not survive kill -9 (embedded store)"
    deadline = time.monotonic() + 15
    while _status(dtm, gid) != "failed" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _status(dtm, gid) == "failed", f"no check-back turned the message failed; check-backs: {calls}"
    took = time.monotonic() - prepared_at
    assert took < 8, f"the check-back came {took:.1f} s after prepare: the per-message timings were not used"
    assert len(calls) == 1
    assert all(c.startswith("/query?") and f"gid={gid}" in c for c in calls)
    assert dtm.answers()
