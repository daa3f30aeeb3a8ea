"""The per-test reset empties tables, purges tracked queues and topics, and heals the network."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from harness import Endpoints
from harness.clients import db, kafka
from harness.clients.activemq import StompClient
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.stack.reset import Resetter

pytestmark = [pytest.mark.integration, pytest.mark.activemq, pytest.mark.kafka]


def test_reset_empties_everything(txchaos_stack: Endpoints, txchaos_reset: Resetter) -> None:
    ep = txchaos_stack
    eng = db.engine(ep.postgres_url)
    db.apply_schema(eng, "onepc")
    with eng.begin() as conn:
        conn.execute(sa.text("INSERT INTO onepc_effects (op_id, worker, amount) VALUES ('x', 'w', 1)"))
    queue = f"txchaos.reset.{uuid.uuid4().hex[:8]}"
    with StompClient(ep.stomp.host, ep.stomp.port) as client:
        for i in range(25):
            client.send(queue, f"m{i}")
        client.abort(client.begin())  # receipt barrier: every SEND is in the broker
    topic = f"txchaos.reset.{uuid.uuid4().hex[:8]}"
    kafka.create_topics(ep.kafka.address, [topic], partitions=1)
    kafka.produce(ep.kafka.address, topic, [("k", "v")] * 5)
    proxies = ToxiproxyAdmin(ep.toxiproxy_api)
    proxies.add_toxic("postgres", type="latency", name="slow", attributes={"latency": 50})

    txchaos_reset.track_queues([queue])
    txchaos_reset.track_topics([topic])
    took = txchaos_reset.reset()

    assert db.column_values(eng, "onepc_effects", "op_id") == []
    assert all(not p["toxics"] for p in proxies.proxies().values())
    with StompClient(ep.stomp.host, ep.stomp.port) as client:
        client.subscribe(queue)
        assert client.receive(0.5) is None
    assert kafka.consume_all(ep.kafka.address, topic, expect=1, timeout=3) == []
    eng.dispose()
    print(f"reset took {took * 1000:.0f} ms")
