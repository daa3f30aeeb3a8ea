"""The hot paths' JSON text is exactly what json.dumps writes with the same options."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.jsontext import dumps, dumps_sorted

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
