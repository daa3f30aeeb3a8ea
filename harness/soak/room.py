"""Disk room for a soak's ledger: refused up front when it cannot fit, stopped in time when it fills.

A soak writes its ledger as JSON lines as it goes (a clean Kafka soak of 1,000,000 operations
wrote 3.1 GB of segments) and compacts it into Parquet at the close. Without room the ledger's
writers fail mid-line and the close cannot write its buckets, so an hour of soak would end in a
damaged ledger and no verdict. Two guards keep that from happening:

- ``check_room`` refuses, before any service starts, a soak whose operations are known (``ops``,
  or ``rate`` times ``duration_s``) when the runs folder's disk lacks the estimated room.
- ``Room.short`` is asked while the soak runs: once the free space falls below what the close
  needs (``RESERVE_BYTES`` and a share of the segments written), the driver stops submitting and
  closes the books, so the verdict covers what ran and says why it stopped early.

>>> check_room(Soak(spec, ops=1_000_000), runs_root())
>>> Room(run_dir / "ledger").short()  # None while there is room
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from harness.errors import ConfigError
from harness.ledger.reader import segments_bytes
from harness.soak.spec import Soak

__all__ = ["BYTES_PER_OP", "CLOSE_SHARE", "RESERVE_BYTES", "Room", "check_room", "estimated_ops"]

# Segments per operation, with a margin: measured 3,100 bytes (Kafka batch consumer, 1,000,000
# ops, 8 events each), 2,900 (Kafka inbox consumer) and 2,500 (ActiveMQ check-then-skip).
BYTES_PER_OP = 4_000
# What the close writes beside the segments (the Parquet buckets, about 5 % of the segments, and
# the live compaction's spill until they are written), as a share of the segments.
CLOSE_SHARE = 0.15
# Never fill the disk to its last bytes: the broker, the database and the run's logs may share it.
RESERVE_BYTES = 512 << 20

FreeBytes = Callable[[Path], int]


def free_bytes(path: Path) -> int:
    """Return the bytes free to this user on the disk that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def estimated_ops(soak: Soak) -> int | None:
    """Return how many operations ``soak`` submits, when that is known before it runs."""
    if soak.ops is not None:
        return soak.ops
    if soak.pace_rate is not None and soak.duration_s is not None:
        return int(soak.pace_rate * soak.duration_s) + 1
    return None  # a closed loop for a time: as many as the flow takes, watched by ``Room`` instead


def check_room(soak: Soak, runs_root: Path, *, free: FreeBytes = free_bytes) -> None:
    """Raise ConfigError when ``runs_root``'s disk cannot hold ``soak``'s ledger and its close."""
    ops = estimated_ops(soak)
    if ops is None:
        return
    per_op = int(BYTES_PER_OP * (1 + CLOSE_SHARE))
    need = ops * per_op + RESERVE_BYTES
    have = free(runs_root)
    if have < need:
        fits = max(0, have - RESERVE_BYTES) // per_op
        raise ConfigError(
            f"soak of {ops:,} operations needs about {need / 1e9:.1f} GB for its ledger and {runs_root} "
            f"has {have / 1e9:.1f} GB free",
            hint=f"submit fewer (about {fits:,} operations fit), remove old run folders "
            "(`txchaos prune --older-than 7d`), or set TXCHAOS_REPORTS to a disk with room",
        )


class Room:
    """Whether the disk under a running soak's ledger still has room for the rest of it and its close."""

    def __init__(self, ledger_dir: Path, *, free: FreeBytes = free_bytes, reserve: int = RESERVE_BYTES) -> None:
        self.ledger_dir, self._free, self.reserve = ledger_dir, free, reserve

    def needed(self) -> int:
        """The bytes the close needs free now: the reserve and its share of the segments written so far."""
        return self.reserve + int(segments_bytes(self.ledger_dir) * CLOSE_SHARE)  # no ledger yet: 0

    def short(self) -> str | None:
        """Return why the soak must stop submitting now (the disk is short of room), or None."""
        have, need = self._free(self.ledger_dir), self.needed()
        if have >= need:
            return None
        return (
            f"the disk under {self.ledger_dir} has {have / 1e6:,.0f} MB free, less than the "
            f"{need / 1e6:,.0f} MB closing the books needs: the soak stopped submitting"
        )
