"""Drive the relay's protocol readers (Go, ``trapd feed``) chunk by chunk, as the trap unit tests' sessions.

The readers the relay runs are the readers these tests specify: each ``feed`` is one chunk
through the Go session, answered with the bytes to forward and the hits in them.
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
from dataclasses import dataclass
from typing import Any

from harness.traps.channel import binary

Address = tuple[str, int]


@dataclass(frozen=True)
class Hit:
    """A trap point seen in one chunk: the message starts at ``offset`` and concerns ``ops``."""

    point: str
    offset: int
    ops: frozenset[str] = frozenset()


class _Feeder:
    """One ``trapd feed`` process serving every session of a test run."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(binary()), "feed"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.clusters = itertools.count(1)

    def call(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self.proc.stdout.readline())
        assert "error" not in reply, reply["error"]
        return reply


_feeder: _Feeder | None = None


def _the_feeder() -> _Feeder:
    global _feeder
    if _feeder is None or _feeder.proc.poll() is not None:
        _feeder = _Feeder()
    return _feeder


class GoSession:
    """One connection's reader: ``feed("up"|"down", chunk)`` returns (bytes to forward, hits)."""

    def __init__(self, protocol: str, ops: tuple[str, ...] = (), **options: Any) -> None:
        self._feeder = _the_feeder()
        self._id = self._feeder.call(cmd="session", protocol=protocol, armed=list(ops), **options)["session"]

    def feed(self, direction: str, data: bytes) -> tuple[bytes, list[Hit]]:
        reply = self._feeder.call(
            cmd="feed", session=self._id, up=direction == "up", data=base64.b64encode(data).decode()
        )
        out = base64.b64decode(reply["out"] or "")
        return out, [Hit(h["point"], h["offset"], frozenset(h["ops"])) for h in reply["hits"]]


def pg_session(*ops: str, pattern: bytes | None = None) -> GoSession:
    return GoSession("postgres", ops, pattern=pattern.decode() if pattern else "")


def stomp_session(*ops: str) -> GoSession:
    return GoSession("stomp", ops)


class KafkaCluster:
    """Kafka sessions sharing their transactions (as one proxy's connections do)."""

    def __init__(self, ops: frozenset[str], rewrite: dict[Address, Address]) -> None:
        self._ops = tuple(sorted(ops))
        self._rewrite = {f"{a[0]}:{a[1]}": f"{b[0]}:{b[1]}" for a, b in rewrite.items()}
        self._number = next(_the_feeder().clusters)

    def session(self) -> GoSession:
        return GoSession("kafka", self._ops, rewrite=self._rewrite, cluster=self._number)
