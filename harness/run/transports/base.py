"""The ``Transport`` protocol: how a run's driver talks to the broker a flow runs on.

A session provisions the run's destinations with ``create``, submits with ``send`` and
``flush`` (which returns once the broker holds every record sent before it), and heals with
``release`` (close the driver's connection, delete what ``create`` made; at most once, never
raising for a destination already gone). Implementations: ``transports.activemq`` (STOMP
queues) and ``transports.kafka`` (topics). The sinks that read outputs and dead letters and the
residue drains stay with each transport's module pair (``sink.py``, ``kafka_sink.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Transport(Protocol):
    """The driver's side of a broker: destinations, sending, healing."""

    name: str

    def create(self, destinations: list[str]) -> None:
        """Make the run's destinations (and open the driver's connection)."""

    def send(self, destination: str, body: str | None, *, key: str, headers: Mapping[str, str]) -> None:
        """Send one record or message (``body`` None: a tombstone, where the broker has them)."""

    def flush(self) -> None:
        """Return once the broker holds everything sent so far."""

    def release(self) -> None:
        """Close the driver's connection and delete the run's destinations (healing)."""


class RunRecord(Protocol):
    """What a transport writes to: the run's id (names its clients) and its steps (the run folder has both)."""

    @property
    def run_id(self) -> str: ...

    def step(self, text: str) -> None: ...
