"""One operation's story in words: what the ledger recorded of it, in order, for a person reading an error.

A crash armed on an operation that never fired leaves the question "then what did happen to it?".
``story`` answers from the compacted ledger: each event's kind, who wrote it, and the reason an alert,
a dead letter or a skip gave (``attempt`` when a delivery was a redelivery). The ledger is filtered on
the operation (parquet pushdown), so a soak's large ledger is not read whole for one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from harness.ledger.reader import PARQUET_NAME, read_segments

REASON_CHARS = 160  # a reason longer than this is cut: the line must stay readable in a test failure


def _said(row: dict[str, Any]) -> str:
    detail = row.get("detail")
    try:
        parsed = json.loads(detail) if isinstance(detail, str) and detail else {}
    except json.JSONDecodeError:
        parsed = {}
    words = [str(row["src"])]
    if row.get("attempt") and int(row["attempt"]) > 1:
        words.append(f"attempt {row['attempt']}")
    if row.get("point"):
        words.append(str(row["point"]))
    reason = parsed.get("reason") if isinstance(parsed, dict) else None
    if reason:
        text = str(reason)
        words.append(repr(text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "..."))
    return f"{row['kind']} ({', '.join(words)})"


def _rows(ledger_dir: Path, op: str) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds  # here: 45 MB a soak's driver must not carry while it drives

    parquet = ledger_dir / PARQUET_NAME
    if parquet.exists():
        table = ds.dataset(parquet, format="parquet").to_table(filter=pc.field("op") == op)
    else:
        table = read_segments(ledger_dir)
        table = table.filter(pc.equal(table["op"], op))
    return sorted(table.to_pylist(), key=lambda r: (int(r["ts_ns"]), str(r["src"]), int(r["seq"])))


def story(ledger_dir: Path, op: str, limit: int = 12) -> str:
    """Return what the ledger in ``ledger_dir`` recorded of operation ``op``, in order, in one line."""
    rows = _rows(ledger_dir, op)
    if not rows:
        return f"the ledger has no event of {op}"
    said = [_said(r) for r in rows[:limit]]
    more = f", and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"the ledger has of {op}: {'; '.join(said)}{more}"
