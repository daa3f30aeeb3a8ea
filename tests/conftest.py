"""Fixtures the unit and integration tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.stack.base import Endpoints


@pytest.fixture
def proxies(txchaos_stack: Endpoints) -> Iterator[ToxiproxyAdmin]:
    """Yield the stack's Toxiproxy admin, every proxy reset afterwards (healed even when a test failed half-way)."""
    admin = ToxiproxyAdmin(txchaos_stack.toxiproxy_api)
    try:
        yield admin
    finally:
        admin.reset()
