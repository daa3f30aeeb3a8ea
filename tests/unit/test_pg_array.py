"""Array literals for batch parameters (``harness.clients.pg_array``); Postgres reads them back in
``tests/integration/test_pg_array.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.clients.pg_array import _element, array_literal


def test_ints_are_bare_and_none_is_null() -> None:
    assert array_literal([1, -2, 30]) == "{1,-2,30}"
    assert array_literal([1, None]) == "{1,NULL}"
    assert array_literal([]) == "{}"


def test_every_string_is_quoted_and_escaped() -> None:
    # Unquoted, a comma or brace would split the element, a blank would be trimmed, and "NULL"
    # or an empty string would not be text.
    assert array_literal(["a", "b,c", "{d}", " e ", "", "NULL"]) == '{"a","b,c","{d}"," e ","","NULL"}'
    assert array_literal(['say "hi"', "back\\slash"]) == '{"say \\"hi\\"","back\\\\slash"}'


@pytest.mark.parametrize("value", [True, 1.5, b"x", object()])
def test_other_types_are_refused_naming_the_value(value: object) -> None:
    with pytest.raises(TypeError, match="str, int or None"):
        array_literal([value])  # type: ignore[list-item]


def _one_by_one(values: list[str | int | None]) -> str:
    """The literal built element by element, as ``array_literal`` builds any list it has no shortcut for."""
    return "{" + ",".join(_element(v) for v in values) + "}"


@given(
    st.one_of(
        st.lists(st.integers(-(2**70), 2**70)),
        st.lists(st.text()),
        st.lists(st.sampled_from(['a"', "\\", "plain", "", '"'])),
        st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3))),
    )
)
def test_the_shortcuts_write_what_the_element_by_element_literal_does(values: list[str | int | None]) -> None:
    assert array_literal(values) == _one_by_one(values)
    assert array_literal(iter(values)) == _one_by_one(values)
