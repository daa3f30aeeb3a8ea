"""Every fault measurably breaks a real STOMP or Postgres round trip, and healing restores it."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness import faults, procfs
from harness.bench.journal import kill_during_commits
from harness.clients import db, kafka
from harness.clients.activemq import StompClient, drain
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import HarnessError
from harness.faults.broker import kill_service, restart_service
from harness.ledger.writer import LedgerWriter
from harness.run.transports.activemq import ActiveMQTransport
from harness.run.transports.kafka import KafkaTransport
from harness.stack.base import Endpoints
from harness.stack.local import LocalProvider
from harness.stack.local_state import ServiceRecipe, tagged_pids
from harness.stack.procs import spawn, stop

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)
CONNECT = b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\x00"


@pytest.fixture
def proxies(txchaos_stack: Endpoints) -> Iterator[ToxiproxyAdmin]:
    admin = ToxiproxyAdmin(txchaos_stack.toxiproxy_api)
    admin.reset()
    try:
        yield admin
    finally:
        admin.reset()  # a failed assertion must not leave a toxic for the next test


def _stomp_socket(ep: Endpoints, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection((ep.stomp.host, ep.stomp.port), timeout=timeout)


def _read_frame(s: socket.socket) -> bytes:
    data = b""
    while b"\x00" not in data:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} bytes: {data!r}")
        data += chunk
    return data


def _exchange(s: socket.socket) -> bytes:
    s.sendall(CONNECT)
    return s.recv(4096)


def stomp_rtt(ep: Endpoints) -> float:
    """Return the seconds from CONNECT to CONNECTED on a fresh connection."""
    started = time.monotonic()
    with _stomp_socket(ep) as s:
        s.sendall(CONNECT)
        assert _read_frame(s).startswith(b"CONNECTED")
    return time.monotonic() - started


def pg_time(conn: sa.Connection, size: int = 1) -> float:
    started = time.monotonic()
    value = conn.execute(sa.text("SELECT repeat('x', :n)"), {"n": size}).scalar()
    assert value is not None
    assert len(value) == size
    return time.monotonic() - started


@pytest.fixture
def pg(txchaos_stack: Endpoints) -> Iterator[sa.Connection]:
    eng = db.engine(txchaos_stack.postgres_url, pool_size=1)
    try:
        with eng.connect() as conn:
            yield conn
    finally:
        eng.dispose()


@pytest.mark.activemq
@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_latency_adds_at_least_the_latency(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin, stream: str) -> None:
    assert stomp_rtt(txchaos_stack) < 0.25
    with faults.active(faults.Latency(ms=400, jitter_ms=0, stream=stream).on(txchaos_stack.stomp, txchaos_stack)):
        assert stomp_rtt(txchaos_stack) >= 0.4
    assert stomp_rtt(txchaos_stack) < 0.25


@pytest.mark.activemq
def test_toxicity_zero_spares_every_connection(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    with faults.active(faults.Latency(ms=1000, toxicity=0.0).on("activemq_stomp", txchaos_stack)):
        assert proxies.toxics("activemq_stomp")[0]["toxicity"] == 0.0
        assert stomp_rtt(txchaos_stack) < 0.5


def test_latency_on_postgres_lands_in_the_ledger(
    txchaos_stack: Endpoints, proxies: ToxiproxyAdmin, pg: sa.Connection, tmp_path: Path
) -> None:
    assert pg_time(pg) < 0.15
    with LedgerWriter(tmp_path, "faults") as ledger:
        with faults.active(faults.Latency(ms=250).on("postgres", txchaos_stack), ledger):
            assert pg_time(pg) >= 0.25
            assert [t["type"] for t in proxies.toxics("postgres")] == ["latency"]
        assert pg_time(pg) < 0.15
    rows = [json.loads(line) for line in ledger.path.read_text().splitlines()]
    assert [(r["kind"], r["point"]) for r in rows] == [
        ("fault_start", "latency:postgres:downstream"),
        ("fault_end", "latency:postgres:downstream"),
    ]
    assert json.loads(rows[0]["detail"])["ms"] == 250
    assert proxies.toxics("postgres") == []


def test_bandwidth_slows_a_large_result(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin, pg: sa.Connection) -> None:
    assert pg_time(pg, 200_000) < 0.5
    with faults.active(faults.Bandwidth(kb_per_s=100).on("postgres", txchaos_stack)):
        assert pg_time(pg, 200_000) >= 1.0  # ~200 KB at 100 KB/s
    assert pg_time(pg, 200_000) < 0.5


def test_slicer_cuts_a_result_into_delayed_pieces(
    txchaos_stack: Endpoints, proxies: ToxiproxyAdmin, pg: sa.Connection
) -> None:
    assert pg_time(pg, 20_000) < 0.2
    with faults.active(faults.Slicer(avg_size=500, size_variation=100, delay_us=20_000).on("postgres", txchaos_stack)):
        assert pg_time(pg, 20_000) >= 0.5  # ~40 pieces, 20 ms apart, and the bytes arrive intact
    assert pg_time(pg, 20_000) < 0.2


def _seconds_until_closed(ep: Endpoints) -> float:
    """CONNECT, then DISCONNECT with a receipt: the broker closes; time until the client sees EOF."""
    with _stomp_socket(ep) as s:
        s.sendall(CONNECT)
        _read_frame(s)
        # Timed from before the DISCONNECT goes: the broker can close (and the proxy start its
        # delay) before a loaded machine returns from ``sendall`` (0.998 s measured once).
        started = time.monotonic()
        s.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
        while s.recv(4096):
            pass
        return time.monotonic() - started


@pytest.mark.activemq
def test_slow_close_delays_the_close(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    assert _seconds_until_closed(txchaos_stack) < 0.5
    with faults.active(faults.SlowClose(delay_ms=1000).on("activemq_stomp", txchaos_stack)):
        assert _seconds_until_closed(txchaos_stack) >= 1.0
    assert _seconds_until_closed(txchaos_stack) < 0.5


@pytest.mark.activemq
def test_timeout_holds_the_connection_half_open(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    with (
        faults.active(faults.Timeout(ms=0).on("activemq_stomp", txchaos_stack)),
        _stomp_socket(txchaos_stack, 1.5) as s,
    ):
        s.sendall(CONNECT)  # the connection opens, the bytes vanish, nothing closes it
        with pytest.raises(TimeoutError):
            s.recv(4096)
    with (
        faults.active(faults.Timeout(ms=500).on("activemq_stomp", txchaos_stack)),
        _stomp_socket(txchaos_stack, 5) as s,
    ):
        started = time.monotonic()
        s.sendall(CONNECT)
        assert s.recv(4096) == b""  # closed after the timeout, with no answer
        assert 0.4 <= time.monotonic() - started < 3
    assert stomp_rtt(txchaos_stack) < 0.25


@pytest.mark.activemq
def test_reset_peer_resets_the_connection(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    fault = faults.ResetPeer(timeout_ms=0).on("activemq_stomp", txchaos_stack)
    # A clean close (FIN) would return b"" and fail the test with DID NOT RAISE: only an RST passes.
    with faults.active(fault), _stomp_socket(txchaos_stack) as s, pytest.raises(ConnectionResetError):
        _exchange(s)
    assert stomp_rtt(txchaos_stack) < 0.25


@pytest.mark.activemq
def test_limit_data_closes_after_the_budget(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    with (
        faults.active(faults.LimitData(bytes=10).on("activemq_stomp", txchaos_stack)),
        _stomp_socket(txchaos_stack) as s,
    ):
        s.sendall(CONNECT)
        with pytest.raises(ConnectionError, match="closed after 10 bytes: b'CONNECTED\\\\n'"):
            _read_frame(s)
    assert stomp_rtt(txchaos_stack) < 0.25


@pytest.mark.activemq
def test_partition_refuses_connections_until_healed(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    ep = txchaos_stack
    with faults.active(faults.Partition().on("activemq_stomp", ep)), pytest.raises(HarnessError, match="STOMP connect"):
        StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0))
    with faults.active(faults.Partition().on("postgres", ep)), pytest.raises(sa.exc.OperationalError):
        db.ping(ep.postgres_url)
    assert db.ping(ep.postgres_url)
    assert stomp_rtt(ep) < 0.25


def test_healing_runs_when_the_body_raises(txchaos_stack: Endpoints, proxies: ToxiproxyAdmin) -> None:
    partition, latency = (
        faults.Partition().on("postgres", txchaos_stack),
        faults.Latency(ms=100).on("postgres", txchaos_stack),
    )
    with pytest.raises(RuntimeError), faults.active(partition), faults.active(latency):
        raise RuntimeError("the scenario failed half-way")
    state = proxies.proxies()["postgres"]
    assert state["enabled"]
    assert state["toxics"] == []


def test_pause_stops_a_process_and_heal_resumes_it(tmp_path: Path) -> None:
    ticks = tmp_path / "ticks"
    code = f"import time\nwhile True:\n    open({str(ticks)!r}, 'a').write('.')\n    time.sleep(0.02)\n"
    proc = spawn(
        [sys.executable, "-c", code],
        name="ticker",
        tag=f"test/pause/{uuid.uuid4().hex[:6]}",
        log_path=tmp_path / "ticker.log",
    )
    try:
        time.sleep(0.3)
        with faults.active(faults.Pause(proc.pid)):
            time.sleep(0.1)
            size = ticks.stat().st_size
            time.sleep(0.5)
            assert procfs.state(proc.pid) == "T"
            assert ticks.stat().st_size == size, "the paused process kept writing"
        time.sleep(0.3)
        assert procfs.state(proc.pid) != "T"
        assert ticks.stat().st_size > size
    finally:
        stop(proc, timeout=2)


# -- broker kill -9 and restart on a stack of their own (the session stack stays untouched) ------
@pytest.fixture(scope="module")
def own_stack() -> Iterator[tuple[LocalProvider, Endpoints]]:
    provider = LocalProvider()
    endpoints = provider.start()
    try:
        yield provider, endpoints
    finally:
        provider.stop()


@pytest.mark.activemq
def test_activemq_kill9_keeps_persistent_messages(own_stack: tuple[LocalProvider, Endpoints], tmp_path: Path) -> None:
    _, ep = own_stack
    q = f"txchaos.kill.{uuid.uuid4().hex[:8]}"
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as c:
        c.send(q, "kept", persistent=True)
        c.send(q, "lost", persistent=False)
    holder = StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0))
    holder.subscribe(q)
    first = holder.receive(5)  # in flight, unacked, when the broker dies
    assert first is not None
    assert first.body == "kept"
    with (
        LedgerWriter(tmp_path, "faults") as ledger,
        faults.active(faults.KillBroker("activemq").on(ep), ledger) as fault,
        pytest.raises(HarnessError),
    ):
        StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0))
    holder.close()
    assert fault.restart_s is not None
    log.info("activemq restart: %.2f s", fault.restart_s)
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as c:
        c.subscribe(q)
        got = []
        while (msg := c.receive(2)) is not None:
            got.append(msg)
            c.ack(msg)
    assert [m.body for m in got] == ["kept"], "non-persistent messages must die with the broker"
    assert got[0].message_id == first.message_id
    assert got[0].redelivered  # persistJMSRedelivered="true" in activemq.xml


@pytest.mark.activemq
def test_activemq_kill9_loses_no_receipted_commit(own_stack: tuple[LocalProvider, Endpoints]) -> None:
    """The broker as shipped keeps every message whose COMMIT was receipted through a kill -9 under
    concurrent commits. With KahaDB's journal sync ``periodic`` the same kills lose some
    (`txchaos bench journal`, docs/benchmarks.md): every verdict about lost messages rests on this."""
    _, ep = own_stack
    for seconds in (0.4, 0.9, 1.5):
        trial = kill_during_commits(ep, seconds=seconds)
        assert trial.committed > 0, "no commit was receipted before the kill: the trial tested nothing"
        assert trial.lost == (), f"receipted, then lost in a kill -9 after {trial.send_s:.1f} s: {trial.lost[:5]}"


class _Folder:
    """What the driver's transport records: a run id and its steps."""

    def __init__(self) -> None:
        self.run_id = f"t-{uuid.uuid4().hex[:8]}"
        self.steps: list[str] = []

    def step(self, text: str) -> None:
        self.steps.append(text)


