"""What every stack provider hands the tests: ``Endpoints``, and the ``StackProvider`` protocol."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from harness.errors import ConfigError
from harness.protocols import PROTOCOLS


@dataclass(frozen=True)
class Endpoint:
    """A client-facing address (always the Toxiproxy side) and the upstream it forwards to."""

    host: str
    port: int
    proxy: str
    upstream_host: str
    upstream_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def direct(self) -> Endpoint:
        """Return this endpoint with the proxy skipped: the harness's own connections during a soak's nemesis."""
        return Endpoint(self.upstream_host, self.upstream_port, self.proxy, self.upstream_host, self.upstream_port)


@dataclass(frozen=True)
class Endpoints:
    """Every address a scenario needs; identical in shape for the local and docker providers."""

    provider: str
    stack_id: str
    postgres: Endpoint
    stomp: Endpoint
    kafka: Endpoint
    toxiproxy_api: str
    db_user: str
    db_password: str = field(repr=False)  # per stack on the local provider: kept out of tracebacks and logs
    db_name: str
    state_dir: str
    # None only in an endpoints.json written before DTM joined the stack.
    dtm: Endpoint | None = None
    # ActiveMQ's OpenWire connector (JMS clients); None in an endpoints.json written before it.
    openwire: Endpoint | None = None
    # Kafka's INTERNAL listener on the broker's host: it advertises itself, so a client bootstrapped
    # there never reaches the proxy (``kafka.direct()`` would: metadata names the proxy). None in an
    # endpoints.json written before it.
    kafka_direct_port: int | None = None

    @property
    def postgres_url(self) -> str:
        """SQLAlchemy URL for Postgres through its proxy."""
        return self._postgres_url(self.postgres)

    @property
    def postgres_direct_url(self) -> str:
        """SQLAlchemy URL for Postgres with its proxy skipped: the harness's own reads and resets,
        which the faults it opens on the system under test must not slow or cut."""
        return self._postgres_url(self.postgres.direct())

    def _postgres_url(self, p: Endpoint) -> str:
        return f"postgresql+psycopg://{self.db_user}:{self.db_password}@{p.host}:{p.port}/{self.db_name}"

    def kafka_bootstrap(self, *, direct: bool = False) -> str:
        """Return Kafka's bootstrap address: through its proxy, or ``direct`` (the harness's own
        clients during a soak's nemesis) on the listener whose metadata skips the proxy too."""
        if direct and self.kafka_direct_port is not None:
            return f"{self.kafka.upstream_host}:{self.kafka_direct_port}"
        return self.kafka.address

    @property
    def dtm_url(self) -> str:
        """The DTM server URL through its proxy, as a DTM SDK takes it (``.../api/dtmsvr``)."""
        return f"http://{self._since(self.dtm, 'DTM server').address}/api/dtmsvr"

    @property
    def openwire_url(self) -> str:
        """ActiveMQ's OpenWire URL through its proxy, as ``ActiveMQConnectionFactory`` takes it."""
        return f"tcp://{self._since(self.openwire, 'OpenWire connector').address}"

    def _since(self, endpoint: Endpoint | None, what: str) -> Endpoint:
        """Return ``endpoint``, which an endpoints.json written before ``what`` joined the stack lacks."""
        if endpoint is None:
            raise ConfigError(
                f"stack {self.stack_id} has no {what} (its endpoints.json predates it)",
                hint="stop it with `txchaos down` and start a new one with `txchaos up`",
            )
        return endpoint

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Endpoints:
        raw = json.loads(text)
        for key in (p.endpoint for p in PROTOCOLS):
            if raw.get(key) is not None:
                raw[key] = Endpoint(**raw[key])
        return cls(**raw)

    def save(self, path: Path) -> Path:
        """Write ``to_json()`` to ``path`` readable by this user only (it holds the database password)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.to_json())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> Endpoints:
        return cls.from_json(path.read_text())

    def proxied(self) -> dict[str, Endpoint]:
        """Return each protocol's proxy (by protocol name, ``harness.protocols``) that this stack has."""
        found = {p.name: getattr(self, p.endpoint) for p in PROTOCOLS}
        return {name: ep for name, ep in found.items() if isinstance(ep, Endpoint)}

    def service_logs(self) -> dict[str, Path]:
        """Return each service's log file (empty for providers that keep logs elsewhere)."""
        logs = Path(self.state_dir) / "logs"
        if not logs.is_dir():
            return {}
        return {p.stem: p for p in sorted(logs.glob("*.log"))}


class StackProvider(Protocol):
    """Starts and stops one stack. ``start`` cleans up after itself if it fails half-way."""

    name: str

    def start(self) -> Endpoints: ...

    def stop(self) -> None: ...
