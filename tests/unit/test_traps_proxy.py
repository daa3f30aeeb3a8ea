"""The trap relay forwards bytes unchanged, holds the trapped message, and runs its action (loopback, no services)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from harness import procfs
from harness.errors import ConfigError
from harness.traps import Drop, Firing, Freeze, Kill, Trap, TrapProxy, TrapSet
from harness.traps.base import check_points
from tests.unit.test_traps_pg import STARTUP, cc, q, rfq


class Upstream:
    """A loopback TCP server that records what it receives and answers each message it is told to."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.received = bytearray()
        self.peer: socket.socket | None = None
        self.ready = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return self.server.getsockname()[:2]  # type: ignore[no-any-return]

    def _serve(self) -> None:
        self.peer, _ = self.server.accept()
        self.ready.set()
        while data := self.peer.recv(65536):
            self.received += data
        self.closed.set()

    def send(self, data: bytes) -> None:
        assert self.ready.wait(5)
        assert self.peer is not None
        self.peer.sendall(data)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.server.close()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """Yield a sleeping process for a trap to act on, killed and reaped after the test."""
    sleeper = subprocess.Popen(["sleep", "60"])
    yield sleeper
    sleeper.kill()
    sleeper.wait()


def wait_for(cond: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def recv_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


@contextmanager
def through_trap(
    upstream: Upstream, trap: Trap, on_fire: Callable[[Firing], None] | None = None
) -> Iterator[tuple[TrapSet, socket.socket]]:
    """Yield a trap set with ``trap`` armed and a client connected to ``upstream`` through a Postgres trap proxy."""
    traps = TrapSet(on_fire=on_fire)
    traps.arm(trap)
    with TrapProxy("postgres", upstream.address, traps) as proxy, socket.create_connection(proxy.address) as client:
        yield traps, client


def test_clean_path_bytes_pass_unchanged_both_ways(upstream: Upstream) -> None:
    with TrapProxy("postgres", upstream.address) as proxy, socket.create_connection(proxy.address) as client:
        sent = STARTUP + q("BEGIN") + q("INSERT 'op-1'") + q("COMMIT")
        client.sendall(sent)
        wait_for(lambda: bytes(upstream.received) == sent)
        answer = cc("COMMIT") + rfq(b"I")
        upstream.send(answer)
        assert recv_exactly(client, len(answer)) == answer


def test_before_commit_drop_holds_the_commit_and_closes_both_sides(upstream: Upstream) -> None:
    fired: list[Firing] = []
    with through_trap(upstream, Trap("pg_before_commit", Drop(), op="op-1"), fired.append) as (traps, client):
        first = STARTUP + q("BEGIN") + q("INSERT 'op-0'") + q("COMMIT")  # another op: not this trap's
        client.sendall(first)
        wait_for(lambda: len(upstream.received) == len(first))  # all through before `before` is read
        upstream.send(cc("COMMIT") + rfq(b"I"))
        recv_exactly(client, len(cc("COMMIT") + rfq(b"I")))
        before = len(upstream.received)
        client.sendall(q("BEGIN") + q("INSERT 'op-1'") + q("COMMIT"))
        assert upstream.closed.wait(5)
        assert bytes(upstream.received[before:]) == q("BEGIN") + q("INSERT 'op-1'")  # the COMMIT never left
        assert client.recv(10) == b""
    assert [(f.point, f.op, f.action) for f in fired] == [("pg_before_commit", "op-1", "drop")]
    assert traps.armed == ()  # a trap fires once


def test_after_commit_kill_signals_the_process_before_the_client_sees_anything(
    upstream: Upstream, child: subprocess.Popen[bytes]
) -> None:
    with through_trap(upstream, Trap("pg_after_commit", Kill(lambda: child.pid), nth=2)) as (traps, client):
        client.sendall(STARTUP)
        for _ in range(2):
            client.sendall(q("BEGIN; INSERT 1; COMMIT") if _ == 0 else q("COMMIT"))
            wait_for(lambda: upstream.received.endswith(b"COMMIT\x00"))
            upstream.received.clear()
            upstream.send(cc("COMMIT") + rfq(b"I"))
            if _ == 0:
                recv_exactly(client, len(cc("COMMIT") + rfq(b"I")))
        assert client.recv(10) == b""  # the confirmation was held, then the connection closed
    assert child.wait(5) == -9
    assert traps.hits("pg_after_commit") == 2


def test_freeze_stops_the_process_and_thaw_releases_the_held_message(
    upstream: Upstream, child: subprocess.Popen[bytes]
) -> None:
    with through_trap(upstream, Trap("pg_before_commit", Freeze(lambda: child.pid), nth=1)) as (traps, client):
        client.sendall(STARTUP + q("INSERT 1") + q("COMMIT"))
        wait_for(lambda: procfs.state(child.pid) == "T")
        time.sleep(0.1)
        assert not bytes(upstream.received).endswith(q("COMMIT"))
        assert traps.thaw() == 1
        wait_for(lambda: bytes(upstream.received).endswith(q("COMMIT")))
        assert procfs.state(child.pid) in ("S", "R")


def test_bad_traps_and_proxies_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="unknown trap point 'pg_commit'"):
        Trap("pg_commit", Drop(), nth=1)
    with pytest.raises(ConfigError, match="exactly one of op= or nth="):
        Trap("pg_after_commit", Drop())
    with pytest.raises(ConfigError, match="nth=0"):
        Trap("pg_after_commit", Drop(), nth=0)
    with pytest.raises(ConfigError, match="not a kafka point"):
        check_points(["stomp_before_ack"], "kafka")
    with pytest.raises(ConfigError, match="protocol 'amqp'"):
        TrapProxy("amqp", ("127.0.0.1", 1))
    with pytest.raises(ConfigError, match="loopback only"):
        TrapProxy("postgres", ("127.0.0.1", 1), listen=("0.0.0.0", 0))


def test_a_refused_upstream_closes_the_client_and_the_proxy_stops_clean() -> None:
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with TrapProxy("stomp", ("127.0.0.1", port)) as proxy, socket.create_connection(proxy.address) as client:
        assert client.recv(10) == b""
    assert os.getpid()  # nothing leaked to assert on here beyond a clean exit


def test_an_action_that_fails_still_never_delivers_the_held_message(upstream: Upstream) -> None:
    def no_pid() -> int:
        raise RuntimeError("the service is not started yet")

    errors: list[BaseException | None] = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        with through_trap(upstream, Trap("pg_before_commit", Kill(no_pid), nth=1)) as (_, client):
            client.sendall(STARTUP + q("INSERT 1") + q("COMMIT"))
            assert upstream.closed.wait(5)
            assert client.recv(10) == b""
        assert bytes(upstream.received) == STARTUP + q("INSERT 1")
        wait_for(lambda: errors != [])
        assert isinstance(errors[0], RuntimeError)  # reported, not swallowed
    finally:
        threading.excepthook = hook
