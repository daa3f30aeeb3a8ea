"""The seam every fault plugs into: the ``Fault`` protocol and ``active``, which always heals.

A fault is bound to its target before use (``Latency(200).on("activemq_stomp", endpoints)``),
so ``apply`` and ``heal`` take no arguments and a state machine can hold a list of them. ``heal``
must be idempotent: ``active`` may call it after a half-done ``apply``, or twice on Ctrl-C.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, runtime_checkable

from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter

STREAMS = ("upstream", "downstream")
_COLUMNS = frozenset({"op", "msg", "stage", "dest", "attempt", "point", "partition", "offset", "kind"})
F = TypeVar("F", bound="Fault")


@runtime_checkable
class Fault(Protocol):
    """Something that breaks part of the stack until healed."""

    @property
    def name(self) -> str:
        """Return a stable name for the ledger's ``point`` column, e.g. ``latency:postgres:downstream``."""
        ...

    def params(self) -> dict[str, object]:
        """Return the fault's parameters (the ledger event's detail)."""
        ...

    def apply(self) -> None: ...

    def heal(self) -> None: ...


@contextmanager
def active(fault: F, ledger: LedgerWriter | None = None) -> Iterator[F]:
    """Apply ``fault`` for the ``with`` body, then heal it, whatever the body raised.

    >>> with active(Latency(200).on("postgres", endpoints), ledger):
    ...     run_some_operations()
    """
    params = fault.params()
    _record(ledger, Kind.FAULT_START, fault.name, params)
    outcome: dict[str, object] = {}
    try:
        # apply() inside the try: a toxic added before apply() failed half-way still gets removed.
        fault.apply()
        yield fault
    except BaseException as exc:
        outcome["error"] = type(exc).__name__
        raise
    finally:
        started = time.monotonic()
        try:
            _heal(fault)
        except BaseException as exc:
            outcome["heal_error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            outcome["heal_s"] = round(time.monotonic() - started, 3)
            _record(ledger, Kind.FAULT_END, fault.name, {**params, **outcome})


def _record(ledger: LedgerWriter | None, kind: Kind, name: str, detail: dict[str, object]) -> None:
    if ledger is None:
        return
    # A parameter named like a ledger column (``offset``, ``partition``) must stay in the detail.
    safe: dict[str, Any] = {(f"fault_{k}" if k in _COLUMNS else k): v for k, v in detail.items()}
    ledger.emit(kind, point=name, **safe)


def _heal(fault: Fault) -> None:
    """Heal, and heal again if a second Ctrl-C interrupts the first attempt (then re-raise it)."""
    try:
        fault.heal()
    except KeyboardInterrupt:
        fault.heal()
        raise


# -- validation helpers shared by the fault specs ----------------------------------------------
def check_number(what: str, value: object, *, low: float = 0.0, high: float | None = None, hint: str = "") -> None:
    """Raise ConfigError unless ``value`` is a real number in [low, high]."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and value >= low and (high is None or value <= high):  # type: ignore[operator]
        return
    span = f"{low:g}..{high:g}" if high is not None else f">= {low:g}"
    raise ConfigError(f"{what}={value!r} is out of range ({span})", hint=hint or f"give {what} a number {span}")


def check_int(what: str, value: object, *, low: int = 0, hint: str = "") -> None:
    """Raise ConfigError unless ``value`` is an int >= ``low`` (Toxiproxy parses attributes as integers)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= low:
        return
    raise ConfigError(
        f"{what}={value!r} must be a whole number >= {low}",
        hint=hint or f"give {what} an int >= {low}; Toxiproxy rejects fractions",
    )


def check_stream(stream: object) -> None:
    """Raise ConfigError unless ``stream`` names a Toxiproxy direction."""
    if stream not in STREAMS:
        raise ConfigError(
            f"unknown direction stream={stream!r}",
            hint="use 'downstream' (server to client) or 'upstream' (client to server)",
        )


def check_name(what: str, value: object, choices: tuple[str, ...] = ()) -> None:
    """Raise ConfigError unless ``value`` is a non-empty name (one of ``choices`` when given)."""
    if isinstance(value, str) and value and (not choices or value in choices):
        return
    hint = f"use one of {', '.join(choices)}" if choices else f"name the {what}"
    raise ConfigError(f"bad {what} {value!r}", hint=hint)
