"""Wire-level traps on a real client process and the real stack: the commit gap as a deterministic crash point.

Each test puts a ``TrapProxy`` in front of a Toxiproxy proxy, starts ``traps_client`` (its own
process, a real driver) against the trap, and checks the databases and brokers afterwards: never the
client's word. ``committed OP`` on the client's stdout, or its second act (``trap_after`` row,
``.after`` message), would mean it learned of the commit; a trap in the window leaves neither.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness import procfs
from harness.clients import db, kafka
from harness.clients.activemq import StompClient
from harness.stack.base import Endpoints
from harness.traps import Firing, Freeze, Kill, Trap, TrapProxy, TrapSet

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SIGKILL_RC = -9


class Client:
    """The ``traps_client`` process the traps kill; ``pid`` is what ``Kill`` signals."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.env, self.args = env, args
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Client:
        """Start the process (after arming: a trap armed late could miss the first commit)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.traps_client", *self.args],
            cwd=ROOT,
            env={**_base_env(), **self.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return self

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        assert self.proc is not None
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.proc.kill()
        return self.proc.returncode, out, err


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("TRAP_")}


def _pg_url(ep: Endpoints, address: tuple[str, int]) -> str:
    return f"postgresql+psycopg://{ep.db_user}:{ep.db_password}@{address[0]}:{address[1]}/{ep.db_name}"


@pytest.fixture
def tables(txchaos_stack: Endpoints) -> Iterator[sa.Engine]:
    eng = db.engine(txchaos_stack.postgres_url, autocommit=True)
    with eng.connect() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS trap_effects, trap_after")
        conn.exec_driver_sql("CREATE TABLE trap_effects (op text PRIMARY KEY)")
        conn.exec_driver_sql("CREATE TABLE trap_after (op text PRIMARY KEY)")
    try:
        yield eng
    finally:
        with eng.connect() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS trap_effects, trap_after")
        eng.dispose()


def _rows(eng: sa.Engine, table: str) -> set[str]:
    with eng.connect() as conn:
        return {r[0] for r in conn.exec_driver_sql(f"SELECT op FROM {table}")}


def _pg_run(ep: Endpoints, point: str, op: str, *ops: str) -> tuple[int, str, list[Firing]]:
    traps = TrapSet()
    with TrapProxy("postgres", (ep.postgres.host, ep.postgres.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
        client = Client({"TRAP_PG_URL": _pg_url(ep, proxy.address)}, "pg", *ops)
        traps.arm(Trap(point, Kill(client.pid), op=op))
        rc, out, _ = client.start().finish()
    return rc, out, traps.firings


def test_pg_after_commit_kill_leaves_the_row_committed_and_the_client_unaware(
    txchaos_stack: Endpoints, tables: sa.Engine
) -> None:
    rc, out, firings = _pg_run(txchaos_stack, "pg_after_commit", "op-b", "op-a", "op-b", "op-c")
    assert rc == SIGKILL_RC
    assert [(f.point, f.op) for f in firings] == [("pg_after_commit", "op-b")]
    assert out.split("\n")[:-1] == ["committed op-a"]  # op-b's COMMIT confirmation never reached it
    assert _rows(tables, "trap_effects") == {"op-a", "op-b"}  # ... yet op-b is committed
    assert _rows(tables, "trap_after") == {"op-a"}


def test_pg_before_commit_kill_commits_nothing(txchaos_stack: Endpoints, tables: sa.Engine) -> None:
    rc, out, firings = _pg_run(txchaos_stack, "pg_before_commit", "op-b", "op-a", "op-b")
    assert rc == SIGKILL_RC
    assert [f.op for f in firings] == ["op-b"]
    assert out.split("\n")[:-1] == ["committed op-a"]
    assert _rows(tables, "trap_effects") == {"op-a"}  # the held COMMIT never reached Postgres


def test_pg_before_commit_freeze_holds_the_commit_until_thaw(txchaos_stack: Endpoints, tables: sa.Engine) -> None:
    ep = txchaos_stack
    traps = TrapSet()
    with TrapProxy("postgres", (ep.postgres.host, ep.postgres.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
        client = Client({"TRAP_PG_URL": _pg_url(ep, proxy.address)}, "pg", "op-a")
        traps.arm(Trap("pg_before_commit", Freeze(client.pid), op="op-a"))
        client.start()
        _wait(lambda: traps.firings != [] and procfs.state(client.pid()) == "T")
        time.sleep(0.5)  # frozen: its COMMIT stays held, whatever the time
        assert _rows(tables, "trap_effects") == set()
        assert traps.thaw() == 1
        rc, out, err = client.finish()
    assert rc == 0, err
    assert out == "committed op-a\n"  # the held COMMIT went on after the thaw
    assert _rows(tables, "trap_effects") == {"op-a"}


def _wait(cond: Callable[[], bool], timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_pg_after_commit_fires_in_the_window_every_time(txchaos_stack: Endpoints) -> None:
    """100 armed traps, one client process each, all "committed, and the client never knew" (issue 16).

    ``txchaos bench traps`` measures the same and writes the figure to docs/benchmarks.md.
    """
    from harness.bench.traps import window

    assert window(txchaos_stack, 100) == 100


def test_stomp_after_commit_kill_commits_at_the_broker_unknown_to_the_client(txchaos_stack: Endpoints) -> None:
    ep = txchaos_stack
    q = f"txchaos.traps.{uuid.uuid4().hex[:8]}"
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as feeder:
        for op in ("op-a", "op-b"):
            feeder.send(q, op, headers={"txchaos-op": op})
    traps = TrapSet()
    with TrapProxy("stomp", (ep.stomp.host, ep.stomp.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
        client = Client({"TRAP_STOMP": f"{proxy.address[0]}:{proxy.address[1]}"}, "stomp", q, "op-a", "op-b")
        traps.arm(Trap("stomp_after_commit", Kill(client.pid), op="op-b"))
        rc, out, err = client.start().finish()
    assert rc == SIGKILL_RC, err
    assert out.split("\n")[:-1] == ["committed op-a"]
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as reader:
        assert sorted(m.body for m in _drain(reader, q + ".out")) == ["op-a", "op-b"]  # op-b committed
        assert [m.body for m in _drain(reader, q + ".after")] == ["op-a"]
        assert list(_drain(reader, q)) == []  # its ACK committed too: no redelivery


def test_stomp_before_commit_kill_rolls_the_transaction_back(txchaos_stack: Endpoints) -> None:
    ep = txchaos_stack
    q = f"txchaos.traps.{uuid.uuid4().hex[:8]}"
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as feeder:
        feeder.send(q, "op-a", headers={"txchaos-op": "op-a"})
    traps = TrapSet()
    with TrapProxy("stomp", (ep.stomp.host, ep.stomp.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
        client = Client({"TRAP_STOMP": f"{proxy.address[0]}:{proxy.address[1]}"}, "stomp", q, "op-a")
        traps.arm(Trap("stomp_before_commit", Kill(client.pid), op="op-a"))
        rc, out, _ = client.start().finish()
    assert rc == SIGKILL_RC
    assert out == ""
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as reader:
        assert list(_drain(reader, q + ".out")) == []
        assert [m.body for m in _drain(reader, q)] == ["op-a"]  # the ACK rolled back: redelivered


def _drain(client: StompClient, q: str) -> Iterator[object]:
    from harness.clients.activemq import drain

    return drain(client, [q], idle_s=1.0, max_s=10)


def _produce_killed_on_op_b(ep: Endpoints, mode: str, point: str) -> str:
    """Produce op-a, op-b through a Kafka trap proxy that kills the client at ``point`` on op-b; return the topic."""
    topic = f"txchaos-traps-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(ep.kafka.address, [topic], partitions=1)
    traps = TrapSet()
    with TrapProxy("kafka", (ep.kafka.host, ep.kafka.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
        client = Client({"TRAP_KAFKA": f"{proxy.address[0]}:{proxy.address[1]}"}, mode, topic, "op-a", "op-b")
        traps.arm(Trap(point, Kill(client.pid), op="op-b"))
        rc, out, err = client.start().finish()
    assert rc == SIGKILL_RC, err
    assert out.split("\n")[:-1] == ["committed op-a"]
    return topic


@pytest.mark.kafka
def test_kafka_after_produce_kill_leaves_the_record_written_and_every_connection_trapped(
    txchaos_stack: Endpoints,
) -> None:
    ep = txchaos_stack
    topic = _produce_killed_on_op_b(ep, "kafka", "kafka_after_produce")
    values = [v for _, v in kafka.consume_all(ep.kafka.address, topic, expect=2, timeout=20)]
    assert values == ['{"op": "op-a"}', '{"op": "op-b"}']  # the produce the client never saw acknowledged


@pytest.mark.kafka
def test_kafka_before_end_txn_kill_never_commits_the_transaction(txchaos_stack: Endpoints) -> None:
    ep = txchaos_stack
    topic = _produce_killed_on_op_b(ep, "kafka-txn", "kafka_before_end_txn")
    # A successor with the same transactional id aborts the open transaction, then a marker proves
    # the read_committed reader got past where op-b was written.
    fence = kafka.OutputProducer(ep.kafka.address, transactional_id=f"{topic}-tx")
    fence.close()
    kafka.produce(ep.kafka.address, topic, [("marker", "marker")])
    values = [v for _, v in kafka.consume_all(ep.kafka.address, topic, expect=2, timeout=20)]
    assert values == ['{"op": "op-a"}', "marker"]


@pytest.mark.kafka
def test_kafka_before_offset_commit_kill_leaves_the_offset_uncommitted(txchaos_stack: Endpoints) -> None:
    ep = txchaos_stack
    topic = f"txchaos-traps-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(ep.kafka.address, [topic], partitions=1)
    kafka.produce(ep.kafka.address, topic, [("a", "op-a"), ("b", "op-b")])
    traps = TrapSet()
    with TrapProxy("kafka", (ep.kafka.host, ep.kafka.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
        client = Client({"TRAP_KAFKA": f"{proxy.address[0]}:{proxy.address[1]}"}, "kafka-consume", topic, "2")
        traps.arm(Trap("kafka_before_offset_commit", Kill(client.pid), nth=2))  # an offset names no op
        rc, out, err = client.start().finish()
    assert rc == SIGKILL_RC, err
    assert out.split("\n")[:-1] == ["committed op-a"]
    assert kafka.committed_offsets(ep.kafka.address, f"{topic}-group", topic) == {0: 1}  # op-b's never reached it


def test_a_trap_proxy_twins_the_stack_proxy_and_carries_its_network_faults(
    txchaos_stack: Endpoints, tables: sa.Engine
) -> None:
    """The trap proxy is the Postgres proxy's twin inside Toxiproxy: no second hop, the same faults."""
    from harness.clients.toxiproxy import ToxiproxyAdmin
    from harness.faults.network import Latency, Partition

    ep = txchaos_stack
    admin = ToxiproxyAdmin(ep.toxiproxy_api)
    with TrapProxy("postgres", (ep.postgres.host, ep.postgres.port), toxiproxy=ep.toxiproxy_api) as proxy:
        assert proxy.route == ep.postgres.proxy
        twin = f"txchaos-trap-{proxy._id}"
        assert admin.proxies()[twin]["upstream"] == admin.proxies()[ep.postgres.proxy]["upstream"]
        eng = db.engine(_pg_url(ep, proxy.address), pool_size=1)
        try:
            assert _timed_select(eng) < 0.25
            slow = Latency(ms=300).on(ep.postgres.proxy, admin)
            slow.apply()
            try:
                assert _timed_select(eng) >= 0.3  # the route's toxic reached the twin's connection
            finally:
                slow.heal()
            assert _timed_select(eng) < 0.25
            cut = Partition().on(ep.postgres.proxy, admin)
            cut.apply()
            try:
                with pytest.raises(sa.exc.OperationalError):
                    _timed_select(eng)
            finally:
                cut.heal()
            eng.dispose()
            admin.reset()  # Toxiproxy's reset: the route's faults go, the twin's trap stays
            assert [t["type"] for t in admin.toxics(twin)] == ["txchaos_trap", "txchaos_trap"]
        finally:
            eng.dispose()
    assert twin not in admin.proxies()  # a stopped trap proxy leaves nothing in Toxiproxy


def _timed_select(eng: sa.Engine) -> float:
    start = time.monotonic()
    with eng.connect() as conn:
        conn.exec_driver_sql("SELECT 1").scalar()
    return time.monotonic() - start


def test_a_harness_killed_by_sigkill_leaves_no_trap_proxy(txchaos_stack: Endpoints) -> None:
    """trapd drops what a harness made when its control channel closes, however the harness ended."""
    from harness.clients.toxiproxy import ToxiproxyAdmin

    ep = txchaos_stack
    code = (
        "import sys, time\n"
        "from harness.traps import TrapProxy\n"
        f"upstream = ({ep.postgres.host!r}, {ep.postgres.port})\n"
        f"p = TrapProxy('postgres', upstream, toxiproxy={ep.toxiproxy_api!r}).start()\n"
        "print(f'txchaos-trap-{p._id}', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        twin = proc.stdout.readline().strip()
        admin = ToxiproxyAdmin(ep.toxiproxy_api)
        assert twin in admin.proxies()
        proc.kill()
        proc.wait()
        _wait(lambda: twin not in admin.proxies(), timeout=10)
    finally:
        proc.kill()
