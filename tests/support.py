"""Shared test helpers: a scenario spec built from defaults, and the checks of a refusal."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from harness import ConfigError, ScenarioSpec

# The fields of a small valid spec of each flow the unit tests build; a test's own keywords win.
ONEPC: Mapping[str, object] = {
    "name": "onepc",
    "variant": "naive",
    "handler": "harness.patterns.onepc:naive",
    "schema": "onepc",
    "effect_table": "onepc_effects",
}
KAFKA: Mapping[str, object] = {
    "name": "kafka_consumer",
    "variant": "naive",
    "flow": "kafka",
    "handler": "harness.patterns.kafka_consumer:naive",
    "schema": "kafka_consumer",
    "effect_table": "kafka_effects",
}


def make_spec(base: Mapping[str, object] = ONEPC, /, **fields: object) -> ScenarioSpec:
    """Return the ScenarioSpec of ``base``'s fields with ``fields`` over them."""
    return ScenarioSpec(**{**base, **fields})  # type: ignore[arg-type]


def refused(make: Callable[[], object], *named: str) -> ConfigError:
    """Return the ConfigError ``make()`` raises, after checking its text holds each of ``named``.

    ``named`` is what the message must say: the bad value, and the fix its hint gives.
    """
    with pytest.raises(ConfigError) as info:
        make()
    text = str(info.value)
    for part in named:
        assert part in text, f"{part!r} not in the refusal: {text}"
    assert info.value.exit_code == 2
    return info.value