@pytest.mark.activemq
def test_the_drivers_transport_sends_again_what_a_broker_kill_left_unconfirmed(
    own_stack: tuple[LocalProvider, Endpoints],
) -> None:
    """A soak's broker kill -9 between the driver's sends and their confirmation must not turn into
    messages the ledger says were submitted and the broker never held: the flush waits for the
    restart and sends them again."""
    _, ep = own_stack
    q = f"txchaos.resend.{uuid.uuid4().hex[:8]}"
    folder = _Folder()
    transport = ActiveMQTransport(ep.stomp, folder)
    bodies = [f"m-{i}" for i in range(50)]
    for body in bodies:
        transport.send(q, body, key=body, headers={})
    kill_service(ep, "activemq")
    restarter = threading.Timer(1.0, restart_service, args=(ep, "activemq"))
    restarter.start()
    try:
        transport.flush()  # the broker is down: waits for it, sends all 50 again, confirms them
    finally:
        restarter.join()
        transport.release()
    assert folder.steps == ["sent 50 unconfirmed message(s) again: the broker connection was lost"]
    with StompClient(ep.stomp.host, ep.stomp.port, heartbeats=(0, 0)) as c:
        got = [m.body for m in drain(c, [q], idle_s=1.0)]
    assert sorted(got) == sorted(bodies)  # held until the flush, then one transaction: each stored once


