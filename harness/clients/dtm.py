"""A small HTTP client for the DTM server's API (``/api/dtmsvr/...``), standard library only.

``http.client`` rather than urllib: it never routes through an ``http_proxy`` from the
environment, so a request goes exactly to the Toxiproxy address it is given.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlencode

from harness.errors import HarnessError

API = "/api/dtmsvr"


class DtmClient:
    """Call one DTM server at ``host:port`` (the proxy side).

    >>> DtmClient("127.0.0.1", 16789).new_gid()
    'K2e5avXhEr82yWGSZzPv48'
    """

    def __init__(self, host: str, port: int, *, timeout: float = 5.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout

    @property
    def url(self) -> str:
        """The server URL a DTM SDK takes (``DtmServer``)."""
        return f"http://{self.host}:{self.port}{API}"

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, **query: str) -> dict[str, Any]:
        """Send one request and return the JSON answer; raise HarnessError on a failure or non-2xx."""
        target = f"{API}/{path}" + (f"?{urlencode(query)}" if query else "")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, target, body=payload, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            raise HarnessError(f"DTM at {self.host}:{self.port} did not answer {method} {target}: {exc!r}") from exc
        finally:
            conn.close()
        if not 200 <= resp.status < 300:
            raise HarnessError(f"DTM answered {method} {target} with {resp.status}: {text[:300]}")
        try:
            answer = json.loads(text) if text else {}
        except ValueError as exc:
            raise HarnessError(f"DTM answered {method} {target} with non-JSON: {text[:300]!r}") from exc
        return dict(answer)

    def new_gid(self) -> str:
        return str(self.call("GET", "newGid")["gid"])

    def version(self) -> str:
        return str(self.call("GET", "version")["version"])

    def query(self, gid: str) -> dict[str, Any]:
        """Return ``{"transaction": ..., "branches": [...]}``; the transaction is null when unknown."""
        return self.call("GET", "query", gid=gid)

    def answers(self) -> bool:
        """Return True when the server hands out a gid (the readiness probe); never raise."""
        try:
            return bool(self.new_gid())
        except (HarnessError, KeyError):
            return False
