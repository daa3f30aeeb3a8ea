"""Scenario specs: frozen, validated before any service starts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.errors import ConfigError
from harness.verify.model import ANOMALY_CLASSES, FlowContract
from harness.worker.crash import STAGE_POINTS

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")


@dataclass(frozen=True)
class Crash:
    """Crash the worker at ``point`` while it processes operation number ``op_index`` (0-based).

    ``op_index=None`` with ``nth`` means the nth time any worker reaches the point.
    """

    point: str
    op_index: int | None = None
    nth: int | None = None

    def describe(self, ops: list[str]) -> str:
        on = f"op {ops[self.op_index]}" if self.op_index is not None else f"hit #{self.nth}"
        return f"arm crash at {self.point} on {on}"


@dataclass(frozen=True)
class ScenarioSpec:
    """One seed pattern under one set of faults, with the verdict it must produce.

    >>> ScenarioSpec(name="onepc", variant="naive", handler="harness.patterns.onepc:naive",
    ...              schema="onepc", effect_table="onepc_effects",
    ...              crashes=(Crash("after_db_commit", op_index=3),), expect=frozenset({"duplicate-effect"}))
    """

    name: str
    variant: str
    handler: str
    schema: str
    effect_table: str
    effect_column: str = "op_id"
    messages: int = 20
    workers: int = 1
    crashes: tuple[Crash, ...] = ()
    seed: int = 0
    timeout_s: float = 60.0
    settle_s: float = 0.5
    options: dict[str, object] = field(default_factory=dict)
    contract: FlowContract = field(default_factory=FlowContract)
    expect: frozenset[str] = frozenset()
    description: str = ""

    def __post_init__(self) -> None:
        for label, value in (("name", self.name), ("variant", self.variant)):
            if not _NAME.match(value):
                raise ConfigError(
                    f"scenario {label} {value!r} is not a simple name",
                    hint="use lower-case letters, digits, '-' and '_' (at most 41 characters)",
                )
        if ":" not in self.handler:
            raise ConfigError(
                f"handler {self.handler!r} is not an import path", hint="write it as 'package.module:function'"
            )
        if not 1 <= self.messages <= 1_000_000:
            raise ConfigError(f"messages={self.messages} is out of range", hint="choose 1 to 1,000,000 messages")
        if not 1 <= self.workers <= 16:
            raise ConfigError(
                f"workers={self.workers} is out of range", hint="choose 1 to 16 workers (the machine has 2 cores)"
            )
        if self.timeout_s <= 0 or self.settle_s < 0:
            raise ConfigError(
                f"timeout_s={self.timeout_s}, settle_s={self.settle_s}",
                hint="timeout_s must be > 0 and settle_s >= 0 seconds",
            )
        for crash in self.crashes:
            if crash.point not in STAGE_POINTS:
                raise ConfigError(f"unknown crash point {crash.point!r}", hint=f"use one of {', '.join(STAGE_POINTS)}")
            if crash.op_index is None and crash.nth is None:
                raise ConfigError(
                    f"crash at {crash.point} names no message",
                    hint="give op_index (which operation) or nth (which hit of the point)",
                )
            if crash.op_index is not None and not 0 <= crash.op_index < self.messages:
                raise ConfigError(
                    f"crash op_index={crash.op_index} but the scenario sends {self.messages} messages",
                    hint=f"choose an op_index from 0 to {self.messages - 1}",
                )
        unknown = self.expect - set(ANOMALY_CLASSES)
        if unknown:
            raise ConfigError(
                f"unknown anomaly class(es) {sorted(unknown)} in expect",
                hint=f"use classes from {', '.join(ANOMALY_CLASSES)}",
            )

    @property
    def label(self) -> str:
        return f"{self.name}:{self.variant}"
