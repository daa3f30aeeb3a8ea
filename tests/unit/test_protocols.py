"""The one table of protocols (``harness.protocols``) and the Go daemon (trapd)'s own names for them agree."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from harness.protocols import PROTOCOLS, TRAPPED, Protocol, by_name
from harness.stack.base import Endpoints

TRAPD = Path(__file__).resolve().parents[2] / "harness" / "traps" / "trapd"


def go_protocols(source: str) -> dict[str, str]:
    """Return trapd's ``Protocols`` map (protocol -> reader) as control.go writes it."""
    match = re.search(r"var Protocols = map\[string\]string\{([^}]*)\}", source)
    if match is None:
        raise AssertionError("trapd/control.go has no `var Protocols = map[string]string{...}`")
    return dict(re.findall(r'"(\w+)":\s*"(\w+)"', match.group(1)))


def test_trapd_reads_exactly_the_trapped_protocols_of_the_table() -> None:
    go = go_protocols((TRAPD / "control.go").read_text())
    assert go == {p.name: p.reader for p in TRAPPED}, "edit harness/protocols.py and trapd/control.go together"


def test_the_go_map_parser_sees_a_disagreement() -> None:
    edited = 'var Protocols = map[string]string{"postgres": "pg", "amqp": "amqp"}'
    assert go_protocols(edited) == {"postgres": "pg", "amqp": "amqp"} != {p.name: p.reader for p in TRAPPED}


def test_the_trap_feed_has_a_reader_for_every_trapped_protocol() -> None:
    feed = (TRAPD / "feed.go").read_text()
    missing = [p.name for p in TRAPPED if f'case "{p.name}":' not in feed]
    assert not missing, f"trapd/feed.go reads no {missing}"


@pytest.mark.parametrize("p", TRAPPED, ids=lambda p: p.name)
def test_every_point_is_named_by_its_reader(p: Protocol) -> None:
    reader = (TRAPD / f"{p.reader}.go").read_text()
    for point in p.points:
        assert point.name.startswith(f"{p.reader}_"), point.name
        assert f'"{point.name}"' in reader, f"trapd/{p.reader}.go never reports {point.name}"
        assert point.unreached.startswith(("the service", "the broker", "Postgres")), point.unreached


def test_every_protocol_has_its_endpoints_field_and_a_unique_proxy() -> None:
    names = {f.name for f in fields(Endpoints)}
    assert {p.endpoint for p in PROTOCOLS} <= names
    assert len({p.proxy for p in PROTOCOLS}) == len(PROTOCOLS)
    placeholders = [n for p in PROTOCOLS for n in p.placeholders]
    assert len(set(placeholders)) == len(placeholders)


def test_an_unknown_protocol_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="postgres, stomp, openwire, kafka, dtm"):
        by_name("amqp")
