"""A TCP relay in front of a Toxiproxy proxy that reads one protocol and fires armed traps.

Each accepted connection gets two threads, one per direction, each a blocking ``recv`` →
``session.feed`` → ``sendall`` loop: the bytes go on as they came (Kafka's broker addresses
excepted, see ``kafka.py``), and nothing waits for more than the message being read. When a hit
fires a trap, the relay forwards the bytes before the held message, then runs the action: ``kill``
signals the process and then closes both sides (so the held message is never delivered, even to a
process that survives), ``drop`` closes both sides, ``freeze`` stops the process and holds the
message until ``TrapSet.thaw()``.

Threads rather than an event loop: a relay hop costs a few tens of microseconds either way, and a
blocked direction (a frozen hold) then needs no bookkeeping. ``docs/traps.md`` has the figures.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType

from harness.errors import ConfigError, HarnessError
from harness.traps.base import Direction, Drop, Freeze, Hit, Kill, OpFinder, PidSource, Session, TrapSet
from harness.traps.kafka import KafkaCluster
from harness.traps.pg import PgSession
from harness.traps.stomp import StompSession

PROTOCOLS = ("postgres", "stomp", "kafka")
CHUNK = 256 * 1024


class TrapProxy:
    """Relay ``listen`` → ``upstream`` for ``protocol``, firing ``traps``; a context manager.

    Example::

        with TrapProxy("postgres", ("127.0.0.1", ep.postgres.port), traps) as proxy:
            engine = db.engine(url_with(proxy.address))
    """

    def __init__(
        self,
        protocol: str,
        upstream: tuple[str, int],
        traps: TrapSet | None = None,
        *,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        op_pattern: re.Pattern[bytes] | None = None,
        owner: PidSource | None = None,
        label: str = "",
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ConfigError(f"no trap proxy for protocol {protocol!r}", hint=f"use one of {', '.join(PROTOCOLS)}")
        if listen[0] != "127.0.0.1":
            raise ConfigError(f"a trap proxy listens on loopback only, not {listen[0]!r}", hint="listen on 127.0.0.1")
        self.protocol = protocol
        self.upstream = upstream
        self.traps = traps if traps is not None else TrapSet()
        self._finder = OpFinder(self.traps.armed_ops, op_pattern)
        self._listen = listen
        self._server: socket.socket | None = None
        self._conns: dict[int, _Connection] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._cluster: KafkaCluster | None = None
        self._acceptor: threading.Thread | None = None
        self.owner = owner  # the process a Kill() or Freeze() without a pid acts on
        self.label = label

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise HarnessError("the trap proxy is not started", hint="call start() or use it as a context manager")
        host, port = self._server.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> TrapProxy:
        server = socket.create_server(self._listen, backlog=128)
        self._server = server
        if self.protocol == "kafka":
            self._cluster = KafkaCluster(self._finder, {self.upstream: self.address})
        self._acceptor = threading.Thread(target=self._accept, name=f"trap-{self.protocol}-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            _shut(server)
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.close()  # first: a held message released below is then dropped, never delivered late
        try:
            self.traps.thaw()  # a frozen hold must not outlive the proxy
        finally:
            if self._acceptor is not None:
                self._acceptor.join(timeout=5)

    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def __enter__(self) -> TrapProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _session(self) -> Session:
        if self.protocol == "postgres":
            return PgSession(self._finder)
        if self.protocol == "stomp":
            return StompSession(self._finder)
        assert self._cluster is not None
        return self._cluster.session()

    def _accept(self) -> None:
        server = self._server
        while server is not None:
            try:
                client, _ = server.accept()
            except OSError:
                return  # stop() closed the listener
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _shut(client)  # the client sees the refusal as a closed connection, as without the trap
                continue
            upstream.settimeout(None)
            cid = next(self._ids)
            conn = _Connection(cid, client, upstream, self._session(), self.traps, self._forget, self._aim, self.label)
            with self._lock:
                self._conns[cid] = conn
            conn.start()

    def _aim(self, action: Kill | Freeze | Drop) -> Kill | Freeze | Drop:
        """Return ``action`` aimed at this proxy's owner when it names no process."""
        if isinstance(action, Kill | Freeze) and action.pid is None and self.owner is not None:
            return replace(action, pid=self.owner)
        return action

    def _forget(self, cid: int) -> None:
        with self._lock:
            self._conns.pop(cid, None)


class _Connection:
    """One relayed connection: two pumps sharing one protocol session."""

    def __init__(
        self,
        cid: int,
        client: socket.socket,
        upstream: socket.socket,
        session: Session,
        traps: TrapSet,
        forget: Callable[[int], None],
        aim: Callable[[Kill | Freeze | Drop], Kill | Freeze | Drop],
        label: str,
    ) -> None:
        self.cid = cid
        self._aim = aim
        self._label = label
        self._client = client
        self._upstream = upstream
        self._session = session
        self._traps = traps
        self._forget = forget
        self._closed = threading.Event()
        self._left = 2
        self._lock = threading.Lock()
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def start(self) -> None:
        for direction, src, dst in (("up", self._client, self._upstream), ("down", self._upstream, self._client)):
            name = f"trap-{self.cid}-{direction}"
            threading.Thread(target=self._pump, args=(direction, src, dst), name=name, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        _shut(self._client)
        _shut(self._upstream)

    def _pump(self, direction: Direction, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    dst.shutdown(socket.SHUT_WR)  # a half-close goes on, as Toxiproxy does
                    return
                out, hits = self._session.feed(direction, data)
                fired = self._fire(hits)
                if fired is None:
                    dst.sendall(out)
                    continue
                hit, action = fired
                dst.sendall(out[: hit.offset])
                if isinstance(action, Freeze):
                    self._traps.freeze(action).wait()
                    if self._closed.is_set():
                        return
                    dst.sendall(out[hit.offset :])
                    continue
                if isinstance(action, Kill):
                    action.signal(signal.SIGKILL)  # before the close: the process must not see the connection end
                self.close()
                return
        except OSError:
            self.close()  # one side went away: end the other, as a plain TCP proxy would
        except Exception:
            self.close()  # a failing action (its pid source raised): the held message must still not go on
            raise
        finally:
            with self._lock:
                self._left -= 1
                done = self._left == 0
            if done:
                self.close()
                self._forget(self.cid)

    def _fire(self, hits: list[Hit]) -> tuple[Hit, Kill | Freeze | Drop] | None:
        for hit in hits:
            matched = self._traps.match(hit, self.cid, self._label)
            if matched is not None:
                return hit, self._aim(matched[0].action)
        return None


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
