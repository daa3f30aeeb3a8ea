"""The verification model both engines evaluate: per-operation counts, then anomaly rules.

An engine groups the ledger by ``op`` and counts each kind listed in ``COUNTS``; the result is
the *operation summary*, one row per operation id. Every anomaly class is a predicate over that
summary (``rules``), written in the small expression language below so the in-process engine
(pyarrow) and the Spark engine evaluate the very same rule, not two hand-kept copies.

Besides the counts, the summary holds the first timestamp of the kinds in ``FIRST_TS`` and the
operation's span (first and last event outside ``SNAPSHOT_KINDS``, which are written when the run
closes its books and would stretch every span to it). What the sink reads while the run goes on
(an output, a dead letter) ends the span: a service that writes no event of its own is in flight
from its submission to its output. The span is what fault windows are overlaid on.
Statistics use the integer bucketing below so both engines produce identical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.errors import ConfigError
from harness.ledger.schema import RESIDUE_KINDS, Kind

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
    "prepared": Kind.PREPARE,
    "aborted": Kind.ABORT_PREPARED,
    "alerts": Kind.ALERT,
    "outbox_pending": Kind.RESIDUE_OUTBOX,
    # only a broken invariant's event carries an op (``ledger/schema.py``): this counts breaks
    "invariant_breaks": Kind.RESIDUE_INVARIANT,
}

# Summary column -> (kind, detail field): that integer field summed over the op's events of the kind.
# ``applied`` is the declared effect (``FlowContract.effect_sql``): how many times the user's own
# tables say the operation was applied; ops the query does not return were applied 0 times.
SUMS: dict[str, tuple[Kind, str]] = {"applied": (Kind.RESIDUE_DECLARED, "applied")}


def summed(contract: FlowContract) -> frozenset[str]:
    """Return the ``SUMS`` columns an engine computes for ``contract``; the others are 0.

    Only a declared effect gives ``applied`` a meaning, and parsing ``detail`` is the costly part
    of a summary: a contract that declares none skips it in both engines alike.
    """
    return frozenset({"applied"} if contract.effect_sql else ())


# Summary column -> (kind, n): events of that kind whose ``attempt`` is above n. A redelivery is
# a delivery attempt after the first of the same stage; ``deliveries`` counts every stage's.
ATTEMPT_COUNTS: dict[str, tuple[Kind, int]] = {"redeliveries": (Kind.DELIVER, 1)}

# Summary column -> the kind whose earliest timestamp it holds (null when the op has none).
FIRST_TS: dict[str, Kind] = {"submit_ns": Kind.SUBMIT, "downstream_ns": Kind.DOWNSTREAM}

# Kinds written only when the run closes its books (the end-state snapshot). Without them an
# operation's fate is unknown: it may have been applied, parked or still in flight.
# Every residue kind but what the sink reads while the run goes on (outputs, dead letters): derived,
# so a residue kind added to the ledger schema is a snapshot kind without a second list to keep.
SNAPSHOT_KINDS: frozenset[Kind] = RESIDUE_KINDS - {Kind.DOWNSTREAM, Kind.DEAD_LETTER}

# Kinds that do not extend an operation's span (first_ns, last_ns): the snapshot's, written at the end.
SPAN_EXCLUDED: frozenset[Kind] = SNAPSHOT_KINDS

# Latency buckets keep three significant digits: (below this many us, round down to a multiple of).
LATENCY_SCALES: tuple[tuple[int, int], ...] = (
    (1_000, 1),
    (10_000, 10),
    (100_000, 100),
    (1_000_000, 1_000),
    (10_000_000, 10_000),
    (100_000_000, 100_000),
    (1_000_000_000, 1_000_000),
)
LATENCY_TOP_SCALE = 10_000_000  # above 1000 s
DELIVERY_HIST_CAP = 10  # deliveries per op histogram: "0".."9" and "10+"

# Anomaly classes of DESIGN.md, in the order a verdict lists them.
ANOMALY_CLASSES: tuple[str, ...] = (
    "lost",
    "duplicate-effect",
    "duplicate-external-call",
    "orphan-effect",
    "orphan-outbox",
    "stuck",
    "dead-lettered",
    "dead-lettered-with-effect",
    "never-dead-lettered-poison",
    "in-doubt",
    "resurrected",
    "out-of-order",
    "duplicate-output",
    "invariant-broken",
)

# Classes without a rule (every class has one now; kept for readers that list them).
UNRULED_CLASSES: frozenset[str] = frozenset()

# Per-key summary columns (only for a contract with ``per_key``): per operation, how many of its
# per-key facts break the order of its aggregate. Both engines derive them from the ledger's
# per-key view (``ledger/schema.py``: ``submit``, ``residue_apply``, ``residue_entity`` details):
#
# - ``regressions``: apply journal rows of the op whose version is below the highest version the
#   replica had already applied for that key (an older event applied after a newer one).
# - ``resurrections``: apply journal rows of the op that are not tombstones and whose version is
#   below a tombstone already applied for that key (re-created by an older event after its
#   delete), plus replica rows at quiescence last written by the op that are live although the
#   key's highest submitted version is a tombstone (deleted at the source, alive in the replica).
PER_KEY_COLUMNS: tuple[str, ...] = ("resurrections", "regressions")

CmpOp = Literal["==", "!=", ">", ">=", "<", "<="]
Scope = Literal["global", "op"]
INVARIANT_OP_PREFIX = "invariant:"  # the op id a broken global invariant is judged under


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
class Invariant:
    """A property of the final state, as SQL the harness runs at quiescence (``verify/declared.py``).

    ``scope="global"``: the query returns one row ``(actual, expected)``; ``scope="op"``: one row
    per operation it checks, ``(op_id, actual, expected)``. Values are integers; ``:submitted``
    binds to the number of submitted operations. ``label`` names the actual value in the verdict
    (default: ``name``). Example, a conserved total over 10 accounts seeded with 100 each::

        Invariant("conserved-total", "SELECT sum(balance) AS actual, 1000 AS expected FROM accounts",
                  label="sum(accounts.balance)")
    """

    name: str
    sql: str
    scope: Scope = "global"
    label: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"invariant name {self.name!r} is not a name", hint="use letters, digits, '-' or '_'")
        if not self.sql.strip():
            raise ConfigError(
                f"invariant {self.name!r} has no SQL", hint="give a query, e.g. SELECT sum(x) AS actual, 0 AS expected"
            )
        if self.scope not in ("global", "op"):
            raise ConfigError(
                f"invariant {self.name!r}: scope {self.scope!r} is not 'global' or 'op'",
                hint="scope='global' for one (actual, expected) row, 'op' for (op_id, actual, expected) rows",
            )

    @property
    def shown(self) -> str:
        """Return how the verdict names the invariant's value."""
        return self.label or self.name


