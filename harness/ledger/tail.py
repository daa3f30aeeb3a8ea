"""Follow a live run's ledger: the events appended to its segments since the last look.

The driver reads what the workers wrote while the flow still runs (for example, to tell whether a
message a killed worker held has been redelivered and committed yet). Each segment is read from
where the previous call stopped; a line is taken only once it is complete. A complete line that is
not JSON (a torn write the next event was appended to) is counted in ``damaged`` and skipped,
as the reader does; it must not stop the driver that follows the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class LedgerTail:
    """Yield the events appended to ``<ledger_dir>/segments/*.jsonl`` since the previous ``new()``.

    >>> tail = LedgerTail(run_dir / "ledger")
    >>> kinds = [e["kind"] for e in tail.new()]
    """

    def __init__(self, ledger_dir: Path) -> None:
        self.seg_dir = ledger_dir / "segments"
        self._offsets: dict[Path, int] = {}
        self.damaged = 0

    def new(self) -> Iterator[dict[str, Any]]:
        """Yield every complete event written since the last call, segment by segment."""
        for seg in sorted(self.seg_dir.glob("*.jsonl")):
            start = self._offsets.get(seg, 0)
            with seg.open("rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line still being written is left for the next call
            self._offsets[seg] = start + end
            for raw in data[:end].splitlines():
                try:
                    row = json.loads(raw)
                except ValueError:
                    self.damaged += 1
                    continue
                yield row
