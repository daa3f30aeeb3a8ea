"""The verification model both engines evaluate: per-operation counts, then anomaly rules.

An engine groups the ledger by ``op`` and counts each kind listed in ``COUNTS``; the result is
the *operation summary*, one row per operation id. Every anomaly class is a predicate over that
summary (``rules``), written in the small expression language below so the in-process engine
(pyarrow) and the Spark engine evaluate the very same rule, not two hand-kept copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.ledger.schema import Kind

# Summary column -> the event kind it counts, per operation id.
COUNTS: dict[str, Kind] = {
    "submitted": Kind.SUBMIT,
    "deliveries": Kind.DELIVER,
    "effects": Kind.RESIDUE_EFFECT,
    "downstream": Kind.DOWNSTREAM,
    "dead_letters": Kind.DEAD_LETTER,
    "in_queue": Kind.RESIDUE_QUEUE,
    "crashes": Kind.CRASH,
    "external_calls": Kind.EXTERNAL_CALL,
    "skips": Kind.SKIP,
}

# Anomaly classes of DESIGN.md, in the order a verdict lists them.
ANOMALY_CLASSES: tuple[str, ...] = (
    "lost",
    "duplicate-effect",
    "duplicate-external-call",
    "orphan-effect",
    "stuck",
    "dead-lettered",
    "dead-lettered-with-effect",
    "never-dead-lettered-poison",
    "in-doubt",
    "resurrected",
    "out-of-order",
)

CmpOp = Literal["==", "!=", ">", ">=", "<", "<="]


@dataclass(frozen=True)
class Cmp:
    """``column <op> value`` where value is an integer or another summary column's name."""

    column: str
    op: CmpOp
    value: int | str


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Pred, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Pred, ...]


Pred = Cmp | AllOf | AnyOf


def all_of(*parts: Pred) -> AllOf:
    return AllOf(parts)


def any_of(*parts: Pred) -> AnyOf:
    return AnyOf(parts)


@dataclass(frozen=True)
class FlowContract:
    """What a flow promises for each submitted operation; chooses which rules apply.

    ``expects_downstream``: the flow emits one outgoing message per operation, so an applied
    effect without one means the flow stopped.
    """

    expects_downstream: bool = True
    max_external_calls: int = 1


def rules(contract: FlowContract) -> dict[str, Pred]:
    """Return anomaly class -> predicate over the operation summary, for ``contract``."""
    not_parked = all_of(Cmp("dead_letters", "==", 0), Cmp("in_queue", "==", 0))
    missing_output: Pred = Cmp("effects", "==", 0)
    if contract.expects_downstream:
        missing_output = any_of(missing_output, Cmp("downstream", "==", 0))
    return {
        "lost": all_of(Cmp("submitted", ">", 0), not_parked, missing_output),
        "duplicate-effect": all_of(Cmp("submitted", ">", 0), Cmp("effects", ">", 1)),
        "duplicate-external-call": Cmp("external_calls", ">", contract.max_external_calls),
        "orphan-effect": all_of(Cmp("submitted", "==", 0), Cmp("effects", ">", 0)),
        "stuck": all_of(Cmp("in_queue", ">", 0), Cmp("dead_letters", "==", 0)),
        "dead-lettered": all_of(Cmp("dead_letters", ">", 0), Cmp("effects", "==", 0)),
        "dead-lettered-with-effect": all_of(Cmp("dead_letters", ">", 0), Cmp("effects", ">", 0)),
    }


def describe(pred: Pred) -> str:
    """Render a predicate as text, for verdicts and docs."""
    if isinstance(pred, Cmp):
        return f"{pred.column} {pred.op} {pred.value}"
    joiner = " and " if isinstance(pred, AllOf) else " or "
    return "(" + joiner.join(describe(p) for p in pred.parts) + ")"