def test_postgres_kill9_keeps_a_committed_row(own_stack: tuple[LocalProvider, Endpoints]) -> None:
    _, ep = own_stack
    eng = db.engine(ep.postgres_url, pool_size=1)
    try:
        with eng.begin() as conn:
            conn.execute(sa.text("CREATE TABLE IF NOT EXISTS kill_probe (v text)"))
            # The stack runs synchronous_commit=off: only a flushed commit survives kill -9.
            conn.execute(sa.text("SET LOCAL synchronous_commit = on"))
            conn.execute(sa.text("INSERT INTO kill_probe VALUES ('kept')"))
        with faults.active(faults.KillBroker("postgres").on(ep)) as fault, pytest.raises(sa.exc.OperationalError):
            db.ping(ep.postgres_url)
        log.info("postgres restart: %.2f s", fault.restart_s or -1)
        eng.dispose()  # pooled connections died with the server
        with eng.connect() as conn:
            assert conn.execute(sa.text("SELECT v FROM kill_probe")).scalars().all() == ["kept"]
    finally:
        eng.dispose()


@pytest.mark.kafka
def test_kafka_kill9_keeps_acknowledged_records(own_stack: tuple[LocalProvider, Endpoints]) -> None:
    _, ep = own_stack
    topic = f"txchaos.kill.{uuid.uuid4().hex[:8]}"
    kafka.create_topics(ep.kafka.address, [topic], partitions=1)
    values = [(f"k{i}", f"v{i}") for i in range(10)]
    assert kafka.produce(ep.kafka.address, topic, values) == 10
    with faults.active(faults.KillBroker("kafka").on(ep)) as fault:
        assert not kafka.broker_ready(ep.kafka.address, 1.0)
    log.info("kafka restart: %.2f s", fault.restart_s or -1)
    assert sorted(kafka.consume_all(ep.kafka.address, topic, expect=10)) == sorted(values)


