"""The real stack: every client path goes through Toxiproxy, and cutting the proxy cuts the client."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from harness import Endpoints
from harness.clients import db, kafka
from harness.clients.activemq import StompClient
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import HarnessError
from harness.stack.local import LocalProvider
from harness.stack.waits import stomp_connected

pytestmark = pytest.mark.integration


def _stomp_ok(ep: Endpoints) -> bool:
    try:
        return stomp_connected(ep.stomp.host, ep.stomp.port)()
    except OSError:
        return False


def _pg_ok(ep: Endpoints) -> bool:
    try:
        return db.ping(ep.postgres_url)
    except Exception:
        return False


def _kafka_ok(ep: Endpoints) -> bool:
    return kafka.broker_ready(ep.kafka.address, timeout=2.0)


@pytest.mark.parametrize(
    ("proxy", "probe"),
    [("activemq_stomp", _stomp_ok), ("postgres", _pg_ok), pytest.param("kafka", _kafka_ok, marks=pytest.mark.kafka)],
)
def test_disabling_the_proxy_breaks_the_client(
    txchaos_stack: Endpoints, proxies: ToxiproxyAdmin, proxy: str, probe: Callable[[Endpoints], bool]
) -> None:
    assert probe(txchaos_stack), f"{proxy} should answer through its proxy"
    proxies.set_enabled(proxy, False)
    assert not probe(txchaos_stack), f"{proxy} still answers with its proxy disabled: a client bypasses Toxiproxy"
    proxies.set_enabled(proxy, True)
    assert probe(txchaos_stack)


def test_endpoints_are_proxies(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    routes = proxies.proxies()
    for ep in (txchaos_stack.postgres, txchaos_stack.stomp, txchaos_stack.kafka):
        route = routes[ep.proxy]
        assert route["listen"].endswith(f":{ep.port}")
        assert route["upstream"] == f"{ep.upstream_host}:{ep.upstream_port}"
        assert ep.port != ep.upstream_port


@pytest.mark.kafka
def test_kafka_advertises_its_proxy_and_round_trips(txchaos_stack: Endpoints) -> None:
    assert kafka.advertised(txchaos_stack.kafka.address) == [txchaos_stack.kafka.address]
    topic = f"txchaos.it.{uuid.uuid4().hex[:8]}"
    kafka.create_topics(txchaos_stack.kafka.address, [topic], partitions=1)
    values = [(f"k{i}", f"v{i}") for i in range(20)]
    assert kafka.produce(txchaos_stack.kafka.address, topic, values) == 20
    assert sorted(kafka.consume_all(txchaos_stack.kafka.address, topic, expect=20)) == sorted(values)


@pytest.mark.activemq
def test_stomp_transaction_round_trip(txchaos_stack: Endpoints) -> None:
    ep = txchaos_stack.stomp
    q = f"txchaos.it.{uuid.uuid4().hex[:8]}"
    with StompClient(ep.host, ep.port) as client:
        tx = client.begin()
        client.send(q, "aborted", transaction=tx)
        client.abort(tx)
        tx = client.begin()
        client.send(q, "committed", transaction=tx)
        client.commit(tx)
        client.subscribe(q)
        msg = client.receive(5)
        assert msg is not None
        assert msg.body == "committed"
        client.ack(msg)
        assert client.receive(0.5) is None  # the aborted SEND was discarded


@pytest.mark.activemq
def test_proxy_cut_is_seen_by_a_live_stomp_client(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    ep = txchaos_stack.stomp
    client = StompClient(ep.host, ep.port)
    try:
        proxies.set_enabled("activemq_stomp", False)

        def use_until_broken() -> None:
            for _ in range(50):  # heart-beats (1 s) notice the cut connection
                client.receive(0.1)
                client.send("txchaos.it.cut", "x")

        with pytest.raises(HarnessError):
            use_until_broken()
    finally:
        client.close()


def test_two_stacks_side_by_side(txchaos_stack: Endpoints) -> None:
    with LocalProvider() as other:
        mine = {txchaos_stack.postgres.port, txchaos_stack.stomp.port, txchaos_stack.kafka.port}
        theirs = {other.postgres.port, other.stomp.port, other.kafka.port}
        assert not mine & theirs
        for ep in (other, txchaos_stack):
            assert _pg_ok(ep)
            assert _stomp_ok(ep)
