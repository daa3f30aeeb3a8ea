"""ActiveMQ (STOMP) as a run's transport: the driver's producer connection and its queues."""

from __future__ import annotations

import time
from collections.abc import Mapping

from harness.clients.activemq import StompClient
from harness.errors import HarnessError
from harness.run.transports.base import RunRecord
from harness.stack.base import Endpoint

RECONNECT_S = 120.0  # how long a lost broker may take to answer again (a restart takes seconds)
RETRY_S = 0.5
COMMIT_EVERY = 1_000  # messages a transaction of the driver holds at most (the broker keeps them till COMMIT)


class ActiveMQTransport:
    """The driver's STOMP connection; queues exist once used, so ``create`` only connects.

    Sends are held until ``flush``, which sends them in transactions of up to ``COMMIT_EVERY``,
    one write each, and lets each go once the broker's RECEIPT for its COMMIT says it stored them
    (``StompClient.send_committed``). When the broker goes away before it confirms them (a nemesis
    kill -9 and restart), the transport waits for the broker to answer again, sends them all once
    more and confirms them: the ledger holds a SUBMIT for each, and a message the broker never
    stored must not read as lost by the system under test. A resend is a step of the run; a
    message stored twice (its COMMIT taken, its RECEIPT lost) reaches the flow twice, as a
    redelivery would.
    """

    name = "activemq"

    def __init__(self, stomp: Endpoint, folder: RunRecord) -> None:
        self.stomp, self.folder = stomp, folder
        self._client: StompClient | None = None
        self._unconfirmed: list[tuple[str, str, dict[str, str]]] = []

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
        """Hold one persistent message for the queue ``destination``: the next ``flush`` sends it."""
        self._unconfirmed.append((destination, body or "", dict(headers)))

    def flush(self) -> None:
        """Send what is held and return once the broker has stored all of it."""
        try:
            self._confirm()
        except HarnessError:
            self._resend()

    def _confirm(self) -> None:
        """Send the held messages a transaction at a time, letting each go once the broker confirms it:
        a resend after a lost connection sends only what no COMMIT's RECEIPT confirmed."""
        while self._unconfirmed:
            chunk = self._unconfirmed[:COMMIT_EVERY]
            self.client().send_committed(chunk)
            del self._unconfirmed[: len(chunk)]

    def _resend(self) -> None:
        """Wait for the broker to answer again, then send every unconfirmed message again and confirm them."""
        resent = len(self._unconfirmed)
        deadline = time.monotonic() + RECONNECT_S
        while True:
            self.release()
            try:
                self._confirm()
                break
            except HarnessError as exc:
                if time.monotonic() > deadline:
                    raise HarnessError(
                        f"the broker at {self.stomp.host}:{self.stomp.port} did not take the driver's "
                        f"{len(self._unconfirmed)} unconfirmed message(s) back within {RECONNECT_S:g}s: {exc}",
                        hint="is the broker up (`txchaos status`)? A broker restart of the nemesis takes seconds",
                    ) from exc
                time.sleep(RETRY_S)
        self.folder.step(f"sent {resent} unconfirmed message(s) again: the broker connection was lost")

    def release(self) -> None:
        """Close the driver's connection."""
        if self._client is not None:
            self._client.close()
            self._client = None
