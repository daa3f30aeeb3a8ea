"""Wire-level commit traps: protocol-aware relays in front of Toxiproxy that hold a commit and act."""

from harness.traps.base import POINTS, Drop, Firing, Freeze, Kill, Trap, TrapSet
from harness.traps.proxy import TrapProxy

__all__ = ["POINTS", "Drop", "Firing", "Freeze", "Kill", "Trap", "TrapProxy", "TrapSet"]
