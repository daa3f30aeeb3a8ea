"""Postgres array literals: a whole column of a batch as one text parameter.

A batch statement that inserts many rows at once passes each column as an array and unnests it
(``unnest(CAST(:ops AS text[]), ...)``). Passed a Python list, psycopg dumps it element by element
in Python: for six columns of 500 rows, 4.1-4.9 ms of the client's CPU per statement, the Kafka
inbox consumer's largest cost after its ledger. The same columns as array literals cost 1.3-1.8 ms
(docs/benchmarks.md has the command), and Postgres reads them with the array type's own input
function, which an explicit ``CAST`` from text runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast


def _element(value: str | int | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"an array literal takes str, int or None, not {type(value).__name__}: {value!r}")
    if isinstance(value, int):
        return str(value)
    # Quoted, so that commas, braces, blanks, an empty string and the word NULL stay text.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def array_literal(values: Iterable[str | int | None]) -> str:
    """Return ``values`` as a one-dimensional Postgres array literal (``{"a","b"}``, ``{1,2}``).

    Pass it where the statement casts it to the array type: ``CAST(:p AS text[])``, ``%s::int[]``.
    A None element is NULL; anything but str, int or None raises TypeError.
    """
    items = values if isinstance(values, list) else list(values)
    kinds = set(map(type, items))  # the types checked in C, not a call an element
    if kinds == {int}:
        return "{" + ",".join(map(str, items)) + "}"
    if kinds == {str}:
        joined = '","'.join(cast("list[str]", items))  # quoted alike, unless an element holds what must be escaped
        if joined.count('"') == 2 * (len(items) - 1) and "\\" not in joined:
            return '{"' + joined + '"}'
    return "{" + ",".join(map(_element, items)) + "}"
