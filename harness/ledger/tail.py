"""Follow a live run's ledger: the events appended to its segments since the last look.

The driver reads what the workers wrote while the flow still runs (for example, to tell whether a
message a killed worker held has been redelivered and committed yet). Each segment is read from
where the previous call stopped; a line is taken only once it is complete. A complete line that is
not JSON (a torn write the next event was appended to) is counted in ``damaged`` and skipped,
as the reader does; it must not stop the driver that follows the run. A packed row yields its
events (``reader.unpacked``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from harness.ledger.reader import unpacked

_KIND = b'"kind":"'  # how LedgerWriter writes every event's kind


class LedgerTail:
    """Yield the events appended to ``<ledger_dir>/segments/*.jsonl`` since the previous ``new()``.

    >>> tail = LedgerTail(run_dir / "ledger")
    >>> kinds = [e["kind"] for e in tail.new()]
    """

    def __init__(self, ledger_dir: Path) -> None:
        self.seg_dir = ledger_dir / "segments"
        self._offsets: dict[Path, int] = {}
        self.damaged = 0
        self.lines = 0  # complete lines read so far, of any kind (``kinds`` skips some unparsed)

    def new(self, kinds: Collection[str] | None = None) -> Iterator[dict[str, Any]]:
        """Yield every complete event written since the last call, segment by segment.

        ``kinds``: yield only events of these kinds. When every line of a segment names its kind as
        ``LedgerWriter`` writes it (``"kind":"deliver"``), only the lines naming a wanted kind are
        found (by one regular expression over the segment) and parsed; otherwise every line is. The
        driver's first look at a long run reads every event the workers wrote, and parsing each one
        (about 5 us) cost most of a second at the close of a 20,000-op soak. A skipped line is not
        counted in ``damaged``.
        """
        wanted = None if kinds is None else _lines_of(kinds)
        for seg in sorted(self.seg_dir.glob("*.jsonl")):
            start = self._offsets.get(seg, 0)
            with seg.open("rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line still being written is left for the next call
            self._offsets[seg] = start + end
            lines = data.count(b"\n", 0, end)
            self.lines += lines
            if wanted is not None and data.count(_KIND, 0, end) == lines:
                # every line names its kind as LedgerWriter writes it: find the wanted ones in C
                raws: Iterable[bytes] = _matching_lines(wanted, data, end)
            else:
                raws = data[:end].splitlines()
            for raw in raws:
                try:
                    row = json.loads(raw)
                except ValueError:
                    self.damaged += 1
                    continue
                rows = unpacked(row) if isinstance(row, dict) and "n" in row else [row]
                if rows is None:  # a packed row that does not unpack whole
                    self.damaged += 1
                    continue
                for one in rows:
                    if kinds is None or one.get("kind") in kinds:
                        yield one


def _lines_of(kinds: Collection[str]) -> re.Pattern[bytes]:
    """Return a pattern matching ``kinds`` named as LedgerWriter names an event's kind."""
    names = b"|".join(re.escape(json.dumps(str(k)).encode()) for k in sorted(kinds))
    return re.compile(re.escape(_KIND[:-1]) + rb"(?:" + names + rb")")


def _matching_lines(wanted: re.Pattern[bytes], data: bytes, end: int) -> Iterator[bytes]:
    """Yield each whole line of ``data[:end]`` in which ``wanted`` matches (a line once)."""
    after = 0  # where the last line yielded ends
    for m in wanted.finditer(data, 0, end):
        if m.start() < after:
            continue
        lo = data.rfind(b"\n", 0, m.start()) + 1
        after = data.find(b"\n", m.end(), end)
        yield data[lo:after]
