"""Kafka as a run's transport: per-run topics and the driver's producer."""

from __future__ import annotations

from collections.abc import Mapping

from harness.clients import kafka
from harness.errors import HarnessError
from harness.run.transports.base import RunRecord


class KafkaTransport:
    """The run's topics and the driver's producer; ``release`` deletes the topics once.

    >>> t = KafkaTransport(bootstrap, folder, partitions=1)
    >>> t.create(["txchaos.r1.in", "txchaos.r1.in-dlt"])
    >>> t.send("txchaos.r1.in", "{}", key="op1", headers={"txchaos-op": "op1"}); t.flush()
    """

    name = "kafka"

    def __init__(self, bootstrap: str, folder: RunRecord, *, partitions: int) -> None:
        self.bootstrap, self.folder, self.partitions = bootstrap, folder, partitions
        self.topics: list[str] = []
        self._producer: kafka.OutputProducer | None = None
        # The harness's questions on offsets (quiescence, the books), on clients kept open.
        self.probe = kafka.OffsetProbe(bootstrap)

    def create(self, destinations: list[str]) -> None:
        """Create ``destinations`` as topics and open the driver's producer."""
        self.topics = list(destinations)
        kafka.create_topics(self.bootstrap, self.topics, partitions=self.partitions)
        self.folder.step(f"create topics {', '.join(self.topics)} ({self.partitions} partition(s))")
        # log_level 2: the driver's producer retries through a soak's partitions and restarts; each
        # refused reconnect is expected there, and would bury the progress lines on the terminal.
        self._producer = kafka.OutputProducer(
            self.bootstrap, client_id=f"txchaos-driver-{self.folder.run_id}", log_level=2
        )

    def producer(self) -> kafka.OutputProducer:
        if self._producer is None:
            raise HarnessError("submit() to a run that is not open", hint="call open() first")
        return self._producer

    def send(self, destination: str, body: str | None, *, key: str, headers: Mapping[str, str]) -> None:
        """Produce one record keyed ``key`` (``body`` None: a tombstone)."""
        self.producer().produce(destination, body, key=key, headers=dict(headers))

    def flush(self) -> None:
        """Return once the broker acknowledged every record produced so far."""
        self.producer().flush()

    def release(self) -> None:
        """Close the producer and the probe, and delete the run's topics (a failure is a folder step,
        not an error)."""
        self.probe.close()
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        topics, self.topics = self.topics, []
        if topics:
            try:
                kafka.delete_topics(self.bootstrap, topics)
            except HarnessError as exc:  # the ledger holds the run; a leftover topic harms nothing
                self.folder.step(f"could not delete the run's topics: {exc}")
