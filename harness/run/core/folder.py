"""A run folder: ``reports/runs/<run-id>/`` with manifest, ledger, logs and verdict."""

from __future__ import annotations

import json
import platform
import secrets
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.ledger.schema import SCHEMA_VERSION
from harness.paths import runs_root
from harness.run.spec.steps import Step, to_record
from harness.stack import topology
from harness.stack.base import Endpoints

STEPS = "steps.jsonl"  # the applied steps, one JSON line each (harness.run.spec.steps)
# A run's first steps reach manifest.json as they happen. Past them (a soak adds a step per
# submitted batch, ~19,000 in a million operations) each step would rewrite a manifest that grows
# with the run, quadratic in all: the manifest is then saved at most once a second, and by every
# other save (a doubt, the closed books, the end). steps.jsonl takes every step as it happens.
EAGER_STEPS = 200
SAVE_EVERY_S = 1.0


@dataclass
class RunFolder:
    """Create and fill one run folder. A run never deletes anything in it (``txchaos prune`` removes
    old folders on a user's request: ``harness.run.core.retention``)."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    _log_offsets: dict[str, int] = field(default_factory=dict)
    # Steps come from the driver and from relay threads (a trap firing): one writer at a time.
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    _saved_at: float = field(default=0.0, repr=False, compare=False)

    @classmethod
    def create(cls, scenario: str, variant: str, seed: int, root: Path | None = None) -> RunFolder:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{scenario}-{variant}-s{seed}-{secrets.token_hex(2)}"
        path = (root or runs_root()) / run_id
        for sub in ("ledger", "logs"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        return cls(path)

    def discard_unused(self) -> None:
        """Remove the folder of a run that never began, if every file in it is empty (nothing recorded)."""
        files = [f for f in self.path.rglob("*") if f.is_file()]
        if all(f.stat().st_size == 0 for f in files):
            shutil.rmtree(self.path, ignore_errors=True)

    @property
    def run_id(self) -> str:
        return self.path.name

    def start(self, spec: Any, endpoints: Endpoints) -> None:
        """Write the manifest and remember where each service log stands now."""
        self.manifest = {
            "run_id": self.run_id,
            "scenario": spec.name,
            "variant": spec.variant,
            "seed": spec.seed,
            "spec": spec_record(spec),
            "ledger_schema": SCHEMA_VERSION,
            "stack": {
                "provider": endpoints.provider,
                "stack_id": endpoints.stack_id,
                "versions": {s.name: s.version for s in topology.SERVICES},
            },
            "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "steps": [],
            # True only once the end-state snapshot is in the ledger (close_books); verify reads it
            "complete": False,
        }
        self._log_offsets = {name: p.stat().st_size for name, p in endpoints.service_logs().items()}
        self.save()

    def step(self, text: str) -> None:
        """Record a driver step: the list replays the run (safe from any thread).

        Past ``EAGER_STEPS`` the manifest on disk may lag its steps by up to ``SAVE_EVERY_S``.
        """
        with self._lock:
            steps = self.manifest.setdefault("steps", [])
            steps.append(text)
            if len(steps) <= EAGER_STEPS or time.monotonic() - self._saved_at >= SAVE_EVERY_S:
                self.save()

    def record(self, step: Step) -> None:
        """Append ``step`` to ``steps.jsonl``, the steps as data that ``replay`` runs again (any thread)."""
        with self._lock, (self.path / STEPS).open("a") as fh:
            fh.write(json.dumps(to_record(step), default=str) + "\n")

    def close_books(self) -> None:
        """Record that the run's end-state snapshot (effect table, residue) is in the ledger.

        Call it right after the last snapshot event is emitted: a folder without it (a run killed
        or interrupted before) verifies as ``incomplete``, not as operations lost.
        """
        self.manifest["complete"] = True
        self.manifest["books_closed"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()

    def doubt(self, why: str) -> None:
        """Record why this run's evidence cannot be trusted in full (the driver stopped on an error):
        its verdict is ``incomplete`` with ``why`` among its reasons, now and whenever it is verified again."""
        with self._lock:
            self.manifest.setdefault("doubts", []).append(why)
            self.save()

    def finish(self, endpoints: Endpoints, **extra: Any) -> None:
        self.manifest["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.manifest.update(extra)
        self.save()
        self.copy_service_logs(endpoints)

    def copy_service_logs(self, endpoints: Endpoints) -> None:
        """Copy what each service logged during this run into ``logs/<service>.log``."""
        for name, src in endpoints.service_logs().items():
            start = self._log_offsets.get(name, 0)
            with src.open("rb") as fh, (self.path / "logs" / f"{name}.log").open("wb") as out:
                fh.seek(start)
                shutil.copyfileobj(fh, out)

    def save(self) -> None:
        with self._lock:
            tmp = self.path / "manifest.json.tmp"
            tmp.write_text(json.dumps(self.manifest, indent=2, default=str))
            tmp.replace(self.path / "manifest.json")
            self._saved_at = time.monotonic()


def spec_record(spec: Any) -> dict[str, Any]:
    """Return ``spec`` as the manifest records it: its fields as JSON, its flow by name.

    The flow is a registered Flow (with its check function), so the record names it; ``broker``
    repeats the name under the key manifests carried before ``flow=`` (issue 14), for their readers.
    """
    record: dict[str, Any] = json.loads(
        json.dumps({**asdict(spec), "flow": spec.flow.name, "broker": spec.flow.name}, default=sorted)
    )
    return record
