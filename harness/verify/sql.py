"""The verification model as SQL text, generated once from ``model.py`` for both engines.

DuckDB (``checker.py``) and Spark SQL (``spark.py``) run the very same expressions: the
per-operation measures of the summary, each anomaly rule, the latency bucket and the per-key
facts. The two dialects differ only in how they read an integer out of the JSON ``detail`` and in
integer division (``Dialect``), so a rule changed in ``model.py`` changes in both engines at once
and they cannot drift. Every expression tests the integer ``kind_code`` (``ledger/layout.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.ledger.layout import KIND_CODES
from harness.ledger.schema import Kind
from harness.verify import model


@dataclass(frozen=True)
class Dialect:
    """What differs between the engines' SQL: JSON field access, integer division, and how a
    per-operation count or timestamp is aggregated (the same value, each engine's fastest form)."""

    name: str
    json_text: str  # format with (column, field): the field as text, null when absent
    int_div: str  # format with (a, b): a / b rounded toward zero, as an integer
    # format with (condition,): how many of an operation's events meet it. DuckDB counts with a
    # FILTER clause (its 10M-event summary 1.0 -> 0.87 s) as an INT: a sum would be a 16-byte
    # HUGEINT, and that summary took 353 MB of the 384 MB pool (as INT 182 MB). Spark sums a CASE;
    # its sums are longs.
    count_if: str = "sum(CASE WHEN {0} THEN 1 ELSE 0 END)"
    # format with (min or max, condition): the earliest or latest ts_ns of the events that meet it
    ts_if: str = "{0}(CASE WHEN {1} THEN ts_ns END)"
    # The per-operation counts (``model.COUNTS``, ``model.ATTEMPT_COUNTS``) added up ``pack_slots``
    # to a sum of this integer type, ``pack_bits`` bits a count (``packed_counts``), not one
    # aggregate each; "" for one aggregate a count. ``shift``: format with (a, n), a >> n.
    packed: str = ""
    pack_bits: int = 0
    pack_slots: int = 0
    shift: str = "({0} >> {1})"


DUCKDB = Dialect(
    "duckdb",
    "json_extract_string({0}, '$.{1}')",
    "(({0}) // {1})",
    "CAST(count(*) FILTER (WHERE {0}) AS INT)",
    "{0}(ts_ns) FILTER (WHERE {1})",
)
# The engines' own: every aggregate of a group-by updates the operation's state once an event,
# whatever the event's kind, so the 16 counts go in a few sums (each event adds its kind's bits).
# DuckDB: four 128-bit sums, the 10M-event summary 0.80-0.85 -> 0.70-0.74 s, the timestamps as a
# CASE a little faster than a FILTER. Spark: eight 64-bit sums of two 31-bit counts. ``DUCKDB`` is
# the query written plainly, the benchmark's floor (which reads only the counts its rules do, and
# is faster plain). A count is exact below ``PACKED_MAX_ROWS``, which no operation of a ledger of
# fewer rows can reach: the engines judge a larger one with the plain dialect (``packing``).
DUCKDB_PACKED = Dialect(
    "duckdb-packed",
    DUCKDB.json_text,
    DUCKDB.int_div,
    DUCKDB.count_if,
    "{0}(CASE WHEN {1} THEN ts_ns END)",
    packed="HUGEINT",
    pack_bits=32,
    pack_slots=4,
)
SPARK = Dialect("spark", "get_json_object({0}, '$.{1}')", "(({0}) div {1})")
SPARK_PACKED = Dialect(
    "spark-packed",
    SPARK.json_text,
    SPARK.int_div,
    packed="BIGINT",
    pack_bits=31,
    pack_slots=2,
    shift="shiftright({0}, {1})",
)
PACKED_MAX_ROWS = 1 << 31  # below it a count fits a slot of 31 bits or more, the sign clear, and the INT it is read as


def packing(packed: Dialect, plain: Dialect, rows: int) -> Dialect:
    """Return ``packed`` for a ledger of ``rows`` events when its counts fit their slots, else ``plain``."""
    return packed if rows < PACKED_MAX_ROWS else plain


_SQL_OPS = {"==": "=", "!=": "<>", ">": ">", ">=": ">=", "<": "<", "<=": "<="}


def is_kind(*kinds: Kind) -> str:
    """Return ``kind in kinds`` as a test of the integer ``kind_code``."""
    codes = sorted({KIND_CODES[str(k)] for k in kinds})
    if len(codes) == 1:
        return f"kind_code = {codes[0]}"
    if codes[-1] - codes[0] == len(codes) - 1:  # a run of codes (the residue kinds): two comparisons
        return f"kind_code BETWEEN {codes[0]} AND {codes[-1]}"  # 0.1 s of 0.6 at 10M events, against IN
    return f"kind_code IN ({', '.join(map(str, codes))})"


def predicate(pred: model.Pred) -> str:
    """Translate a model predicate into a SQL boolean over the summary's columns."""
    if isinstance(pred, model.Cmp):
        return f"{pred.column} {_SQL_OPS[pred.op]} {pred.value}"
    joiner = " AND " if isinstance(pred, model.AllOf) else " OR "
    return "(" + joiner.join(predicate(p) for p in pred.parts) + ")"


def json_int(d: Dialect, field: str, column: str = "detail") -> str:
    """Return the integer ``column.field`` (null when absent or not a number)."""
    return f"CAST({d.json_text.format(column, field)} AS BIGINT)"


def _counted() -> dict[str, tuple[Kind, str]]:
    """Return count column -> (the kind it counts, a further condition on the event or "")."""
    out = {n: (k, "") for n, k in model.COUNTS.items()}
    return out | {n: (k, f"attempt > {above}") for n, (k, above) in model.ATTEMPT_COUNTS.items()}


def packed_counts(d: Dialect) -> tuple[dict[str, str], dict[str, str]]:
    """Return the packed sums (``_pN`` -> aggregate) and count column -> its expression over them.

    Each event adds, to the sum of each word, 2**(pack_bits * slot) for every count of that word it
    meets: one CASE on ``kind_code`` a word, the events of no counted kind adding nothing.
    """
    counted = list(_counted().items())
    sums, columns = {}, {}
    bits, slots = d.pack_bits, d.pack_slots
    mask = (1 << bits) - 1
    for w in range(0, len(counted), slots):
        name = f"_p{w // slots}"
        by_code: dict[int, list[str]] = {}
        for slot, (column, (kind, cond)) in enumerate(counted[w : w + slots]):
            bit = f"CAST({1 << bits * slot} AS {d.packed})"
            add = f"CASE WHEN {cond} THEN {bit} ELSE 0 END" if cond else bit
            by_code.setdefault(KIND_CODES[str(kind)], []).append(add)
            # null when the operation has no event of the word's kinds
            columns[column] = f"CAST({d.shift.format(f'coalesce({name}, 0)', bits * slot)} & {mask} AS INT)"
        whens = " ".join(f"WHEN {code} THEN {' + '.join(adds)}" for code, adds in sorted(by_code.items()))
        sums[name] = f"sum(CASE kind_code {whens} END)"
    return sums, columns


def unpacked(contract: model.FlowContract, d: Dialect) -> dict[str, str]:
    """Return, for a packed dialect, summary column -> its expression after the group-by: each count
    read out of its sum, and the ``model.SUMS`` columns ``measures`` leaves out for ``contract`` (0)."""
    zeros = {n: "CAST(0 AS BIGINT)" for n in model.SUMS if n not in model.summed(contract)}
    return packed_counts(d)[1] | zeros


def measures(contract: model.FlowContract, d: Dialect) -> dict[str, str]:
    """Return summary column -> its aggregate over one operation's events.

    The ``model.SUMS`` columns ``model.summed`` leaves out for ``contract`` are 0 in both engines.
    With a packed dialect the counts are its packed sums (``packed_counts``), not the columns, and
    the sums left out are not here (``summary_query`` sets them).
    """
    computed = model.summed(contract)
    out = {"events": "count(1)"}
    if d.packed:
        out |= packed_counts(d)[0]
    else:
        out |= {n: d.count_if.format(f"{is_kind(k)} AND {c}" if c else is_kind(k)) for n, (k, c) in _counted().items()}
    for n, (k, key) in model.SUMS.items():
        # a missing field is 0; only that kind's rows parse their detail
        value = f"coalesce({json_int(d, key)}, 0)"
        if n in computed:
            out[n] = f"sum(CASE WHEN {is_kind(k)} THEN {value} ELSE 0 END)"
        elif not d.packed:  # a packed summary sets it after the group-by: an aggregate costs an update an event
            out[n] = "max(CAST(0 AS BIGINT))"
    out |= {n: d.ts_if.format("min", is_kind(k)) for n, k in model.FIRST_TS.items()}
    in_span = f"NOT ({is_kind(*sorted(model.SPAN_EXCLUDED))})"
    return out | {
        "first_ns": d.ts_if.format("min", in_span),
        "last_ns": d.ts_if.format("max", in_span),
    }


def latency_us(d: Dialect) -> str:
    """Return submit -> first downstream in microseconds over the summary (null if negative or unknown)."""
    return f"CASE WHEN downstream_ns - submit_ns >= 0 THEN {d.int_div.format('downstream_ns - submit_ns', 1000)} END"


def latency_bucket(lat: str) -> str:
    """Return ``lat`` (us) rounded down to three significant digits (``model.latency_bucket_us``)."""
    whens = " ".join(f"WHEN {lat} < {below} THEN {scale}" for below, scale in model.LATENCY_SCALES)
    return f"({lat} - {lat} % (CASE {whens} ELSE {model.LATENCY_TOP_SCALE} END))"


MASK_BITS = 63  # fault windows per mask word: the bits of a BIGINT short of its sign


def window_masks(spans: list[tuple[int, int]]) -> list[str]:
    """Return, per word of ``MASK_BITS`` fault windows (start_ns, end_ns inclusive), the BIGINT of
    the bits of those an operation's span (``first_ns``..``last_ns``) overlaps; 0 for none, or for
    an operation with no span. Both engines group operations by these words: few distinct sets of
    windows for many operations, each set's figures added to each of its windows afterwards."""
    words = []
    for lo in range(0, len(spans), MASK_BITS):
        bits = [
            f"CASE WHEN first_ns <= {end} AND last_ns >= {start} THEN {1 << b} ELSE CAST(0 AS BIGINT) END"
            for b, (start, end) in enumerate(spans[lo : lo + MASK_BITS])
        ]
        words.append("(" + " + ".join(bits) + ")")  # distinct bits: the sum is their union
    return words


def mask_bits(mask: int, word: int) -> list[int]:
    """Return the indices of the windows set in ``mask``, word ``word`` of ``window_masks``."""
    return [word * MASK_BITS + b for b in range(MASK_BITS) if mask >> b & 1]


def flag_column(cls: str) -> str:
    """Return the summary's 0/1 column for an anomaly class."""
    return f"f{model.ANOMALY_CLASSES.index(cls)}"


def summary_query(
    events: str,
    contract: model.FlowContract,
    d: Dialect,
    *,
    keys: str,
    judged: dict[str, model.Pred],
    per_key: str = "",
) -> str:
    """Return the operation summary: one row per operation of ``events`` grouped by ``keys``, its
    measures, a 0/1 flag per judged class, ``lat_us``, ``lat_bucket`` and ``skew``.

    ``per_key`` names a relation of (op_id, ``model.PER_KEY_COLUMNS``...) to join (a per-key contract).
    """
    aggs = ", ".join(f"{m} AS {n}" for n, m in measures(contract, d).items())
    base = f"SELECT {keys}, {aggs} FROM {events} WHERE op_id IS NOT NULL GROUP BY {keys}"
    if d.packed:
        words = ", ".join(packed_counts(d)[0])
        counts = ", ".join(f"{e} AS {n}" for n, e in unpacked(contract, d).items())
        base = f"SELECT * EXCLUDE ({words}), {counts} FROM ({base}) p"  # DuckDB's SQL; Spark's job selects alike
    if per_key:
        cols = ", ".join(f"coalesce(k.{c}, 0) AS {c}" for c in model.PER_KEY_COLUMNS)
        base = f"SELECT s.*, {cols} FROM ({base}) s LEFT JOIN {per_key} k ON s.op_id = k.op_id"
    flags = "".join(f", CASE WHEN {predicate(p)} THEN 1 ELSE 0 END AS {flag_column(c)}" for c, p in judged.items())
    lat = latency_us(d)
    return (
        f"SELECT *{flags}, {lat} AS lat_us, {latency_bucket(lat)} AS lat_bucket, "
        f"CASE WHEN downstream_ns - submit_ns < 0 THEN 1 ELSE 0 END AS skew FROM ({base}) b"
    )


def per_key_query(events: str, d: Dialect) -> str:
    """Return (op_id, ``model.PER_KEY_COLUMNS``...) from the ledger's per-key view (see ``model.py``).

    Regressions and re-creations compare each applied row with the rows the replica applied before
    it for the same key (journal order ``n``); a live replica row counts when the key's highest
    submitted version is a tombstone (version * 2 + tombstone orders as (version, tombstone)).
    """
    key, ver, n = d.json_text.format("detail", "key"), json_int(d, "version"), json_int(d, "n")
    tombstone = f"({d.json_text.format('detail', 'tombstone')} = 'true')"
    has_key = f"op_id IS NOT NULL AND {key} IS NOT NULL"
    before = "PARTITION BY k ORDER BY n, op_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
    applies = (
        f"SELECT op_id, {key} AS k, {ver} AS v, {tombstone} AS t, {n} AS n "
        f"FROM {events} WHERE {is_kind(Kind.RESIDUE_APPLY)} AND {has_key}"
    )
    ordered = (
        f"SELECT op_id, v, t, max(v) OVER ({before}) AS prev, "
        f"max(CASE WHEN t THEN v END) OVER ({before}) AS prev_tomb FROM ({applies}) a"
    )
    last = (
        f"SELECT {key} AS k FROM {events} WHERE {is_kind(Kind.SUBMIT)} AND {has_key} "
        f"GROUP BY {key} HAVING max({ver} * 2 + CASE WHEN {tombstone} THEN 1 ELSE 0 END) % 2 = 1"
    )
    e_key, e_deleted = d.json_text.format("e.detail", "key"), f"({d.json_text.format('e.detail', 'deleted')} = 'true')"
    alive = (
        f"SELECT e.op_id, 'resurrections' AS col FROM {events} e JOIN ({last}) l ON {e_key} = l.k "
        f"WHERE e.{is_kind(Kind.RESIDUE_ENTITY)} AND e.op_id IS NOT NULL AND NOT {e_deleted}"
    )
    facts = (
        f"SELECT op_id, 'regressions' AS col FROM ({ordered}) o WHERE v < prev "
        f"UNION ALL SELECT op_id, 'resurrections' AS col FROM ({ordered}) o WHERE NOT t AND v < prev_tomb "
        f"UNION ALL {alive}"
    )
    sums = ", ".join(
        f"CAST(sum(CASE WHEN col = '{c}' THEN 1 ELSE 0 END) AS BIGINT) AS {c}" for c in model.PER_KEY_COLUMNS
    )
    return f"SELECT op_id, {sums} FROM ({facts}) f GROUP BY op_id"
