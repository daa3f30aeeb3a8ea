"""The protocols the stack proxies, one row each: every other table of protocols is read from here.

A row names the protocol's ``Endpoints`` field, its Toxiproxy proxy, the stack service behind
it, the reader ``trapd`` runs on its connections (``relay/control.go``'s ``Protocols``, which a
unit test holds to this table), the service placeholders that make a service under test speak
it through a trap relay, and its trap points with what a service did not do when a trap on the
point never fired. Adding a protocol starts with a row here.

Standard library only, importing nothing of ours: the stack, the traps, the run layer and the
machines all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROTOCOLS", "TRAPPED", "Protocol", "TrapPoint", "by_name", "proxies"]


@dataclass(frozen=True)
class TrapPoint:
    """A wire-level point a trap can fire on; ``unreached`` heads the verdict when it never fired."""

    name: str
    unreached: str


@dataclass(frozen=True)
class Protocol:
    """One protocol the stack proxies (see the module docstring for what each field feeds)."""

    name: str
    service: str  # the stack service behind the proxy
    endpoint: str  # the field of ``Endpoints`` holding the proxy's address
    proxy: str  # the Toxiproxy proxy's name
    reader: str = ""  # trapd's reader, the prefix of every point; "" for a protocol no trap reads
    placeholders: tuple[str, ...] = ()  # a service's placeholders that connect it through this proxy
    points: tuple[TrapPoint, ...] = ()

    @property
    def trapped(self) -> bool:
        """Return whether a trap relay can read this protocol's connections."""
        return bool(self.reader)


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol(
        "postgres",
        "postgres",
        "postgres",
        "postgres",
        "pg",
        ("postgres_url", "postgres_host", "postgres_port"),
        (
            TrapPoint("pg_before_commit", "the service sent no Postgres COMMIT"),
            TrapPoint("pg_after_commit", "Postgres confirmed no COMMIT of the service"),
        ),
    ),
    Protocol(
        "stomp",
        "activemq",
        "stomp",
        "activemq_stomp",
        "stomp",
        ("stomp_host", "stomp_port", "stomp_url"),
        (
            TrapPoint("stomp_before_ack", "the service sent no STOMP ACK"),
            TrapPoint("stomp_before_commit", "the service sent no STOMP COMMIT"),
            TrapPoint("stomp_after_commit", "the service sent no STOMP COMMIT"),
        ),
    ),
    Protocol(
        "openwire",
        "activemq",
        "openwire",
        "activemq_openwire",
        "openwire",
        ("openwire_host", "openwire_port", "openwire_url"),
        (
            TrapPoint("openwire_before_ack", "the service sent no OpenWire message acknowledgement"),
            TrapPoint(
                "openwire_before_commit",
                "the service committed no JMS transaction (OpenWire TransactionInfo COMMIT)",
            ),
            TrapPoint("openwire_after_commit", "the broker confirmed no JMS transaction commit of the service"),
        ),
    ),
    Protocol(
        "kafka",
        "kafka",
        "kafka",
        "kafka",
        "kafka",
        ("kafka_bootstrap",),
        (
            TrapPoint("kafka_before_offset_commit", "the service committed no Kafka offset"),
            TrapPoint("kafka_before_end_txn", "the service ended no Kafka transaction"),
            TrapPoint("kafka_after_produce", "the service produced no Kafka record"),
        ),
    ),
    # DTM speaks HTTP: proxied (network faults reach it), read by no trap.
    Protocol("dtm", "dtm", "dtm", "dtm", placeholders=("dtm_url",)),
)

TRAPPED: tuple[Protocol, ...] = tuple(p for p in PROTOCOLS if p.trapped)


def by_name(name: str) -> Protocol:
    """Return the row of protocol ``name``; raise KeyError naming the known ones."""
    for protocol in PROTOCOLS:
        if protocol.name == name:
            return protocol
    raise KeyError(f"{name!r} is not one of {', '.join(p.name for p in PROTOCOLS)}")


def proxies(*names: str) -> tuple[str, ...]:
    """Return the Toxiproxy proxies of the protocols ``names``, in that order.

    >>> proxies("stomp", "postgres")
    ('activemq_stomp', 'postgres')
    """
    return tuple(by_name(name).proxy for name in names)
