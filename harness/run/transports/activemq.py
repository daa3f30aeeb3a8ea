"""ActiveMQ (STOMP) as a run's transport: the driver's producer connection and its queues."""

from __future__ import annotations

from collections.abc import Mapping

from harness.clients.activemq import StompClient
from harness.errors import HarnessError
from harness.run.transports.base import RunRecord
from harness.stack.base import Endpoint


class ActiveMQTransport:
    """The driver's STOMP connection; queues exist once used, so ``create`` only connects.

    A connection lost meanwhile (a broker restart) is opened again once per send: a message
    already sent stays sent.
    """

    name = "activemq"

    def __init__(self, stomp: Endpoint, folder: RunRecord) -> None:
        self.stomp, self.folder = stomp, folder
        self._client: StompClient | None = None

    def create(self, destinations: list[str]) -> None:
        """Open the driver's connection (ActiveMQ makes a queue when it is first used)."""
        self.client()

    def client(self) -> StompClient:
        if self._client is None:
            ep = self.stomp
            self._client = StompClient(
                ep.host, ep.port, client_id=f"txchaos-driver-{self.folder.run_id}", heartbeats=(0, 0)
            )
        return self._client

    def send(self, destination: str, body: str | None, *, key: str, headers: Mapping[str, str]) -> None:
        """Send one persistent message to the queue ``destination``."""
        try:
            self.client().send(destination, body or "", headers=dict(headers))
        except HarnessError:
            self.release()  # the broker went away (a restart): one new connection, then fail
            self.client().send(destination, body or "", headers=dict(headers))

    def flush(self) -> None:
        """An empty transaction's ABORT receipt proves the broker has taken every SEND before it."""
        client = self.client()
        client.abort(client.begin())

    def release(self) -> None:
        """Close the driver's connection."""
        if self._client is not None:
            self._client.close()
            self._client = None
