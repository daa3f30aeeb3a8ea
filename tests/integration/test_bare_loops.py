"""The bare loops of the soak benchmark (``harness.bench.bare``) on a real stack, at a small size.

Each loop checks its own result (it raises unless every message left one effect); these tests
run them end to end through Toxiproxy, look at the effect count they report, that the clock
starts at the producer's first send (a soak's starts at its first submission), and that they
leave no table or topic behind. No timing is asserted: the machine is shared.
"""

from __future__ import annotations

import pytest

from harness.bench.bare import bare_activemq, bare_kafka
from harness.bench.bare_loop import pg_run
from harness.bench.cpu import CpuMeter
from harness.clients.kafka import admin
from harness.stack.base import Endpoints

pytestmark = [pytest.mark.integration]


def _bare_tables(ep: Endpoints) -> set[str]:
    rows = pg_run(ep, True, r"SELECT tablename FROM pg_tables WHERE tablename LIKE 'bare\_%'")
    return {str(name) for (name,) in rows}


def _bare_topics(ep: Endpoints) -> set[str]:
    return {t for t in admin(ep.kafka.address).list_topics(timeout=10).topics if t.startswith("txchaos.bare.")}


@pytest.mark.activemq
def test_bare_activemq_loop_applies_each_message_once(txchaos_stack: Endpoints) -> None:
    before = _bare_tables(txchaos_stack)
    with CpuMeter() as meter:
        result = bare_activemq(txchaos_stack, messages=500, workers=2)
    assert (result.flow, result.messages, result.effects, result.workers) == ("activemq", 500, 500, 2)
    # The soak benchmark's CPU table: the loop names its processes, the meter finds the stack's.
    assert sorted(role for _, role in result.roles) == ["driver", "driver", "workers", "workers"]
    used = meter.usage().by_role(dict(result.roles))
    assert all(used.get(role, 0) > 0 for role in ("workers", "driver", "ActiveMQ", "Postgres", "Toxiproxy")), used
    assert result.via_proxy
    assert result.seconds >= result.consume_seconds > 0, "the clock starts at the first send, before any consuming"
    assert _bare_tables(txchaos_stack) == before, "the loop left its effect table behind"


@pytest.mark.activemq
def test_bare_activemq_loop_on_the_stages_own_clients_applies_each_message_once(txchaos_stack: Endpoints) -> None:
    """The loop on stomp.py and SQLAlchemy (what the soak benchmark reads each soak against too)."""
    before = _bare_tables(txchaos_stack)
    result = bare_activemq(txchaos_stack, messages=500, workers=2, clients="libraries")
    assert (result.messages, result.effects, result.clients) == (500, 500, "libraries")
    assert _bare_tables(txchaos_stack) == before, "the loop left its effect table behind"
    with pytest.raises(ValueError, match="clients='psycopg'"):
        bare_activemq(txchaos_stack, messages=10, clients="psycopg")


@pytest.mark.kafka
def test_bare_kafka_loop_applies_each_record_once(txchaos_stack: Endpoints) -> None:
    tables, topics = _bare_tables(txchaos_stack), _bare_topics(txchaos_stack)
    result = bare_kafka(txchaos_stack, messages=5000)
    assert (result.flow, result.messages, result.effects, result.workers) == ("kafka", 5000, 5000, 1)
    assert result.via_proxy
    assert result.seconds >= result.consume_seconds > 0, "the clock starts at the first record, before any polling"
    assert _bare_tables(txchaos_stack) == tables, "the loop left its inbox or effect table behind"
    assert _bare_topics(txchaos_stack) == topics, "the loop left its topics behind"
