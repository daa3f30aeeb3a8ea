"""What a run starts from and ends with: a clean stack and an opened record, then a judged folder.

``begin_run`` and ``reset_state`` open a run (``RunSession.open``); ``judge_folder`` compacts its
ledger, verifies it and writes ``verdict.json`` into a ``RunResult`` (``RunSession.close``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness.clients import db
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import HarnessError
from harness.ledger.layout import read_layout
from harness.ledger.reader import Compaction, segments_bytes
from harness.ledger.schema import Kind
from harness.ledger.story import story
from harness.ledger.writer import LedgerWriter
from harness.run.core.folder import RunFolder
from harness.run.spec.scenario import ScenarioSpec
from harness.stack.base import Endpoints
from harness.verify import declared
from harness.verify.checker import check_run
from harness.verify.verdict import Verdict
from harness.worker.crash import write_arms

Progress = Callable[[str], None]
# Segments this large take seconds to compact (about 100 MB/s here): the close says what it is doing.
ANNOUNCE_BYTES = 64 << 20


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class RunResult:
    """A finished run: its folder and verdict, and whether the verdict is what the spec expects."""

    run_dir: Path
    verdict: Verdict
    spec: ScenarioSpec

    @property
    def as_expected(self) -> bool:
        """Tell whether the verdict found exactly the expected classes and every requested fault fired."""
        return set(self.verdict.found()) == set(self.spec.expect) and not self.verdict.unfired

    def unfired_stories(self) -> tuple[str, ...]:
        """Return, for each crash or trap armed on an operation that never fired, what the ledger
        recorded of that operation (``ledger.story``): why the point was never reached."""
        ops = [e["op"] for e in self.verdict.faults if e.get("fired") is False and e.get("op")]
        return tuple(story(self.run_dir / "ledger", str(op)) for op in dict.fromkeys(ops))


def begin_run(spec: ScenarioSpec, endpoints: Endpoints, folder: RunFolder, ledger: LedgerWriter) -> None:
    """Open the run's folder and ledger: manifest, run_start event, no crash armed."""
    folder.start(spec, endpoints)
    ledger.emit(Kind.RUN_START, scenario=spec.label, seed=spec.seed, run_id=folder.run_id)
    write_arms(folder.path, [])


def reset_state(spec: ScenarioSpec, endpoints: Endpoints, folder: RunFolder) -> db.Engine:
    """Give the run a clean stack: its schema applied, every table empty, no toxic left.

    The engine returned is the harness's own (resets, the invariant read after each machine step,
    the books): it skips the Postgres proxy, so a latency or a cut the run opens on the system
    under test neither slows nor blocks what the harness observes.
    """
    engine = db.engine(endpoints.postgres_direct_url)
    db.apply_schema(engine, spec.schema)
    declared.check(engine, spec.contract)  # the team's effect queries and invariants, against the real schema
    db.truncate_all(engine)
    ToxiproxyAdmin(endpoints.toxiproxy_api).reset()
    folder.step(f"reset: schema {spec.schema}, tables truncated, toxics removed")
    return engine


def judge_folder(
    folder: RunFolder, spec: ScenarioSpec, progress: Progress = _quiet, compaction: Compaction | None = None
) -> RunResult:
    """Compact the run's ledger, verify it against ``spec``'s contract and write ``verdict.json``.

    ``compaction``: one begun while the run went (a soak's), finished here; by default the whole
    ledger is compacted now. A ledger of ``ANNOUNCE_BYTES`` or more is announced on ``progress``
    (its size, then the time its compaction took), so a long soak's close does not sit silent.
    """
    path = folder.path
    size = segments_bytes(path / "ledger")
    announce = progress if size >= ANNOUNCE_BYTES else _quiet
    try:
        taken = compaction.taken_bytes if compaction is not None else 0
        early = f" ({taken / 1e6:,.0f} MB of them read while it ran)" if taken else ""
        announce(f"judging the run: compacting {size / 1e6:,.0f} MB of ledger segments{early}")
        started = time.monotonic()
        layout = read_layout((compaction or Compaction(path / "ledger")).finish()) or {}
        events = f"{int(layout.get('events', 0)):,} events"
        announce(f"compacted {events} in {time.monotonic() - started:.1f}s; judging them")
        verdict = check_run(path, spec.contract, scenario=spec.label, seed=spec.seed)
    except Exception as exc:
        hint = "the ledger segments are kept in ledger/"
        raise HarnessError(f"verifying {path} failed: {exc}", hint=hint) from exc
    verdict = replace(verdict, steps=tuple(folder.manifest.get("steps", ())))
    verdict.write(path / "verdict.json")
    return RunResult(path, verdict, spec)
