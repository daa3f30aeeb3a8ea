"""The verdict schema both engines write to ``verdict.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.errors import EXIT_INCOMPLETE, EXIT_UNFIRED
from harness.verify.model import ANOMALY_CLASSES


@dataclass(frozen=True)
class Witness:
    """One anomaly of one operation, with the message ids, event chain and fault overlay that prove it.

    ``events`` is the operation's chain in (ts_ns, src, seq) order, each event carrying ``faults``:
    the fault windows active at its timestamp. ``faults`` lists every fault window overlapping the
    operation's span.
    """

    anomaly: str
    op: str
    msg_ids: tuple[str, ...]
    summary: dict[str, int]
    events: tuple[dict[str, Any], ...] = ()
    faults: tuple[dict[str, Any], ...] = ()


def _ops_phrase(ops: list[str], n: int, what: str) -> str:
    more = f" and {n - len(ops)} more" if n > len(ops) else ""
    return f"op{'s' if n > 1 else ''} {', '.join(ops)}{more} {what}"


def explain(w: Witness) -> str:
    """Return what a witness of a declared check shows, in words ("" for the other classes).

    ``sum(accounts.balance) = 1,040, expected 1,000: ops op-7 applied twice``
    """
    if w.anomaly == "duplicate-output":
        return f"op {w.op}: {w.summary.get('downstream', 0)} output messages, the flow promises one"
    if w.anomaly != "invariant-broken":
        return ""
    for e in w.events:
        d = e.get("detail") or {}
        if e.get("kind") != "residue_invariant" or d.get("holds", True):
            continue
        head = f"{d.get('label')} = {int(d['actual']):,}, expected {int(d['expected']):,}"
        if d.get("scope") == "op":
            return f"{head} for op {w.op}"
        why = []
        if d.get("applied_twice_n"):
            why.append(_ops_phrase(list(d["applied_twice"]), int(d["applied_twice_n"]), "applied more than once"))
        if d.get("not_applied_n"):
            why.append(_ops_phrase(list(d["not_applied"]), int(d["not_applied_n"]), "never applied"))
        return head + (": " + "; ".join(why) if why else "")
    return f"invariant broken at {w.op}"


OUTCOMES = ("clean", "anomalies", "incomplete", "unfired")
# The exit code of each outcome, for CI gates (errors.py names the families).
EXIT_CODES = {"clean": 0, "anomalies": 1, "incomplete": EXIT_INCOMPLETE, "unfired": EXIT_UNFIRED}
DECLARED_CLASSES = frozenset({"invariant-broken", "duplicate-output"})  # the classes ``explain`` words


@dataclass(frozen=True)
class Verdict:
    """Counts per anomaly class, witnesses, statistics; ``clean`` means no anomaly at all.

    ``incomplete`` lists why the run folder cannot give a full verdict (the run never closed its
    books, damaged ledger lines); then ``unjudged`` names the classes the evidence cannot decide
    (their counts are 0 because they were not judged, not because nothing happened), and the
    outcome is ``incomplete`` whatever was found. ``damaged_lines`` counts the unreadable ledger
    lines per segment (skipped one by one). ``notes`` say what verification repaired, e.g. a
    compacted ledger rebuilt from its segments.

    ``faults`` accounts for every requested crash, trap and fault window (``verify/fired.py``):
    whether and when it fired, on which operation and worker. A run in which one never fired is
    not clean: its outcome is ``unfired`` (unless anomalies or missing evidence say more).
    """

    anomalies: dict[str, int]
    witnesses: tuple[Witness, ...]
    stats: dict[str, Any]
    engine: str
    scenario: str = ""
    seed: int | None = None
    steps: tuple[str, ...] = ()
    timing: dict[str, float] = field(default_factory=dict)
    incomplete: tuple[str, ...] = ()
    unjudged: tuple[str, ...] = ()
    damaged_lines: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    faults: tuple[dict[str, Any], ...] = ()

    @property
    def anomaly_free(self) -> bool:
        """Tell whether the run was judged in full and showed no anomaly (faults fired or not)."""
        return not self.incomplete and not any(self.anomalies.values())

    @property
    def clean(self) -> bool:
        """Tell whether the run was judged in full, showed no anomaly, and every requested fault fired."""
        return self.anomaly_free and not self.unfired

    @property
    def unfired(self) -> tuple[str, ...]:
        """Return, in words, each requested crash, trap or fault window that never fired."""
        return tuple(str(e["why"]) for e in self.faults if e.get("fired") is False)

    @property
    def outcome(self) -> str:
        """Return ``clean``, ``anomalies``, ``incomplete`` (the evidence does not allow a full verdict)
        or ``unfired`` (no anomaly, but a requested fault never happened: the run proved nothing)."""
        if self.incomplete:
            return "incomplete"
        if any(self.anomalies.values()):
            return "anomalies"
        return "unfired" if self.unfired else "clean"

    @property
    def exit_code(self) -> int:
        """Return the outcome's exit code (``EXIT_CODES``)."""
        return EXIT_CODES[self.outcome]

    def ops(self, anomaly: str) -> set[str]:
        """Return the operation ids the verdict names for ``anomaly``."""
        return {w.op for w in self.witnesses if w.anomaly == anomaly}

    def broken_promises(self, limit: int = 20) -> list[str]:
        """Return the declared checks the witnesses show broken, in words (``explain``), at most ``limit``."""
        said = (f"{w.anomaly}: {explain(w)}" for w in self.witnesses if w.anomaly in DECLARED_CLASSES)
        return list(dict.fromkeys(said))[:limit]

    def found(self) -> dict[str, int]:
        """Return only the classes with a non-zero count."""
        return {k: v for k, v in self.anomalies.items() if v}

    def to_dict(self) -> dict[str, Any]:
        """Return the verdict as JSON-ready data (what ``write`` writes and ``from_dict`` reads).

        Its nested values are the verdict's own, not copies: ``dataclasses.asdict`` deep-copied
        every witness event, 0.17 s of the 0.30 s a 10M-event verdict's ``write`` took.
        """
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["witnesses"] = tuple({f.name: getattr(w, f.name) for f in fields(w)} for w in self.witnesses)
        out["clean"] = self.clean
        out["outcome"] = self.outcome
        out["unfired"] = list(self.unfired)
        out["anomalies"] = {k: self.anomalies.get(k, 0) for k in ANOMALY_CLASSES}
        return out

    def write(self, path: Path) -> Path:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str))
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Verdict:
        witnesses = tuple(
            Witness(
                anomaly=w["anomaly"],
                op=w["op"],
                msg_ids=tuple(w["msg_ids"]),
                summary=dict(w["summary"]),
                events=tuple(w.get("events", ())),
                faults=tuple(w.get("faults", ())),
            )
            for w in raw.get("witnesses", ())
        )
        return cls(
            anomalies=dict(raw["anomalies"]),
            witnesses=witnesses,
            stats=dict(raw.get("stats", {})),
            engine=raw.get("engine", ""),
            scenario=raw.get("scenario", ""),
            seed=raw.get("seed"),
            steps=tuple(raw.get("steps", ())),
            timing=dict(raw.get("timing", {})),
            incomplete=tuple(raw.get("incomplete", ())),
            unjudged=tuple(raw.get("unjudged", ())),
            damaged_lines=dict(raw.get("damaged_lines", {})),
            notes=tuple(raw.get("notes", ())),
            faults=tuple(raw.get("faults", ())),
        )

    @classmethod
    def load(cls, path: Path) -> Verdict:
        return cls.from_dict(json.loads(path.read_text()))

    def headline(self) -> str:
        """Return one line: CLEAN, INCOMPLETE (why, what was not judged) or each anomaly class with its
        count and first op ids."""
        if self.clean:
            return "CLEAN: no anomaly"
        if self.outcome == "unfired":
            return "UNFIRED: " + "; ".join(self.unfired) + " (no anomaly, but the run did not test what it asked)"
        parts = []
        for cls_name, n in self.found().items():
            ops = sorted(self.ops(cls_name))[:3]
            more = ", ..." if n > len(ops) else ""
            if cls_name == "invariant-broken":  # the op id alone says nothing: name the value
                said = [explain(w) for w in self.witnesses if w.anomaly == cls_name][:3]
                parts.append(f"{cls_name}={n} [{'; '.join(said)}{more}]")
                continue
            parts.append(f"{cls_name}={n} [{', '.join(ops)}{more}]")
        if not self.incomplete:
            also = f"; also unfired: {'; '.join(self.unfired)}" if self.unfired else ""
            return "ANOMALIES: " + "; ".join(parts) + also
        found = "; found: " + "; ".join(parts) if parts else "; no anomaly among the judged classes"
        unjudged = f"; not judged: {', '.join(self.unjudged)}" if self.unjudged else ""
        return "INCOMPLETE: " + "; ".join(self.incomplete) + unjudged + found
