"""The one stack topology both providers build: services, versions, ports and proxies.

The local provider and docker-compose.yml must agree with this module; a unit test reads both
and compares. Clients only ever see the proxy side of each entry in ``PROXIES``.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.protocols import PROTOCOLS


@dataclass(frozen=True)
class Service:
    """A server the stack runs: name, pinned version, official image and its container port."""

    name: str
    version: str
    image: str
    port: int


@dataclass(frozen=True)
class ProxyRoute:
    """A Toxiproxy proxy: clients connect to ``listen_port``; it forwards to ``service`` on ``port``."""

    name: str
    service: str
    port: int
    listen_port: int


POSTGRES = Service("postgres", "15", "postgres:15", 5432)
ACTIVEMQ = Service("activemq", "6.1.8", "apache/activemq-classic:6.1.8", 61613)
KAFKA = Service("kafka", "4.1.2", "apache/kafka:4.1.2", 9092)
# Built with `go install` in both providers: the project's own image is not on Docker Hub.
TOXIPROXY = Service("toxiproxy", "2.12.0", "golang:1.24", 8474)
# The DTM server's HTTP API (2-phase messages). The image's tags carry no leading "v".
# Not DTM's default 36789: that lies in Linux's ephemeral range (32768-60999), where any client
# socket on the host, open or in TIME_WAIT, can hold the port and make the server's bind fail.
# Every fixed port here stays below that range (tests/unit/test_compose_topology.py).
DTM = Service("dtm", "1.19.0", "yedf/dtm:1.19.0", 26789)
# ActiveMQ's second connector: OpenWire, what JMS clients (activemq-client, Mats3) speak.
ACTIVEMQ_OPENWIRE_PORT = 61616

SERVICES: tuple[Service, ...] = (POSTGRES, ACTIVEMQ, KAFKA, TOXIPROXY, DTM)

# Each protocol's server port and docker's fixed proxy port (published on the host); the local
# provider picks free ports instead. The proxies' names and services are the protocols' table's.
_PORTS = {
    "postgres": (POSTGRES.port, 15432),
    "stomp": (ACTIVEMQ.port, 16613),
    "openwire": (ACTIVEMQ_OPENWIRE_PORT, 16616),
    "kafka": (KAFKA.port, 19092),
    "dtm": (DTM.port, 16789),
}
PROXIES: tuple[ProxyRoute, ...] = tuple(ProxyRoute(p.proxy, p.service, *_PORTS[p.name]) for p in PROTOCOLS)

# Kafka's second listener, for the broker itself (controller and inter-broker): never proxied.
KAFKA_INTERNAL_PORT = 29092
KAFKA_CONTROLLER_PORT = 29093
# DTM's gRPC listener cannot be switched off; nothing in the harness speaks gRPC, so it is not proxied.
DTM_GRPC_PORT = 26790


def fixed_ports() -> dict[str, int]:
    """Return every port the docker stack binds on the host's loopback, by what listens there."""
    ports = {s.name: s.port for s in SERVICES} | {f"{p.name} proxy": p.listen_port for p in PROXIES}
    return ports | {
        "activemq-openwire": ACTIVEMQ_OPENWIRE_PORT,
        "kafka-internal": KAFKA_INTERNAL_PORT,
        "kafka-controller": KAFKA_CONTROLLER_PORT,
        "dtm-grpc": DTM_GRPC_PORT,
    }


# The role the systems under test and the harness's runs connect as: the local provider makes it
# a non-superuser owning DB_NAME, with a password generated per stack (DB_PASSWORD is docker's).
DB_USER = "txchaos"
DB_PASSWORD = "txchaos"
DB_NAME = "txchaos"
# The local provider's superuser: reachable only over the server's private Unix socket; its TCP
# password is random and thrown away at initdb.
DB_ADMIN = "txchaos_admin"


def proxy_for(service: str) -> ProxyRoute:
    """Return the (first) proxy route in front of ``service``: ActiveMQ's is its STOMP one."""
    for route in PROXIES:
        if route.service == service:
            return route
    raise KeyError(service)


def proxy_named(name: str) -> ProxyRoute:
    """Return the proxy route called ``name`` (``activemq_openwire``)."""
    for route in PROXIES:
        if route.name == name:
            return route
    raise KeyError(name)
