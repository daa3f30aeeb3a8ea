"""Network faults on a Toxiproxy proxy: the seven toxics, each way, and a partition.

A spec is a frozen, validated value (``Latency(ms=200, jitter_ms=20)``); ``.on(proxy, stack)``
binds it to a proxy of a running stack and returns the ``Fault`` that ``active`` applies:

>>> with active(Latency(200).on("activemq_stomp", endpoints), ledger):
...     client.send("orders", "...")          # every byte back from the broker waits 200 ms
"""

from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import ConfigError
from harness.faults.base import check_int, check_name, check_number, check_stream
from harness.stack.base import Endpoint, Endpoints

Stack = Endpoints | ToxiproxyAdmin | str
_SEQ = itertools.count(1)


def _admin(stack: Stack) -> ToxiproxyAdmin:
    if isinstance(stack, ToxiproxyAdmin):
        return stack
    return ToxiproxyAdmin(stack.toxiproxy_api if isinstance(stack, Endpoints) else stack)


def _proxy_name(proxy: str | Endpoint) -> str:
    name = proxy.proxy if isinstance(proxy, Endpoint) else proxy
    check_name("proxy", name)
    return name


@dataclass(frozen=True)
class ToxicSpec:
    """Fields every toxic has: the direction it acts on and the share of connections it hits."""

    type: ClassVar[str] = ""
    stream: str = field(default="downstream", kw_only=True)
    toxicity: float = field(default=1.0, kw_only=True)

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_number(
            "toxicity", self.toxicity, low=0.0, high=1.0, hint="toxicity is the share of connections hit: 0.0 to 1.0"
        )

    def attributes(self) -> dict[str, int]:
        """Return the Toxiproxy attributes of this toxic."""
        raise NotImplementedError

    def on(self, proxy: str | Endpoint, stack: Stack) -> ToxicFault:
        """Bind this toxic to ``proxy`` (a name like ``postgres``, or an ``Endpoint``) of ``stack``."""
        return ToxicFault(self, _proxy_name(proxy), _admin(stack))


@dataclass(frozen=True)
class Latency(ToxicSpec):
    """Delay every chunk of data by ``ms`` ± ``jitter_ms`` milliseconds."""

    type: ClassVar[str] = "latency"
    ms: int
    jitter_ms: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("latency ms", self.ms, hint="latency is a delay in whole milliseconds, e.g. Latency(ms=200)")
        check_int("jitter_ms", self.jitter_ms, hint="jitter is ± whole milliseconds around the latency; 0 for none")

    def attributes(self) -> dict[str, int]:
        return {"latency": self.ms, "jitter": self.jitter_ms}


@dataclass(frozen=True)
class Bandwidth(ToxicSpec):
    """Limit the connection to ``kb_per_s`` kilobytes per second."""

    type: ClassVar[str] = "bandwidth"
    kb_per_s: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("kb_per_s", self.kb_per_s, low=1, hint="give at least 1 KB/s; to stop all data use Timeout(ms=0)")

    def attributes(self) -> dict[str, int]:
        return {"rate": self.kb_per_s}


@dataclass(frozen=True)
class SlowClose(ToxicSpec):
    """Delay the close of the connection by ``delay_ms`` after the other side closed it."""

    type: ClassVar[str] = "slow_close"
    delay_ms: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("delay_ms", self.delay_ms, hint="the close delay is in whole milliseconds")

    def attributes(self) -> dict[str, int]:
        return {"delay": self.delay_ms}


@dataclass(frozen=True)
class Timeout(ToxicSpec):
    """Stop all data (a half-open connection); close it after ``ms``, or never when ``ms`` is 0."""

    type: ClassVar[str] = "timeout"
    ms: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("timeout ms", self.ms, hint="0 keeps the connection half-open until healed; else whole ms")

    def attributes(self) -> dict[str, int]:
        return {"timeout": self.ms}


@dataclass(frozen=True)
class ResetPeer(ToxicSpec):
    """Reset the connection (TCP RST) after ``timeout_ms``, at once when 0."""

    type: ClassVar[str] = "reset_peer"
    timeout_ms: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("timeout_ms", self.timeout_ms, hint="the delay before the reset, in whole ms (0: at once)")

    def attributes(self) -> dict[str, int]:
        return {"timeout": self.timeout_ms}


@dataclass(frozen=True)
class Slicer(ToxicSpec):
    """Cut data into ``avg_size`` ± ``size_variation`` byte pieces, ``delay_us`` microseconds apart."""

    type: ClassVar[str] = "slicer"
    avg_size: int
    size_variation: int = 0
    delay_us: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("avg_size", self.avg_size, low=1, hint="the average piece is at least 1 byte")
        check_int("size_variation", self.size_variation, hint="the variation is whole bytes, below avg_size")
        check_int("delay_us", self.delay_us, hint="the delay between pieces is whole microseconds")
        if self.size_variation >= self.avg_size:
            raise ConfigError(
                f"size_variation={self.size_variation} is not below avg_size={self.avg_size}",
                hint="pieces are avg_size ± size_variation bytes: make size_variation smaller than avg_size",
            )

    def attributes(self) -> dict[str, int]:
        return {"average_size": self.avg_size, "size_variation": self.size_variation, "delay": self.delay_us}


@dataclass(frozen=True)
class LimitData(ToxicSpec):
    """Close the connection once ``bytes`` bytes went through (counted from when the toxic is added)."""

    type: ClassVar[str] = "limit_data"
    bytes: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("bytes", self.bytes, hint="the byte budget is a whole number (0 closes at the first byte)")

    def attributes(self) -> dict[str, int]:
        return {"bytes": self.bytes}


@dataclass(frozen=True)
class ToxicFault:
    """A toxic bound to one proxy: ``apply`` adds it, ``heal`` removes it."""

    spec: ToxicSpec
    proxy: str
    admin: ToxiproxyAdmin = field(compare=False, repr=False)
    # Unique per process and fault: two identical toxics on one proxy must not share a name (409).
    toxic: str = field(default_factory=lambda: f"txchaos-{os.getpid()}-{next(_SEQ)}", compare=False)

    @property
    def name(self) -> str:
        return f"{self.spec.type}:{self.proxy}:{self.spec.stream}"

    def params(self) -> dict[str, object]:
        return {"proxy": self.proxy, "toxic": self.toxic, "type": self.spec.type, **asdict(self.spec)}

    def apply(self) -> None:
        self.admin.add_toxic(
            self.proxy,
            type=self.spec.type,
            name=self.toxic,
            stream=self.spec.stream,
            toxicity=float(self.spec.toxicity),
            attributes=self.spec.attributes(),
        )

    def heal(self) -> None:
        self.admin.remove_toxic(self.proxy, self.toxic)


@dataclass(frozen=True)
class Partition:
    """Cut every connection through a proxy and refuse new ones (the proxy disabled)."""

    def on(self, proxy: str | Endpoint, stack: Stack) -> PartitionFault:
        """Bind the partition to ``proxy`` of ``stack``."""
        return PartitionFault(_proxy_name(proxy), _admin(stack))


@dataclass(frozen=True)
class PartitionFault:
    """A disabled proxy: ``apply`` disables it, ``heal`` enables it again."""

    proxy: str
    admin: ToxiproxyAdmin = field(compare=False, repr=False)

    @property
    def name(self) -> str:
        return f"partition:{self.proxy}"

    def params(self) -> dict[str, object]:
        return {"proxy": self.proxy}

    def apply(self) -> None:
        self.admin.set_enabled(self.proxy, False)

    def heal(self) -> None:
        self.admin.set_enabled(self.proxy, True)
