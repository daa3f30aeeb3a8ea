"""Traps: a named wire-level crash point, what fires it, and what it does when it fires.

A protocol parser (``pg.py``, ``stomp.py``, ``kafka.py``) turns the bytes of one connection into
``Hit`` s: "this message is point P for ops {...}, starting at byte offset N of this chunk". The
``TrapSet`` decides whether an armed ``Trap`` fires on a hit; the relay (``proxy.py``) then holds
the message and runs the trap's ``Action``.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from harness.errors import ConfigError

POINTS: dict[str, str] = {
    "pg_before_commit": "postgres",
    "pg_after_commit": "postgres",
    "stomp_before_ack": "stomp",
    "stomp_before_commit": "stomp",
    "stomp_after_commit": "stomp",
    "kafka_before_offset_commit": "kafka",
    "kafka_before_end_txn": "kafka",
    "kafka_after_produce": "kafka",
}

Direction = Literal["up", "down"]  # up: client -> server; down: server -> client


@dataclass(frozen=True)
class Hit:
    """A trap point seen in one chunk: the message starts at ``offset`` and concerns ``ops``."""

    point: str
    offset: int
    ops: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Firing:
    """What the run layer records when a trap fires (a ledger event, later)."""

    point: str
    op: str | None
    conn: int
    ts_ns: int
    action: str
    where: str = ""  # the label of the proxy it fired on (a service instance)


class Session(Protocol):
    """The protocol state of one relayed connection; ``feed`` is called per chunk, in order.

    It returns the bytes to forward (the chunk itself, except where a protocol needs an address
    rewritten, or holds back a message until it is whole) and the hits, offsets into those bytes.
    """

    def feed(self, direction: Direction, data: bytes) -> tuple[bytes, list[Hit]]: ...


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
    release: threading.Event


class TrapSet:
    """The armed traps of a proxy, their hit counters, and the firing callback.

    ``on_fire`` is called (on the relay thread, before the action runs) with each ``Firing``.
    """

    def __init__(self, on_fire: Callable[[Firing], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._armed: list[Trap] = []
        self._hits: dict[str, int] = {}
        self._frozen: list[_Frozen] = []
        self.firings: list[Firing] = []
        self.on_fire = on_fire

    def arm(self, *traps: Trap) -> None:
        with self._lock:
            self._armed.extend(traps)

    def disarm(self) -> None:
        with self._lock:
            self._armed.clear()

    @property
    def armed(self) -> tuple[Trap, ...]:
        with self._lock:
            return tuple(self._armed)

    def armed_ops(self) -> frozenset[str]:
        """Return the op ids traps wait for: parsers look for these in the bytes they see."""
        with self._lock:
            return frozenset(t.op for t in self._armed if t.op is not None)

    def match(self, hit: Hit, conn: int, where: str = "") -> tuple[Trap, Firing] | None:
        """Count ``hit`` and return the trap it fires (disarmed from now on), or None."""
        with self._lock:
            n = self._hits[hit.point] = self._hits.get(hit.point, 0) + 1
            for trap in self._armed:
                if trap.point != hit.point:
                    continue
                if (trap.op is not None and trap.op in hit.ops) or trap.nth == n:
                    self._armed.remove(trap)
                    op = trap.op if trap.op is not None else _one(hit.ops)
                    firing = Firing(hit.point, op, conn, time.time_ns(), trap.action.name, where)
                    self.firings.append(firing)
                    break
            else:
                return None
        if self.on_fire is not None:
            self.on_fire(firing)
        return trap, firing

    def hits(self, point: str) -> int:
        with self._lock:
            return self._hits.get(point, 0)

    def freeze(self, action: Freeze) -> threading.Event:
        """Stop ``action``'s process; return the event its held message waits on."""
        release = threading.Event()
        with self._lock:
            self._frozen.append(_Frozen(action, release))
        action.signal(signal.SIGSTOP)
        return release

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
            f.release.set()
        if failed is not None:
            raise failed
        return len(frozen)

    def frozen(self) -> int:
        """Return how many processes are frozen now (each holding a message)."""
        with self._lock:
            return len(self._frozen)


def _one(ops: Iterable[str]) -> str | None:
    ordered = sorted(ops)
    return ordered[0] if ordered else None


def check_points(points: Iterable[str], protocol: str) -> None:
    """Raise ConfigError for a point that does not belong to ``protocol``'s proxy."""
    for p in points:
        if POINTS.get(p) != protocol:
            raise ConfigError(
                f"trap point {p!r} is not a {protocol} point",
                hint=f"{protocol} points: {', '.join(k for k, v in POINTS.items() if v == protocol)}",
            )


class OpFinder:
    """Find op ids in bytes: the armed ones (``armed()``), and any ``pattern`` match (to name an nth firing).

    Example: ``OpFinder(traps.armed_ops, re.compile(rb"op-[0-9a-f]{12}"))``.
    """

    def __init__(self, armed: Callable[[], frozenset[str]], pattern: re.Pattern[bytes] | None = None) -> None:
        self.armed = armed
        self.pattern = pattern

    def __call__(self, data: bytes | bytearray) -> frozenset[str]:
        found = {op for op in self.armed() if op.encode() in data}
        if self.pattern is not None:
            found.update(m.decode("ascii", "replace") for m in self.pattern.findall(data))
        return frozenset(found)


__all__ = [
    "POINTS",
    "Action",
    "Drop",
    "Firing",
    "Freeze",
    "Hit",
    "Kill",
    "OpFinder",
    "Session",
    "Trap",
    "TrapSet",
    "check_points",
]