@dataclass(frozen=True)
class FlowContract:
    """What a flow promises for each submitted operation; chooses which rules apply.

    ``expects_downstream``: the flow emits one outgoing message per operation, so an applied
    effect without one means the flow stopped.
    ``max_deliveries``: more deliveries than this, never dead-lettered and never applied, is a
    poison message the flow redelivers forever; None switches the rule off.
    ``min_external_calls``: the operation's real effect is an external call (a transfer): an
    operation that was not parked (DLQ, queue) and made fewer calls is lost, whatever it booked.
    ``per_key``: operations are entity events keyed by aggregate id, and the replica promises
    per-key order: the ``resurrected`` and ``out-of-order`` rules apply (``PER_KEY_COLUMNS``).
    ``effect_sql``: the declared effect, SQL over the user's tables returning ``(op_id, applied)``
    (how many times each operation was applied); ``lost`` and ``duplicate-effect`` then read it
    instead of the effect table's rows, which a double-apply that adds no row never changes.
    ``invariants``: properties of the final state (``Invariant``); a broken one is ``invariant-broken``.
    ``exactly_once_output``: the flow promises one output message per operation (a transactional
    producer read ``read_committed``, an outbox with an inbox): a second one is ``duplicate-output``.
    """

    expects_downstream: bool = True
    max_external_calls: int = 1
    min_external_calls: int = 0
    max_deliveries: int | None = 10
    per_key: bool = False
    effect_sql: str | None = None
    invariants: tuple[Invariant, ...] = ()
    exactly_once_output: bool = False

    def __post_init__(self) -> None:
        # A manifest read back holds the invariants as JSON objects: make them Invariants again.
        parsed = tuple(i if isinstance(i, Invariant) else Invariant(**i) for i in self.invariants)
        object.__setattr__(self, "invariants", parsed)
        names = [i.name for i in parsed]
        if len(set(names)) != len(names):
            raise ConfigError(f"invariant names repeat: {names}", hint="give each invariant its own name")
        if self.effect_sql is not None and not self.effect_sql.strip():
            raise ConfigError(
                "effect_sql is empty",
                hint="give a query returning (op_id, applied), or leave it None to count the effect table's rows",
            )

    @property
    def effect_column(self) -> str:
        """Return the summary column that says how many times an operation was applied."""
        return "applied" if self.effect_sql else "effects"


