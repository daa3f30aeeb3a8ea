"""The stack a command runs on: the one already up, or one started for the command and stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from harness.cli.output import console
from harness.errors import TxChaosError

if TYPE_CHECKING:
    from harness.stack.base import Endpoints


def stack_alive(ep: Endpoints | None = None) -> bool:
    """Tell whether stack ``ep`` (default: the one `txchaos up` started) still answers (its Toxiproxy API)."""
    from harness.clients.toxiproxy import ToxiproxyAdmin
    from harness.stack.selection import load_current

    ep = ep or load_current()
    if ep is None:
        return False
    try:
        ToxiproxyAdmin(ep.toxiproxy_api).version()
    except TxChaosError:
        return False
    return True


@contextmanager
def running_stack(provider_name: str | None) -> Iterator[Endpoints]:
    """Yield the running stack (``$TXCHAOS_ENDPOINTS``, or the one `up` started), else one started for this command."""
    from harness.stack.selection import endpoints_from_env, load_current, make_provider

    endpoints = endpoints_from_env() or (load_current() if stack_alive() else None)
    if endpoints is not None:
        yield endpoints
        return
    provider = make_provider(provider_name)
    with console.status("starting a stack for this run (use `txchaos up` to keep one running)"):
        started = provider.start()
    try:
        yield started
    finally:
        provider.stop()