def test_postgres_killed_and_restarted_by_another_process_comes_back_and_outlives_it(
    own_stack: tuple[LocalProvider, Endpoints], tmp_path: Path
) -> None:
    """The soak benchmark's case: this process owns the stack, a child process kills and restarts
    Postgres (twice), then ends. Before the owner reaped its children at once, the killed
    postmaster stayed a zombie here and the restart refused to start ("lock file postmaster.pid
    already exists"); and a copy the child started died with the child (PDEATHSIG)."""
    _, ep = own_stack
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(ep.to_json())
    script = textwrap.dedent(f"""
        from pathlib import Path
        from harness import faults
        from harness.stack.base import Endpoints
        ep = Endpoints.from_json(Path({str(endpoints)!r}).read_text())
        for _ in range(2):
            with faults.active(faults.KillBroker("postgres").on(ep)) as fault:
                pass
            print(f"restart {{fault.restart_s:.2f}} s", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    log.info("postgres restarted from a child process: %s", done.stdout.split())
    time.sleep(0.5)  # PDEATHSIG, had the copy been given it, fires as the child ends
    db.ping(ep.postgres_url)


@pytest.mark.kafka
def test_a_soaks_kafka_clients_skip_the_proxy_its_nemesis_partitions(txchaos_stack: Endpoints) -> None:
    """A soak's driver produces and its sink reads on Kafka's self-advertising listener: a partition
    of Kafka's proxy (a fault for the flow) must not stop its submissions. Through the proxy's
    listener the flush would wait out the partition and fail (issue 32: a soak died that way)."""
    ep = txchaos_stack
    direct = ep.kafka_bootstrap(direct=True)
    assert direct != ep.kafka.address
    topic = f"txchaos.direct.{uuid.uuid4().hex[:8]}"
    transport = KafkaTransport(direct, _Folder(), partitions=1)
    transport.create([topic])
    try:
        with faults.active(faults.Partition().on("kafka", ep)):
            started = time.monotonic()
            for i in range(50):
                transport.send(topic, f"m-{i}", key=f"k{i}", headers={})
            transport.flush()
            took = time.monotonic() - started
            got = kafka.read_visible(direct, topic)
    finally:
        transport.release()
    assert took < 10, f"the flush took {took:.1f}s: it went through the partitioned proxy"
    assert sorted(r.value for r in got) == sorted(f"m-{i}".encode() for i in range(50))


def test_stop_stops_a_restarted_service(own_stack: tuple[LocalProvider, Endpoints]) -> None:
    provider, ep = own_stack
    with faults.active(faults.KillBroker("activemq").on(ep)):
        pass
    tag = ServiceRecipe.load(ep.state_dir, "activemq").tag
    (new_pid,) = tagged_pids(tag)
    assert new_pid != provider.procs["activemq"].pid, "the restart did not spawn a new process"
    provider.stop()
    for service in ("activemq", "postgres", "kafka", "toxiproxy"):
        assert tagged_pids(f"stack/{ep.stack_id}/{service}") == [], f"{service} outlived LocalProvider.stop()"
    assert not Path(f"/proc/{new_pid}/environ").exists() or procfs.state(new_pid) == "Z"
