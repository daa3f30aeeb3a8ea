"""Traps: a named wire-level crash point, what fires it, and what it does when it fires.

The relay (``trapd``, Go, ``trapd/``) reads each connection's protocol (``trapd/pg.go``,
``stomp.go``, ``openwire.go``, ``kafka.go``) into hits: "this message is point P for ops {...}". It fires an armed
``Trap`` of the ``TrapSet`` on the hit that carries its op, or on its nth hit, and holds the
message; the harness (``proxy.py``) then runs the trap's ``Action`` and tells the relay to drop
the message or, after a thaw, to let it go on.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.errors import ConfigError, HarnessError
from harness.protocols import TRAPPED

if TYPE_CHECKING:
    from harness.traps.channel import Trapd

# Every trap point -> its protocol, and what a service did not do when a trap on the point never
# fired (the verdict's headline says it): both read from the one table of protocols.
POINTS: dict[str, str] = {point.name: p.name for p in TRAPPED for point in p.points}
UNREACHED: dict[str, str] = {point.name: point.unreached for p in TRAPPED for point in p.points}


@dataclass(frozen=True)
class Firing:
    """What the run layer records when a trap fires (a ledger event, later)."""

    point: str
    op: str | None
    conn: int
    ts_ns: int
    action: str
    where: str = ""  # the label of the proxy it fired on (a service instance)


PidSource = Callable[[], int]


@dataclass(frozen=True)
class Kill:
    """SIGKILL the process (or process group) ``pid()`` names, then drop the connection.

    ``pid`` None: the process the proxy it fires on belongs to (``TrapProxy(owner=...)``).
    """

    pid: PidSource | None = None
    group: bool = False
    name: str = field(default="kill", init=False)

    def signal(self, sig: int) -> None:
        if self.pid is None:
            raise ValueError("a kill with no pid fired on a proxy with no owner")
        target = self.pid()
        try:
            if self.group:
                os.killpg(target, sig)
            else:
                os.kill(target, sig)
        except ProcessLookupError:
            pass  # already gone: the trap's effect (the process never acts on the reply) holds


@dataclass(frozen=True)
class Freeze:
    """SIGSTOP ``pid()`` and hold the message until ``TrapSet.thaw()`` (SIGCONT, then release)."""

    pid: PidSource | None = None
    group: bool = False
    name: str = field(default="freeze", init=False)

    def signal(self, sig: int) -> None:
        Kill(self.pid, self.group).signal(sig)


@dataclass(frozen=True)
class Drop:
    """Close both sides of the connection; the held message is never delivered."""

    name: str = field(default="drop", init=False)


Action = Kill | Freeze | Drop


@dataclass(frozen=True)
class Trap:
    """Fire ``action`` at ``point`` on the hit that carries ``op``, or on the ``nth`` hit (once).

    Example: ``Trap("pg_after_commit", Kill(lambda: child.pid), op="op-17")``.
    """

    point: str
    action: Action
    op: str | None = None
    nth: int | None = None

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ConfigError(f"unknown trap point {self.point!r}", hint=f"use one of {', '.join(POINTS)}")
        if (self.op is None) == (self.nth is None):
            raise ConfigError(
                f"trap {self.point} needs exactly one of op= or nth= (got op={self.op!r}, nth={self.nth!r})",
                hint="arm it per operation (op='...') or per hit (nth=1 for the first)",
            )
        if self.nth is not None and self.nth < 1:
            raise ConfigError(f"trap {self.point} nth={self.nth} is below 1", hint="count hits from 1")


@dataclass
class _Frozen:
    action: Freeze
    release: Callable[[], None]


class TrapSet:
    """The armed traps of a run's proxies, their firings, and the firing callback.

    The relay (``trapd``) matches the hits and counts them, across every proxy of the set; this
    object is the harness's side: what is armed, what fired, what is frozen. ``on_fire`` is called
    (on the firing's thread, before the action runs) with each ``Firing``.
    """

    def __init__(self, on_fire: Callable[[Firing], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, Trap] = {}
        self._ids = itertools.count(1)
        self._frozen: list[_Frozen] = []
        self._trapd: Trapd | None = None
        self._sid = 0
        self.firings: list[Firing] = []
        self.on_fire = on_fire

    def bind(self, daemon: Trapd) -> int:
        """Register this set with ``daemon`` (once) and return its id there; armed traps go with it."""
        with self._lock:
            if self._trapd is None:
                self._sid = int(daemon.call("set")["set"])
                self._trapd = daemon
                for tid, trap in self._armed.items():
                    self._push(tid, trap)
            elif self._trapd is not daemon:
                raise HarnessError("a trap set's trapd channel ended mid-run", hint="start the run again")
            return self._sid

    def arm(self, *traps: Trap) -> None:
        with self._lock:
            for trap in traps:
                tid = next(self._ids)
                self._armed[tid] = trap
                if self._trapd is not None:
                    self._push(tid, trap)

    def _push(self, tid: int, trap: Trap) -> None:
        assert self._trapd is not None
        self._trapd.call("arm", set=self._sid, trap=tid, point=trap.point, op=trap.op or "", nth=trap.nth or 0)

    def disarm(self) -> None:
        with self._lock:
            self._armed.clear()
            if self._trapd is not None:
                self._trapd.call("disarm", set=self._sid)

    @property
    def armed(self) -> tuple[Trap, ...]:
        with self._lock:
            return tuple(self._armed.values())

    def take(self, tid: int) -> Trap | None:
        """Return the trap the relay fired (it is disarmed from now on), or None if disarmed before."""
        with self._lock:
            return self._armed.pop(tid, None)

    def record(self, firing: Firing) -> None:
        with self._lock:
            self.firings.append(firing)
        if self.on_fire is not None:
            self.on_fire(firing)

    def hits(self, point: str) -> int:
        """Return how many times ``point`` was seen on this set's proxies (a hit fires at most one trap)."""
        with self._lock:
            daemon = self._trapd
        return 0 if daemon is None else int(daemon.call("hits", set=self._sid, point=point)["hits"])

    def freeze(self, action: Freeze, release: Callable[[], None]) -> None:
        """Stop ``action``'s process; ``release`` lets its held message go on at ``thaw()``."""
        frozen = _Frozen(action, release)
        with self._lock:
            self._frozen.append(frozen)
        try:
            action.signal(signal.SIGSTOP)
        except Exception:
            with self._lock:
                self._frozen.remove(frozen)
            raise

    def thaw(self) -> int:
        """Continue every frozen process and release its held message; return how many.

        Every held message is released even when a process cannot be signalled (its pid source
        fails once the run that owned it is gone): a hold must never outlive its trap set.
        """
        with self._lock:
            frozen, self._frozen = self._frozen, []
        failed: Exception | None = None
        for f in frozen:
            try:
                f.action.signal(signal.SIGCONT)
            except Exception as exc:
                failed = failed or exc
            try:
                f.release()
            except HarnessError as exc:
                failed = failed or exc  # the relay is gone: so is the message it held
        if failed is not None:
            raise failed
        return len(frozen)

    def frozen(self) -> int:
        """Return how many processes are frozen now (each holding a message)."""
        with self._lock:
            return len(self._frozen)


def check_points(points: Iterable[str], protocol: str) -> None:
    """Raise ConfigError for a point that does not belong to ``protocol``'s proxy."""
    for p in points:
        if POINTS.get(p) != protocol:
            raise ConfigError(
                f"trap point {p!r} is not a {protocol} point",
                hint=f"{protocol} points: {', '.join(k for k, v in POINTS.items() if v == protocol)}",
            )


__all__ = [
    "POINTS",
    "Action",
    "Drop",
    "Firing",
    "Freeze",
    "Kill",
    "Trap",
    "TrapSet",
    "check_points",
]
