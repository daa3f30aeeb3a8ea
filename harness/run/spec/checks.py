"""Checks of spec values: each refuses a wrong type or range with a ConfigError naming the value and the fix."""

from __future__ import annotations

import math
import re

from harness.errors import ConfigError

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")


def check_name(label: str, value: object) -> None:
    """Refuse a name that is not lower-case letters, digits, '-' and '_'."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"{label} {value!r} is not a simple name",
            hint="use lower-case letters, digits, '-' and '_' (at most 41 characters)",
        )


_HANDLER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_handler(value: object) -> None:
    """Refuse a handler that is not written 'package.module:function'."""
    if not isinstance(value, str) or not _HANDLER.match(value):
        raise ConfigError(f"handler {value!r} is not an import path", hint="write it as 'package.module:function'")


def check_int(label: str, value: object, low: int, high: int) -> None:
    """Refuse anything but an int in [low, high]: a bool, a float or a numeric string included."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{label}={value!r} is a {type(value).__name__}, not a whole number",
            hint=f"write {label} as an int from {low:,} to {high:,}",
        )
    if not low <= value <= high:
        raise ConfigError(f"{label}={value} is out of range", hint=f"choose {label} from {low:,} to {high:,}")


def check_seconds(
    label: str, value: object, low: float, high: float, *, above_low: bool = False, unit: str = "seconds"
) -> None:
    """Refuse anything but a finite number of ``unit`` in the range (nan compares false to all)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(
            f"{label}={value!r} is not a finite number of {unit}", hint=f"write {label} as a number of {unit}"
        )
    if value < low or value > high or (above_low and value == low):
        low_text = f"> {low:,}" if above_low else f">= {low:,}"
        raise ConfigError(f"{label}={value} is out of range", hint=f"{label} must be {low_text} and <= {high:,} {unit}")


def check_identifier(label: str, value: object) -> None:
    """Refuse a table or column name that is not a plain SQL identifier."""
    # Table and column names go into SQL text quoted: a plain identifier keeps that safe.
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise ConfigError(
            f"{label} {value!r} is not a plain SQL identifier",
            hint="use letters, digits and '_' (not starting with a digit, at most 63 characters)",
        )


def check_options(label: str, value: object) -> None:
    """Refuse options that are not a dict with string keys."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{label} {value!r} is not a dict with string keys", hint="pass options as {'name': value}")


def check_items(label: str, value: object, kind: type, example: str) -> None:
    """Refuse a collection that is not a tuple (list, set) of ``kind``."""
    if not isinstance(value, tuple | list | frozenset | set) or not all(isinstance(v, kind) for v in value):
        raise ConfigError(f"{label}={value!r} is not a tuple of {kind.__name__}", hint=f"write {label}=({example},)")
