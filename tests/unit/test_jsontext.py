"""The hot paths' JSON text is exactly what json.dumps writes with the same options, and read as json.loads reads it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.jsontext import dumps, dumps_sorted, loads

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(VALUES)
def test_dumps_writes_what_json_dumps_writes(value: object) -> None:
    assert dumps(value) == json.dumps(value)


@given(st.dictionaries(st.text(max_size=8), VALUES, max_size=6))
def test_dumps_sorted_writes_what_json_dumps_writes_with_sorted_keys(value: dict[str, object]) -> None:
    assert dumps_sorted(value) == json.dumps(value, sort_keys=True, default=str)


def test_dumps_sorted_writes_any_other_object_as_its_text_and_dumps_refuses_it() -> None:
    detail = {"path": Path("/tmp/x"), "at": datetime(2026, 11, 30, tzinfo=UTC), "n": 1}
    assert dumps_sorted(detail) == json.dumps(detail, sort_keys=True, default=str)
    with pytest.raises(TypeError, match="Path"):
        dumps({"path": Path("/tmp/x")})


@given(VALUES, st.sampled_from(["", " ", "\n\t"]), st.sampled_from(["", " ", "\r\n"]), st.booleans())
def test_loads_reads_what_json_loads_reads(value: object, before: str, after: str, as_bytes: bool) -> None:
    text = before + json.dumps(value, ensure_ascii=False) + after
    data: str | bytes = text.encode() if as_bytes else text
    # compared as text: a NaN read back is not equal to itself
    assert json.dumps(loads(data)) == json.dumps(json.loads(data))


@pytest.mark.parametrize(
    "data",
    [
        b'\xef\xbb\xbf{"op": "bom"}',  # UTF-8 with a byte order mark: json.loads reads it
        '{"op": "utf-16"}'.encode("utf-16"),
        '{"op": "utf-32-le"}'.encode("utf-32-le"),
    ],
)
def test_loads_reads_bytes_of_another_encoding_as_json_loads_does(data: bytes) -> None:
    assert loads(data) == json.loads(data)


@pytest.mark.parametrize("data", ["", "{", '{"a": 1} x', '{"a": 1}{}', b"\xff{}", "[1,]", "nul"])
def test_loads_raises_the_error_json_loads_raises(data: str | bytes) -> None:
    expected = _raised(json.loads, data)
    assert type(_raised(loads, data)) is type(expected)
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        loads(data)


def _raised(read: Callable[[str | bytes], object], data: str | bytes) -> ValueError:
    try:
        read(data)
    except ValueError as exc:
        return exc
    raise AssertionError(f"{data!r} was read")
