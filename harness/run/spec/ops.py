"""A run's operation ids, held as numbers: what lets a soak of a million operations stay flat.

Every operation a run submits is numbered in order and its id is derived from the number
(``<variant>-s<seed>-op<n:05d>``, so a seed replays). ``OpIds`` is the session's list of them:
it stores only the count, and gives any id back on demand. ``OpSet`` is the set a sink keeps of
the operations that came out: one byte per numbered id, a Python set only for an id that is not
numbered (a service may name its outputs its own way). Held as lists and sets of strings, the two
cost about 250 bytes an operation in the driver; as numbers, about one.

>>> ops = OpIds("naive-s0-op")
>>> ops.append(ops.next_id()); ops[0], len(ops)
('naive-s0-op00000', 1)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import overload

from harness.errors import HarnessError

_NUMBERED = re.compile(r"^(.*-op)(\d+)$")
MAX_NUMBER = 50_000_000  # a byte each: beyond it (someone else's numbering) an id is kept as text


def split(op: str) -> tuple[str, int] | None:
    """Return ``(prefix, number)`` of a numbered operation id, else None.

    >>> split("naive-s0-op00012")
    ('naive-s0-op', 12)
    """
    match = _NUMBERED.match(op)
    if match is None:
        return None
    digits = match.group(2)
    # Only ids as op_id writes them: at least 5 digits, no padding beyond them ("op012345" is not).
    if len(digits) < 5 or (len(digits) > 5 and digits[0] == "0"):
        return None
    number = int(digits)
    return None if number > MAX_NUMBER else (match.group(1), number)


class OpIds(Sequence[str]):
    """The ids of a run's operations so far, in submission order, derived from their numbers."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._count = 0

    def id(self, n: int) -> str:
        """Return the id of operation number ``n`` (submitted or not)."""
        return f"{self.prefix}{n:05d}"

    def next_id(self) -> str:
        return self.id(self._count)

    def append(self, op: str) -> None:
        """Count ``op`` as submitted: it must be the next id, since ids are never stored."""
        if op != self.id(self._count):
            raise HarnessError(
                f"operation {op!r} submitted out of order (expected {self.id(self._count)!r})",
                hint="mint ids with the session's op_id or mint and submit them in order",
            )
        self._count += 1

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self.id(n) for n in range(*index.indices(self._count))]
        n = index + self._count if index < 0 else index
        if not 0 <= n < self._count:
            raise IndexError(index)
        return self.id(n)

    def __iter__(self) -> Iterator[str]:
        return (self.id(n) for n in range(self._count))

    def __contains__(self, op: object) -> bool:
        parts = split(op) if isinstance(op, str) else None
        return parts is not None and parts[0] == self.prefix and parts[1] < self._count

    def __repr__(self) -> str:
        return f"OpIds({self.prefix!r}, {self._count})"


class OpSet:
    """A set of operation ids: a byte per numbered id (by prefix), a set for any other."""

    def __init__(self) -> None:
        self._marks: dict[str, bytearray] = {}
        self._other: set[str] = set()
        self._size = 0

    def add(self, op: str) -> None:
        parts = split(op)
        if parts is None:
            if op not in self._other:
                self._other.add(op)
                self._size += 1
            return
        prefix, n = parts
        marks = self._marks.setdefault(prefix, bytearray())
        if n >= len(marks):
            marks.extend(bytes(max(n + 1 - len(marks), len(marks) // 2, 1024)))
        if not marks[n]:
            marks[n] = 1
            self._size += 1

    def __contains__(self, op: object) -> bool:
        if not isinstance(op, str):
            return False
        parts = split(op)
        if parts is None:
            return op in self._other
        marks = self._marks.get(parts[0])
        return marks is not None and parts[1] < len(marks) and bool(marks[parts[1]])

    def __len__(self) -> int:
        return self._size

    def count_of(self, ops: OpIds) -> int:
        """Return how many of ``ops`` are in the set (a count over bytes, no id made)."""
        marks = self._marks.get(ops.prefix, b"")[: len(ops)]
        return len(marks) - marks.count(0)
