"""Per-test reset of a running stack: empty tables, purge queues and topics, heal the network."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from harness.clients import db, kafka
from harness.clients.activemq import StompClient, drain
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.stack.base import Endpoints
from harness.stack.hold import StackHold


@dataclass
class Resetter:
    """Hold the connections a reset needs, so each reset is a few round trips (target <= 200 ms).

    Queues and topics a test used are registered with ``track_*``; the next reset purges them.
    """

    endpoints: Endpoints
    queues: set[str] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)
    last_s: float = 0.0

    def __post_init__(self) -> None:
        self._engine = db.engine(self.endpoints.postgres_url, pool_size=1)
        self._proxy = ToxiproxyAdmin(self.endpoints.toxiproxy_api)

    def track_queues(self, names: Iterable[str]) -> None:
        self.queues.update(names)

    def track_topics(self, names: Iterable[str]) -> None:
        self.topics.update(names)

    def reset(self) -> float:
        """Heal the network first (the rest needs it), then empty everything; returns seconds.

        Refused (``ConfigError``) while a run holds the stack: it would empty that run's tables."""
        started = time.perf_counter()
        with StackHold(self.endpoints, "a reset between tests"):
            self._proxy.reset()
            db.truncate_all(self._engine)
            if self.queues:
                ep = self.endpoints.stomp
                with StompClient(ep.host, ep.port, client_id="txchaos-reset", heartbeats=(0, 0)) as client:
                    for _ in drain(client, sorted(self.queues), idle_s=0.05):
                        pass
            if self.topics:
                kafka.purge_topics(self.endpoints.kafka.address, sorted(self.topics))
        self.last_s = time.perf_counter() - started
        return self.last_s

    def close(self) -> None:
        self._engine.dispose()
