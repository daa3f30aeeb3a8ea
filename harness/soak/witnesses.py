"""A soak's witness sample: each anomaly's operation with the faults that can explain it.

A verdict's witness lists the fault windows its operation overlapped and, in its event chain, the
crash points that fired on it. A soak kills workers too (``Kill`` steps of the nemesis): such a
kill names no operation (``crash`` event, point ``kill``, the worker in its detail), so neither
list shows it, although it is what turns a message held between the database commit and the
broker commit into a duplicate. The sample adds each kill of a worker that wrote the operation's
events, made while the operation was in flight (between its first and last event, the books'
snapshot left out), so a person reading the sample sees why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.ledger.layout import KIND_CODES
from harness.ledger.reader import PARQUET_NAME
from harness.ledger.schema import Kind
from harness.verify.model import SPAN_EXCLUDED
from harness.verify.verdict import Verdict, Witness, explain

SAMPLE_PER_CLASS = 5  # witnesses per class in soak.json and on the console
CRASH = KIND_CODES[str(Kind.CRASH)]
DRIVER = "driver"  # the ledger source of the run's own events: submissions, outputs, the books
SNAPSHOT = frozenset(str(k) for k in SPAN_EXCLUDED)  # written at close: they do not stretch the span
UNFINISHED = frozenset({"lost", "stuck", "in-doubt"})  # classes whose operation stopped short of its end


@dataclass(frozen=True)
class Kill:
    """A SIGKILL the run sent a worker or service instance, not at a crash point of an operation."""

    ts_ns: int
    worker: str


def nemesis_kills(run_dir: Path) -> tuple[Kill, ...]:
    """Return the run's kills in time order, read from its compacted ledger (empty without one).

    Only ``kind_code`` is scanned for the filter: 0.3-0.6 s for the 8M events of a million-operation soak.
    """
    import pyarrow.compute as pc  # here: pyarrow.dataset costs the driver 45 MB while it drives
    import pyarrow.dataset as ds

    parquet = run_dir / "ledger" / PARQUET_NAME
    if not parquet.is_dir():
        return ()
    parts = ds.dataset(sorted(parquet.glob("*.parquet")), format="parquet")
    crashes = parts.to_table(columns=["ts_ns", "op", "point", "detail"], filter=pc.field("kind_code") == CRASH)
    kills = []
    for row in crashes.to_pylist():
        detail = json.loads(row["detail"] or "{}")
        if row["op"] is None and row["point"] == "kill" and isinstance(detail, dict) and detail.get("worker"):
            kills.append(Kill(int(row["ts_ns"]), str(detail["worker"])))
    return tuple(sorted(kills, key=lambda k: k.ts_ns))


def kills_during(witness: Witness, kills: Sequence[Kill]) -> list[Kill]:
    """Return the kills of a worker that wrote one of ``witness``'s events, made while its
    operation was in flight (from its first event to its last, the end-of-run snapshot left out).

    A service writes no event of its own (the driver records its submissions and outputs), so
    which instance held the operation is not known: every instance killed while it was in flight
    may have, and each is returned.
    """
    flight = _flight(witness)
    if not flight:
        return []
    first, last = min(int(e["ts_ns"]) for e in flight), max(int(e["ts_ns"]) for e in flight)
    writers = {str(e.get("src")) for e in flight} - {DRIVER}
    return [k for k in kills if first <= k.ts_ns <= last and (k.worker in writers or not writers)]


def _flight(witness: Witness) -> list[dict[str, Any]]:
    """Return the events of ``witness``'s operation while in flight: the end-of-run snapshot left out."""
    return [e for e in witness.events if e.get("kind") not in SNAPSHOT]


def next_fault(witness: Witness, faults: Sequence[dict[str, Any]], kills: Sequence[Kill]) -> str | None:
    """Return, in words, the first fault window or kill after ``witness``'s last event (None: none came).

    An operation that never reached its end (lost, stuck) has a span that stops at its last event:
    a service that acknowledged it first and then died with the database writes nothing more, so no
    window overlaps it, yet the one that opened next is what a person looks at first.
    """
    flight = _flight(witness)
    if not flight:
        return None
    last = max(int(e["ts_ns"]) for e in flight)
    opened = [
        (int(f.get("fired_ns") or f["armed_ns"]), str(f["name"]))
        for f in faults
        if f.get("type") == "fault" and f.get("armed_ns") is not None
    ]
    after = [(at, name) for at, name in opened if at > last]
    after += [(k.ts_ns, f"a kill of {k.worker} (nemesis)") for k in kills if k.ts_ns > last]
    if not after:
        return None
    at, name = min(after)
    return f"its last event came {(at - last) / 1e9:.1f}s before {name}"


def witness_sample(
    verdict: Verdict, kills: Sequence[Kill] = (), per_class: int = SAMPLE_PER_CLASS
) -> dict[str, list[dict[str, Any]]]:
    """Return up to ``per_class`` witnesses of each anomaly class, each with the fault windows that
    overlapped its operation, the crashes (kills, freezes) in its chain and the ``kills`` of its
    workers while it was in flight; an operation that stopped short of its end (``UNFINISHED``)
    with none of these gets the fault that came next (``after``)."""
    sample: dict[str, list[dict[str, Any]]] = {}
    for w in verdict.witnesses:
        picked = sample.setdefault(w.anomaly, [])
        if len(picked) < per_class:
            crashes = [
                f"{(e.get('detail') or {}).get('action', 'kill')} at {e.get('point')} in {e.get('src')}"
                for e in w.events
                if e.get("kind") == "crash"
            ]
            crashes += [f"kill of {k.worker} (nemesis)" for k in kills_during(w, kills)]
            entry = {
                "op": w.op,
                "msg_ids": list(w.msg_ids),
                "summary": w.summary,
                "faults": list(w.faults),
                "crashes": crashes,
            }
            if w.anomaly in UNFINISHED and not w.faults and not crashes:
                after = next_fault(w, verdict.faults, kills)
                if after:
                    entry["after"] = after
            said = explain(w)  # a declared check's witness: what it found broken, in words
            if said:
                entry["said"] = said
            picked.append(entry)
    return sample
