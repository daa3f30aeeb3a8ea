"""Account for every requested fault: did each crash, trap and fault window fire, when, and where.

A fault that never happened must not pass as clean. The driver records each request in the
ledger (an ``arm`` event per crash or trap, ``fault_start``/``fault_end`` per window); the run
records what fired (``crash``, ``forced_redelivery``). Both engines select the rows of
``REQUESTS``, and of ``FIRINGS`` when one is an arm (``armed``), and hand them to
``assemble.make_verdict``, which calls ``account``: the same plain Python for every engine, so
they agree on it.

Rules:
- a crash or trap arm fired when a ``crash``/``forced_redelivery`` event names its arm id, or
  (traps, which do not know the arm) the same point on the arm's operation, each event used once;
- a fault window fired when at least one operation was in flight while it was open (its span
  overlaps the window): a fault over an idle flow proved nothing. Every window is measured; a
  verdict written before that (its first 64 windows only) says ``fired: None`` for the rest,
  which never counts as unfired.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from harness.ledger.layout import REQUEST_COLUMNS, REQUEST_KINDS
from harness.ledger.schema import Kind
from harness.traps.base import UNREACHED

# What was asked (an engine always selects these: a few rows per run) and what fired (selected
# only when something was armed: a synthetic ledger of 100M events holds ~1M crash rows and no arm).
REQUESTS: tuple[Kind, ...] = REQUEST_KINDS  # compaction records these (``ledger/layout.py``)
FIRINGS: tuple[Kind, ...] = (Kind.CRASH, Kind.FORCED_REDELIVERY)
KINDS: tuple[Kind, ...] = REQUESTS + FIRINGS
COLUMNS: tuple[str, ...] = REQUEST_COLUMNS


def armed(rows: list[dict[str, Any]]) -> bool:
    """Tell whether the ``REQUESTS`` rows hold an arm, so the engine must also select ``FIRINGS``."""
    return any(r["kind"] == Kind.ARM for r in rows)


def select_rows(
    select: Callable[[tuple[Kind, ...]], list[dict[str, Any]]], recorded: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Return the rows an engine hands to ``make_verdict``, ``select(kinds)`` being its query of
    ``COLUMNS``: the requests (``recorded`` at compaction, when given), and their firings only when
    something was armed."""
    rows = select(REQUESTS) if recorded is None else recorded
    return rows + select(FIRINGS) if armed(rows) else rows


def _detail(row: dict[str, Any]) -> dict[str, Any]:
    raw = row.get("detail")
    if isinstance(raw, dict):
        return raw
    out = json.loads(raw) if raw else {}
    return out if isinstance(out, dict) else {}


def _order(row: dict[str, Any]) -> tuple[int, str, int]:
    return int(row["ts_ns"]), str(row["src"]), int(row["seq"])


def _why_not(entry: dict[str, Any]) -> str:
    """Return the headline's words for an arm or window that never fired."""
    if entry["type"] == "fault":
        return f"fault {entry['name']} never fired: no operation was in flight while it was open"
    point = entry["name"]
    on = f"op {entry['op']}" if entry.get("op") else f"hit #{entry.get('nth')}"
    if entry.get("nth") and not entry.get("op"):
        reason = f"{point} was reached fewer than {entry['nth']} times"
    elif entry["type"] == "trap":
        reason = UNREACHED.get(point, f"the service never reached {point}")
    else:
        reason = f"no worker reached {point} on that operation"
    who = f" in {entry['worker']}" if entry.get("worker") else ""
    return f"{entry['type']} {point} on {on}{who} never fired: {reason}"


def _arms(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fired = [r for r in rows if r["kind"] in (Kind.CRASH, Kind.FORCED_REDELIVERY)]
    used: set[int] = set()
    out = []
    for r in (r for r in rows if r["kind"] == Kind.ARM):
        d = _detail(r)
        entry: dict[str, Any] = {
            "type": str(d.get("via", "crash")),
            "name": str(r.get("point") or ""),
            "arm": d.get("arm"),
            "op": d.get("target_op"),
            "nth": d.get("nth"),
            "action": d.get("action", "kill"),
            "worker": d.get("worker"),
            "armed_ns": int(r["ts_ns"]),
            "fired": False,
        }
        for i, f in enumerate(fired):
            fd = _detail(f)
            if i in used or f.get("point") != entry["name"] or int(f["ts_ns"]) < entry["armed_ns"]:
                continue
            if fd.get("arm") is not None:
                if fd["arm"] != entry["arm"]:
                    continue
            elif entry["op"] is not None and f.get("op") != entry["op"]:
                continue
            used.add(i)
            entry.update(fired=True, fired_ns=int(f["ts_ns"]), fired_op=f.get("op"), fired_worker=fd.get("worker"))
            break
        out.append(entry)
    return out


def account(
    rows: list[dict[str, Any]], windows: list[Any], overlays: dict[int, dict[str, int]]
) -> tuple[dict[str, Any], ...]:
    """Return one entry per requested crash, trap and fault window, in request order.

    ``windows`` are the paired fault windows (``assemble.FaultWindow``), ``overlays`` the engine's
    per-window operation counts (a window no operation overlapped has none).
    """
    rows = sorted(rows, key=_order)
    entries = _arms(rows)
    for i, w in enumerate(windows):
        ops = overlays.get(i, {}).get("ops", 0)
        entry: dict[str, Any] = {
            "type": "fault",
            "name": w.fault,
            "armed_ns": w.start_ns,
            "end_ns": w.end_ns,
            "fired": ops > 0,
            "ops_in_window": ops,
        }
        if ops:
            entry["fired_ns"] = w.start_ns
        entries.append(entry)
    for e in entries:
        if e["fired"] is False:
            e["why"] = _why_not(e)
    return tuple(sorted(entries, key=lambda e: (e["armed_ns"], e["type"], e["name"])))


def unfired(entries: tuple[dict[str, Any], ...]) -> tuple[str, ...]:
    """Return the words for each requested fault that never fired (empty: all fired, or none asked)."""
    return tuple(str(e["why"]) for e in entries if e.get("fired") is False)


def fired_count(entries: tuple[dict[str, Any], ...]) -> tuple[int, int]:
    """Return (fired, requested)."""
    return sum(1 for e in entries if e.get("fired")), len(entries)
