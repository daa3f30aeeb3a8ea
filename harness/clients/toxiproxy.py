"""The only module importing toxiproxy-python.

toxiproxy-python keeps the API address in class attributes (one server per process), so every
call here points it at this stack's server under a lock; two stacks in one process stay apart.
Its ``add_toxic`` works with Toxiproxy 2.12 for all seven toxic types (checked by
tests/integration/test_faults.py); its errors are plain ``Exception`` subclasses, so they are
turned into ``HarnessError`` here, and removing a toxic that is gone is not an error (healing
must be idempotent).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import requests
from toxiproxy import Toxiproxy as _Client
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from harness.errors import ConfigError, HarnessError

_LOCK = threading.RLock()


class ToxiproxyAdmin:
    """Create proxies, toggle them and manage toxics on one Toxiproxy server."""

    def __init__(self, api_url: str) -> None:
        parsed = urlparse(api_url)
        if not parsed.hostname or not parsed.port:
            raise ConfigError(
                f"bad Toxiproxy API URL {api_url!r}", hint="use http://HOST:PORT, e.g. http://127.0.0.1:8474"
            )
        self.api_url = api_url
        self._host, self._port = parsed.hostname, parsed.port

    @contextmanager
    def _client(self) -> Iterator[_Client]:
        with _LOCK:
            APIConsumer.host, APIConsumer.port = self._host, self._port
            try:
                yield _Client()
            except requests.RequestException as exc:
                raise HarnessError(f"Toxiproxy at {self.api_url} did not answer: {exc}") from exc
            except (InvalidToxic, NotFound, ProxyExists) as exc:
                raise HarnessError(
                    f"Toxiproxy at {self.api_url} refused the request: {_text(exc)}",
                    hint="check the toxic's attributes (whole numbers) and that its name is not in use",
                ) from exc

    def version(self) -> str:
        with self._client():
            return str(APIConsumer.get("/version").text)

    def create(self, name: str, listen: str, upstream: str) -> None:
        """Create (or replace) the proxy ``name`` from ``listen`` to ``upstream``."""
        with self._client() as client:
            client.populate([{"name": name, "listen": listen, "upstream": upstream}])

    def proxies(self) -> dict[str, dict[str, Any]]:
        """Return proxy name -> {listen, upstream, enabled, toxics}."""
        with self._client():
            raw: dict[str, dict[str, Any]] = APIConsumer.get("/proxies").json()
        return raw

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Enable or disable a proxy; disabled means every connection through it is cut (a partition)."""
        with self._client() as client:
            proxy = client.get_proxy(name)
            if proxy is None:
                raise HarnessError(f"no Toxiproxy proxy named {name!r} at {self.api_url}")
            proxy.enable() if enabled else proxy.disable()

    def add_toxic(
        self,
        proxy: str,
        *,
        type: str,
        name: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """Add a toxic (latency, bandwidth, slow_close, timeout, reset_peer, slicer, limit_data)."""
        with self._client() as client:
            p = client.get_proxy(proxy)
            if p is None:
                raise HarnessError(f"no Toxiproxy proxy named {proxy!r} at {self.api_url}")
            p.add_toxic(type=type, name=name, stream=stream, toxicity=toxicity, attributes=attributes or {})

    def remove_toxic(self, proxy: str, name: str) -> None:
        """Remove the toxic ``name`` from ``proxy``; a toxic or proxy already gone is fine."""
        with self._client() as client:
            p = client.get_proxy(proxy)
            if p is not None:
                # Gone already (a second heal, or a reset in between): healing is idempotent.
                with contextlib.suppress(NotFound):
                    p.destroy_toxic(name)

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        """Return the toxics on ``proxy`` as Toxiproxy reports them (name, type, stream, toxicity, attributes)."""
        found: list[dict[str, Any]] = self.proxies().get(proxy, {}).get("toxics", [])
        return found

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        with self._client() as client:
            client.reset()


def _text(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else exc
    return raw.decode(errors="replace").strip() if isinstance(raw, bytes) else str(raw)
