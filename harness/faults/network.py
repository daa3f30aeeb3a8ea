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
from typing import ClassVar, NamedTuple

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


class Setting(NamedTuple):
    """One whole-number setting of a toxic: its field, its Toxiproxy attribute, and how a bad value is named."""

    field: str
    attribute: str
    label: str
    hint: str
    low: int = 0


@dataclass(frozen=True)
class ToxicSpec:
    """Fields every toxic has: the direction it acts on and the share of connections it hits."""

    type: ClassVar[str] = ""
    # The toxic's whole-number settings, checked in order and sent as its Toxiproxy attributes.
    settings: ClassVar[tuple[Setting, ...]] = ()
    # True when data still passes under the toxic, only later or slower: a client keeps working.
    slows_only: ClassVar[bool] = False
    stream: str = field(default="downstream", kw_only=True)
    toxicity: float = field(default=1.0, kw_only=True)

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_number(
            "toxicity", self.toxicity, low=0.0, high=1.0, hint="toxicity is the share of connections hit: 0.0 to 1.0"
        )
        for setting in self.settings:
            check_int(setting.label, getattr(self, setting.field), low=setting.low, hint=setting.hint)

    def attributes(self) -> dict[str, int]:
        """Return the Toxiproxy attributes of this toxic."""
        return {setting.attribute: getattr(self, setting.field) for setting in self.settings}

    def on(self, proxy: str | Endpoint, stack: Stack) -> ToxicFault:
        """Bind this toxic to ``proxy`` (a name like ``postgres``, or an ``Endpoint``) of ``stack``."""
        return ToxicFault(self, _proxy_name(proxy), _admin(stack))


@dataclass(frozen=True)
class Latency(ToxicSpec):
    """Delay every chunk of data by ``ms`` ± ``jitter_ms`` milliseconds."""

    type: ClassVar[str] = "latency"
    slows_only: ClassVar[bool] = True
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("ms", "latency", "latency ms", "latency is a delay in whole milliseconds, e.g. Latency(ms=200)"),
        Setting("jitter_ms", "jitter", "jitter_ms", "jitter is ± whole milliseconds around the latency; 0 for none"),
    )
    ms: int
    jitter_ms: int = 0


@dataclass(frozen=True)
class Bandwidth(ToxicSpec):
    """Limit the connection to ``kb_per_s`` kilobytes per second."""

    type: ClassVar[str] = "bandwidth"
    slows_only: ClassVar[bool] = True
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("kb_per_s", "rate", "kb_per_s", "give at least 1 KB/s; to stop all data use Timeout(ms=0)", low=1),
    )
    kb_per_s: int


@dataclass(frozen=True)
class SlowClose(ToxicSpec):
    """Delay the close of the connection by ``delay_ms`` after the other side closed it."""

    type: ClassVar[str] = "slow_close"
    slows_only: ClassVar[bool] = True
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("delay_ms", "delay", "delay_ms", "the close delay is in whole milliseconds"),
    )
    delay_ms: int


@dataclass(frozen=True)
class Timeout(ToxicSpec):
    """Stop all data (a half-open connection); close it after ``ms``, or never when ``ms`` is 0."""

    type: ClassVar[str] = "timeout"
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("ms", "timeout", "timeout ms", "0 keeps the connection half-open until healed; else whole ms"),
    )
    ms: int = 0


@dataclass(frozen=True)
class ResetPeer(ToxicSpec):
    """Reset the connection (TCP RST) after ``timeout_ms``, at once when 0."""

    type: ClassVar[str] = "reset_peer"
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("timeout_ms", "timeout", "timeout_ms", "the delay before the reset, in whole ms (0: at once)"),
    )
    timeout_ms: int = 0


@dataclass(frozen=True)
class Slicer(ToxicSpec):
    """Cut data into ``avg_size`` ± ``size_variation`` byte pieces, ``delay_us`` microseconds apart."""

    type: ClassVar[str] = "slicer"
    slows_only: ClassVar[bool] = True
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("avg_size", "average_size", "avg_size", "the average piece is at least 1 byte", low=1),
        Setting("size_variation", "size_variation", "size_variation", "the variation is whole bytes, below avg_size"),
        Setting("delay_us", "delay", "delay_us", "the delay between pieces is whole microseconds"),
    )
    avg_size: int
    size_variation: int = 0
    delay_us: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.size_variation >= self.avg_size:
            raise ConfigError(
                f"size_variation={self.size_variation} is not below avg_size={self.avg_size}",
                hint="pieces are avg_size ± size_variation bytes: make size_variation smaller than avg_size",
            )


@dataclass(frozen=True)
class LimitData(ToxicSpec):
    """Close the connection once ``bytes`` bytes went through (counted from when the toxic is added)."""

    type: ClassVar[str] = "limit_data"
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting("bytes", "bytes", "bytes", "the byte budget is a whole number (0 closes at the first byte)"),
    )
    bytes: int


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
