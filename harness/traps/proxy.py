"""A trap proxy: a proxy of the relay (``trapd``) in front of a Toxiproxy proxy, and the actions of its traps.

In the stack's Toxiproxy (``toxiproxy=`` its API) the trap proxy is a twin of the proxy at
``upstream``: it forwards straight to that proxy's upstream and carries its network faults, so
the traps add no hop. With no stack, a ``trapd serve`` of this process relays to ``upstream``.
The relay forwards the bytes as they came (Kafka's broker addresses excepted, see
``trapd/kafka.go``) and, when a hit fires a trap, forwards the bytes before the held message and
reports the firing. The harness then runs the action on a thread of its own: ``kill`` signals the
process and then has the relay close both sides (so the held message is never delivered, even to
a process that survives), ``drop`` closes both sides, ``freeze`` stops the process and keeps the
message held until ``TrapSet.thaw()``.
"""

from __future__ import annotations

import re
import signal
from dataclasses import replace
from types import TracebackType

from harness.errors import ConfigError, HarnessError
from harness.protocols import TRAPPED
from harness.traps.base import Drop, Firing, Freeze, Kill, PidSource, TrapSet
from harness.traps.channel import Event, Trapd, trapd

PROTOCOLS = tuple(p.name for p in TRAPPED)  # the protocols trapd reads


class TrapProxy:
    """Trapd ``listen`` → ``upstream`` for ``protocol``, firing ``traps``; a context manager.

    Example::

        with TrapProxy("postgres", (ep.postgres.host, ep.postgres.port), traps, toxiproxy=ep.toxiproxy_api) as proxy:
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
        toxiproxy: str | None = None,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ConfigError(f"no trap proxy for protocol {protocol!r}", hint=f"use one of {', '.join(PROTOCOLS)}")
        if listen[0] != "127.0.0.1":
            raise ConfigError(f"a trap proxy listens on loopback only, not {listen[0]!r}", hint="listen on 127.0.0.1")
        self.protocol = protocol
        self.upstream = upstream
        self.traps = traps if traps is not None else TrapSet()
        self._pattern = op_pattern.pattern.decode() if op_pattern is not None else ""
        self._listen = listen
        self._trapd: Trapd | None = None
        self._id = 0
        self._address: tuple[str, int] | None = None
        self.route = ""  # the stack proxy this one twins, once started ("" when it relays to upstream)
        self.owner = owner  # the process a Kill() or Freeze() without a pid acts on
        self.label = label
        self.toxiproxy = toxiproxy  # the stack's Toxiproxy API, whose proxy at upstream the trap twins

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise HarnessError("the trap proxy is not started", hint="call start() or use it as a context manager")
        return self._address

    def start(self) -> TrapProxy:
        daemon = trapd(self.toxiproxy)
        sid = self.traps.bind(daemon)
        reply = daemon.call(
            "listen",
            set=sid,
            protocol=self.protocol,
            listen=f"{self._listen[0]}:{self._listen[1]}",
            upstream=f"{self.upstream[0]}:{self.upstream[1]}",
            pattern=self._pattern,
        )
        self._trapd, self._id, self.route = daemon, int(reply["proxy"]), str(reply.get("route", ""))
        host, _, port = str(reply["address"]).rpartition(":")
        self._address = (host, int(port))
        daemon.on_event(self._id, self._fired)
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection; idempotent."""
        daemon, self._trapd = self._trapd, None
        if daemon is not None and daemon.alive():
            # First: a held message released below is then dropped, never delivered late.
            daemon.call("stop", proxy=self._id)
            daemon.on_event(self._id, None)
        self.traps.thaw()  # a frozen hold must not outlive the proxy

    def __enter__(self) -> TrapProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _fired(self, event: Event) -> None:
        """Record a firing, run its action, and tell the relay what becomes of the held message."""
        daemon, hold = self._trapd, int(event["hold"])
        if daemon is None:
            return  # stopped meanwhile: its connections are closed, the message with them
        trap = self.traps.take(int(event["trap"]))
        if trap is None:  # disarmed while the relay fired it: as if it had not fired
            _decide(daemon, hold, release=True)
            return
        held = True
        try:
            action = self._aim(trap.action)
            point, op = str(event["point"]), str(event["op"]) or None
            self.traps.record(Firing(point, op, int(event["conn"]), int(event["ts_ns"]), action.name, self.label))
            if isinstance(action, Freeze):
                self.traps.freeze(action, lambda: _decide(daemon, hold, release=True))
                held = False  # the thaw releases it
            elif isinstance(action, Kill):
                action.signal(signal.SIGKILL)  # before the close: the process must not see the connection end
        finally:
            if held:
                _decide(daemon, hold, release=False)

    def _aim(self, action: Kill | Freeze | Drop) -> Kill | Freeze | Drop:
        """Return ``action`` aimed at this proxy's owner when it names no process."""
        if isinstance(action, Kill | Freeze) and action.pid is None and self.owner is not None:
            return replace(action, pid=self.owner)
        return action


def _decide(daemon: Trapd, hold: int, *, release: bool) -> None:
    """Tell the relay to let the held message go on (``release``) or to close its connection."""
    daemon.call("decide", hold=hold, release=release)