def rules(contract: FlowContract) -> dict[str, Pred]:
    """Return anomaly class -> predicate over the operation summary, for ``contract``."""
    not_parked = all_of(Cmp("dead_letters", "==", 0), Cmp("in_queue", "==", 0))
    eff = contract.effect_column
    missing_output: Pred = Cmp(eff, "==", 0)
    if contract.expects_downstream:
        missing_output = any_of(missing_output, Cmp("downstream", "==", 0))
    if contract.min_external_calls > 0:
        missing_output = any_of(missing_output, Cmp("external_calls", "<", contract.min_external_calls))
    out: dict[str, Pred] = {
        # An op whose outbox row was never relayed is not lost but parked there: orphan-outbox.
        "lost": all_of(Cmp("submitted", ">", 0), not_parked, Cmp("outbox_pending", "==", 0), missing_output),
        "duplicate-effect": all_of(Cmp("submitted", ">", 0), Cmp(eff, ">", 1)),
        "duplicate-external-call": Cmp("external_calls", ">", contract.max_external_calls),
        "orphan-effect": all_of(Cmp("submitted", "==", 0), Cmp(eff, ">", 0)),
        "orphan-outbox": Cmp("outbox_pending", ">", 0),
        "stuck": all_of(Cmp("in_queue", ">", 0), Cmp("dead_letters", "==", 0)),
        # A stage that diverts a message it must not process and raises an alert (a refused double
        # delivery, a poison message) does what it should: that dead letter is not an anomaly.
        "dead-lettered": all_of(Cmp("dead_letters", ">", 0), Cmp(eff, "==", 0), Cmp("alerts", "==", 0)),
        "dead-lettered-with-effect": all_of(Cmp("dead_letters", ">", 0), Cmp(eff, ">", 0)),
    }
    if contract.max_deliveries is not None:
        out["never-dead-lettered-poison"] = all_of(
            Cmp("deliveries", ">", contract.max_deliveries), Cmp("dead_letters", "==", 0), Cmp(eff, "==", 0)
        )
    out["in-doubt"] = all_of(Cmp("prepared", ">", 0), Cmp("submitted", "==", 0), Cmp("aborted", "==", 0))
    if contract.per_key:
        out["resurrected"] = Cmp("resurrections", ">", 0)
        out["out-of-order"] = Cmp("regressions", ">", 0)
    if contract.exactly_once_output:
        out["duplicate-output"] = all_of(Cmp("submitted", ">", 0), Cmp("downstream", ">", 1))
    if contract.invariants:
        out["invariant-broken"] = Cmp("invariant_breaks", ">", 0)
    return out


# Summary columns that count the snapshot (per-key columns are derived from the replica journal).
SNAPSHOT_COLUMNS: frozenset[str] = frozenset(
    {n for n, k in COUNTS.items() if k in SNAPSHOT_KINDS}
    | {n for n, (k, _) in SUMS.items() if k in SNAPSHOT_KINDS}
    | set(PER_KEY_COLUMNS)
)


def columns_of(pred: Pred) -> set[str]:
    """Return the summary columns a predicate reads."""
    if isinstance(pred, Cmp):
        return {pred.column} | ({pred.value} if isinstance(pred.value, str) else set())
    return set().union(*(columns_of(p) for p in pred.parts))


def presence_only(pred: Pred) -> bool:
    """Tell whether a predicate only asks for events to be present (``col > n``, ``col >= n``).

    Such a rule cannot be made true by a missing event: what it finds in a partial ledger is
    there in the whole one. A rule that tests ``== 0`` or ``<`` judges an absence, and an absence
    proves nothing when part of the ledger is missing.
    """
    if isinstance(pred, Cmp):
        return pred.op in (">", ">=") and isinstance(pred.value, int)
    return all(presence_only(p) for p in pred.parts)


def judged_rules(contract: FlowContract, *, snapshot: bool = True, intact: bool = True) -> dict[str, Pred]:
    """Return the rules the evidence can decide: all of them for a complete, intact ledger.

    ``snapshot``: the run closed its books (its end-state snapshot is in the ledger); without it a
    rule reading a snapshot column cannot fire and one judging an absence would guess.
    ``intact``: no ledger line was damaged; with damaged lines only presence rules are decided.
    The classes left out are the verdict's ``unjudged``.
    """
    out = rules(contract)
    if snapshot and intact:
        return out
    return {
        cls: pred
        for cls, pred in out.items()
        if presence_only(pred) and (snapshot or not columns_of(pred) & SNAPSHOT_COLUMNS)
    }


def latency_bucket_us(latency_us: int) -> int:
    """Round a non-negative latency in us down to three significant digits (the shared histogram)."""
    for below, scale in LATENCY_SCALES:
        if latency_us < below:
            return latency_us - latency_us % scale
    return latency_us - latency_us % LATENCY_TOP_SCALE


def describe(pred: Pred) -> str:
    """Render a predicate as text, for verdicts and docs."""
    if isinstance(pred, Cmp):
        return f"{pred.column} {pred.op} {pred.value}"
    joiner = " and " if isinstance(pred, AllOf) else " or "
    return "(" + joiner.join(describe(p) for p in pred.parts) + ")"
