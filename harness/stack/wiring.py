"""What both providers do once the servers run: create the proxies, wait for each service through its proxy."""

from __future__ import annotations

import os
from collections.abc import Callable

from harness.errors import ConfigError
from harness.stack.base import Endpoints
from harness.stack.waits import Wait, openwire_answers, stomp_connected

START_TIMEOUT_S = float(os.environ.get("TXCHAOS_START_TIMEOUT", "90"))


def readiness(service: str, ep: Endpoints) -> Wait:
    """Return the wait that passes once ``service`` answers through its Toxiproxy proxy."""
    from harness.clients import db, kafka
    from harness.clients.dtm import DtmClient

    waits = {
        "postgres": Wait(
            "postgres through its proxy",
            lambda: db.ping(ep.postgres_url),
            timeout=START_TIMEOUT_S,
            tolerated=(Exception,),
        ),
        "activemq": Wait(
            "activemq STOMP and OpenWire through their proxies",
            _both(stomp_connected(ep.stomp.host, ep.stomp.port), _openwire(ep)),
            timeout=START_TIMEOUT_S,
        ),
        "kafka": Wait(
            "kafka metadata through its proxy",
            lambda: kafka.broker_ready(ep.kafka.address, 1.0),
            timeout=START_TIMEOUT_S,
            interval=0.2,
        ),
    }
    if ep.dtm is not None:
        waits["dtm"] = Wait(
            "dtm HTTP API through its proxy",
            DtmClient(ep.dtm.host, ep.dtm.port, timeout=1.0).answers,
            timeout=START_TIMEOUT_S,
            interval=0.05,
            fatal=("address already in use",),
        )
    if service not in waits:
        raise ConfigError(f"no readiness probe for {service!r}", hint=f"one of {', '.join(sorted(waits))}")
    return waits[service]


def _openwire(ep: Endpoints) -> Callable[[], bool]:
    if ep.openwire is None:  # an endpoints.json from before the connector: STOMP alone
        return lambda: True
    return openwire_answers(ep.openwire.host, ep.openwire.port)


def _both(first: Callable[[], bool], second: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: first() and second()


def create_proxies(ep: Endpoints) -> None:
    """Create, in the stack's Toxiproxy, the proxy in front of every service ``ep`` names."""
    from harness.clients.toxiproxy import ToxiproxyAdmin

    admin = ToxiproxyAdmin(ep.toxiproxy_api)
    for e in ep.proxied().values():
        admin.create(e.proxy, e.address, f"{e.upstream_host}:{e.upstream_port}")
