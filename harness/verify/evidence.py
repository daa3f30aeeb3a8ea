"""What a run folder can prove: whether the run closed its books, damaged lines, a repaired ledger.

Both engines call ``gather`` before they read the ledger and ``Evidence.apply`` to their verdict,
so they judge the same classes and state the same gaps. A run folder is *complete* when its
``manifest.json`` says ``"complete": true``, which the run writes only once its end-state snapshot
(effect table, queues, outbox) is in the ledger. A folder without a manifest is taken as the
caller's to vouch for (``check_run`` with an explicit contract); ``txchaos verify`` refuses one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.ledger.layout import read_layout
from harness.ledger.reader import PARQUET_NAME, compacted_damage, rebuild_compacted, segment_damage
from harness.verify.model import ANOMALY_CLASSES, FlowContract, judged_rules, rules
from harness.verify.verdict import Verdict

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Evidence:
    """What one run folder holds: ``closed`` (the end-state snapshot is in the ledger), the damaged
    lines per segment, and notes on what was repaired before judging."""

    closed: bool
    why_open: str = ""
    damaged_lines: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    doubts: tuple[str, ...] = ()  # what the run itself said it could not vouch for (manifest "doubts")

    @property
    def intact(self) -> bool:
        return not self.damaged_lines

    def gaps(self) -> tuple[str, ...]:
        """Return why the folder cannot give a full verdict (empty: it can)."""
        out = [] if self.closed else [self.why_open]
        out.extend(self.doubts)
        if self.damaged_lines:
            n = sum(self.damaged_lines.values())
            segs = ", ".join(f"{s} ({k})" for s, k in sorted(self.damaged_lines.items()))
            out.append(f"{n} damaged ledger line(s) skipped in {segs}")
        return tuple(out)

    def apply(self, verdict: Verdict, contract: FlowContract) -> Verdict:
        """Return ``verdict`` stating the gaps, the classes not judged, the damage and the repairs."""
        judged = judged_rules(contract, snapshot=self.closed, intact=self.intact)
        unjudged = tuple(c for c in ANOMALY_CLASSES if c in rules(contract) and c not in judged)
        return replace(
            verdict,
            incomplete=self.gaps(),
            unjudged=unjudged if self.gaps() else (),
            damaged_lines=dict(sorted(self.damaged_lines.items())),
            notes=self.notes,
        )


def books_closed(run_dir: Path) -> tuple[bool, str]:
    """Return whether the folder states that its run closed its books, and if not, why it is open."""
    manifest = run_dir / MANIFEST
    if not manifest.is_file():
        return True, ""
    try:
        meta = json.loads(manifest.read_text())
    except ValueError:
        return False, f"{manifest} is not JSON, so nothing says the run completed"
    if not isinstance(meta, dict):
        return False, f"{manifest} is not a JSON object, so nothing says the run completed"
    complete = meta.get("complete")
    if complete is True:
        return True, ""
    # a live run's manifest (it has "started") that never got "complete": killed or interrupted
    if complete is False or "started" in meta:
        return False, (
            "the run never closed its books (manifest.json has no complete: true): it was killed or "
            "interrupted before its end-state snapshot reached the ledger"
        )
    return True, ""


def gather(run_dir: Path) -> Evidence:
    """Return the evidence of ``run_dir``; a damaged compacted ledger is rebuilt from its segments first.

    Raises ``IncompleteEvidence`` when the compacted ledger is damaged and no segment is left.
    """
    ledger = run_dir / "ledger"
    notes: list[str] = []
    problems = compacted_damage(ledger)
    if problems:
        notes.append(rebuild_compacted(ledger, problems))
    layout = read_layout(ledger / PARQUET_NAME) if (ledger / PARQUET_NAME).is_dir() else None
    if layout is not None and "damaged_lines" in layout:
        damage = {str(k): int(v) for k, v in layout["damaged_lines"].items()}
    else:
        damage = segment_damage(ledger)
    closed, why = books_closed(run_dir)
    return Evidence(closed, why, damage, tuple(notes), run_doubts(run_dir))


def run_doubts(run_dir: Path) -> tuple[str, ...]:
    """Return what the run recorded that it could not vouch for (``RunFolder.doubt``), in order."""
    try:
        meta = json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return ()  # no manifest, or one books_closed already names as unreadable
    doubts = meta.get("doubts", []) if isinstance(meta, dict) else []
    return tuple(str(d) for d in doubts) if isinstance(doubts, list) else (f"manifest doubts: {doubts!r}",)
