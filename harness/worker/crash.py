"""Named crash points: armed by the harness, hit by a worker that SIGKILLs itself.

An arm's ``action`` says what happens at the point: ``kill`` (SIGKILL, the default), ``freeze``
(SIGSTOP until the harness thaws it), or one of
the forced redeliveries (``REDELIVERY_ACTIONS``): the worker gives the message back to the
broker by NACK, by ABORT then UNSUBSCRIBE, or by dropping its connection before the ACK, and
carries on. Every action is a way a real consumer lets a message be delivered again.

The driver writes the arms of a run to ``<run>/arms.json``; a worker re-reads the file when it
changes, so arms can be added while the run goes on. An arm fires once: the worker claims it
by creating ``<run>/arms/<id>.fired`` (O_EXCL) before it kills itself, so its restarted self,
or another worker, never fires it again.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter

# Points every stage passes through; a pattern may declare more (e.g. after_external_call).
STAGE_POINTS = ("before_db_commit", "after_db_commit", "after_broker_commit", "after_external_call")
REDELIVERY_ACTIONS = ("nack", "abort_unsubscribe", "disconnect")
# ``freeze``: the worker SIGSTOPs itself at the point (its transactions stay open, its heart-beats
# stop) until the harness's ``Thaw``; then it carries on from the point.
ACTIONS = ("kill", "freeze", *REDELIVERY_ACTIONS)
# What a wire trap does to the service instance it fires on (harness.traps; a service flow's arms).
TRAP_ACTIONS = ("kill", "freeze", "drop")


class ForcedRedelivery(Exception):
    """Raised at an armed point whose action is a redelivery; the stage runtime performs it."""

    def __init__(self, action: str, point: str) -> None:
        super().__init__(f"forced redelivery by {action} at {point}")
        self.action, self.point = action, point


@dataclass(frozen=True)
class CrashArm:
    """Kill the worker at ``point`` when the other fields match (None matches anything).

    ``op``: only while processing this operation id. ``worker``: only this worker.
    ``nth``: only the nth time a worker process reaches the point (1-based).
    """

    id: str
    point: str
    op: str | None = None
    worker: str | None = None
    nth: int | None = None
    action: str = "kill"

    def __post_init__(self) -> None:
        if self.action not in (*ACTIONS, *TRAP_ACTIONS):
            known = ", ".join(dict.fromkeys((*ACTIONS, *TRAP_ACTIONS)))
            raise ConfigError(f"unknown crash arm action {self.action!r}", hint=f"use one of {known}")
        if not self.point or not self.point.replace("_", "").isalnum():
            raise ConfigError(f"bad crash point name {self.point!r}", hint=f"use one of {', '.join(STAGE_POINTS)}")
        if self.nth is not None and self.nth < 1:
            raise ConfigError(f"crash arm nth={self.nth} is not a count", hint="nth counts from 1: the 1st hit")


def write_arms(run_dir: Path, arms: list[CrashArm]) -> None:
    """Replace the run's arms atomically (a worker never reads half a file)."""
    tmp = run_dir / "arms.json.tmp"
    tmp.write_text(json.dumps([asdict(a) for a in arms]))
    tmp.replace(run_dir / "arms.json")


def fired_arms(run_dir: Path) -> set[str]:
    """Return the ids of the arms that have fired."""
    return {p.stem for p in (run_dir / "arms").glob("*.fired")}


class CrashPoints:
    """The worker side: count hits per point and fire matching arms."""

    def __init__(self, run_dir: Path, worker: str, ledger: LedgerWriter) -> None:
        self.run_dir, self.worker, self.ledger = run_dir, worker, ledger
        self.hits: Counter[str] = Counter()
        self._arms: list[CrashArm] = []
        self._stamp: tuple[int, int, int] | None = None
        # A plain string: a hot loop reaches several points per message (Path joins cost more than the stat).
        self._path = str(run_dir / "arms.json")
        (run_dir / "arms").mkdir(exist_ok=True)

    def _load(self) -> list[CrashArm]:
        path = self._path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return []
        # mtime alone is not enough: coarse kernel timestamps give two writes in one tick the same
        # mtime. write_arms replaces the file by rename, so the inode changes on every write.
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            with open(path) as fh:
                self._arms = [CrashArm(**a) for a in json.load(fh)]
            self._stamp = stamp
        return self._arms

    def armed_points(self) -> frozenset[str]:
        """Return the points some arm names now; a hot loop may ``count`` the others instead of
        ``reach``-ing them, re-reading this once per batch."""
        return frozenset(a.point for a in self._load())

    def count(self, point: str, n: int = 1) -> None:
        """Count ``n`` hits of ``point`` that no arm names (what ``reach`` would do, minus the arm check)."""
        self.hits[point] += n

    def reach_armed(
        self, armed: frozenset[str], point: str, *, op: str | None, msg: str | None = None, stage: str | None = None
    ) -> None:
        """``reach`` ``point`` if it is in ``armed`` (``armed_points`` read once per message or batch),
        else only ``count`` it: a stage reaches four or five points a message, and each ``reach``
        stats the arms file."""
        if point in armed:
            self.reach(point, op=op, msg=msg, stage=stage)
        else:
            self.count(point)

    def reach(self, point: str, *, op: str | None, msg: str | None = None, stage: str | None = None) -> None:
        """Record that ``point`` was reached; act on the first arm that matches.

        ``kill``: SIGKILL this process; ``freeze``: SIGSTOP it (it returns once continued).
        Otherwise raise ``ForcedRedelivery`` for the caller.
        """
        self.hits[point] += 1
        for arm in self._load():
            if arm.point != point or (arm.op is not None and arm.op != op):
                continue
            if (arm.worker is not None and arm.worker != self.worker) or (
                arm.nth is not None and arm.nth != self.hits[point]
            ):
                continue
            try:
                fd = os.open(self.run_dir / "arms" / f"{arm.id}.fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            if arm.action == "freeze":
                self.ledger.emit(
                    Kind.CRASH,
                    op=op,
                    msg=msg,
                    stage=stage,
                    point=point,
                    arm=arm.id,
                    worker=self.worker,
                    action="freeze",
                )
                self.ledger.flush()  # inside a ledger batch: what it holds is written before the stop
                os.kill(os.getpid(), signal.SIGSTOP)  # Thaw continues it here
                return
            if arm.action != "kill":
                self.ledger.emit(
                    Kind.FORCED_REDELIVERY, op=op, msg=msg, stage=stage, point=point, arm=arm.id, action=arm.action
                )
                raise ForcedRedelivery(arm.action, point)
            self.ledger.emit(Kind.CRASH, op=op, msg=msg, stage=stage, point=point, arm=arm.id, worker=self.worker)
            self.ledger.flush()  # inside a ledger batch: what it holds is written before the kill
            os.kill(os.getpid(), signal.SIGKILL)
