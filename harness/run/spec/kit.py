"""Build a scenario's variants from what they share: one place for the fields every variant repeats."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

from harness.run.spec.scenario import ScenarioSpec

# Builds one variant: make(variant, handler, expect=(...), **fields the variant sets itself).
SpecMaker = Callable[..., ScenarioSpec]


def spec_maker(name: str, seed: int, pattern: str, **shared: Any) -> SpecMaker:
    """Return a builder of scenario ``name``'s variants at ``seed``, handlers in module ``pattern``.

    ``shared`` holds the ScenarioSpec fields every variant has; a variant's own keywords win over them.
    """

    def make(variant: str, handler: str, expect: Iterable[str] = (), **fields: Any) -> ScenarioSpec:
        return ScenarioSpec(
            **{
                "name": name,
                "variant": variant,
                "seed": seed,
                "handler": f"{pattern}:{handler}",
                "expect": frozenset(expect),
                **shared,
                **fields,
            }
        )

    return make


def by_variant(*specs: ScenarioSpec) -> dict[str, ScenarioSpec]:
    """Return ``specs`` keyed by their variant, in the order given (what ``variants(seed)`` returns)."""
    return {spec.variant: spec for spec in specs}


def op_name(variant: str, seed: int, n: int) -> str:
    """Return the id the run gives operation ``n`` of ``variant`` at ``seed`` (as RunSession.op_id)."""
    return f"{variant}-s{seed}-op{n:05d}"


def seeded_op(seed: int, stop: int, start: int = 0) -> int:
    """Return the operation number in ``[start, stop)`` chosen from ``seed``: the same seed, the same operation."""
    return random.Random(seed).randrange(start, stop)


def batch_of(index: int, size: int) -> range:
    """Return the operation numbers polled in one batch of ``size`` with ``index`` (one partition, a backlog)."""
    start = index // size * size
    return range(start, start + size)


def two_batches(seed: int, messages: int, size: int, first_from: int) -> tuple[int, int]:
    """Return an operation in a batch before the last (from ``first_from``) and one in a later batch."""
    rng = random.Random(seed)
    first = rng.randrange(first_from, messages - size)
    second = rng.randrange((first // size + 1) * size, messages)
    return first, second


def onepc_on(table: str = "onepc_effects") -> dict[str, Any]:
    """Return the fields of a 1PC variant writing its effects to ``table`` (the handlers take it as an option)."""
    return {"schema": "onepc", "effect_table": table, "options": {"table": table}}
