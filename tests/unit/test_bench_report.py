"""docs/benchmarks.md sections: replaced in place, each saying which interpreter measured it."""

from __future__ import annotations

import platform
from pathlib import Path

from harness.bench.report import write_section


def test_a_section_is_replaced_in_place_and_names_the_interpreter_that_measured_it(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    write_section("A", "Command: `a`.\n\n| x |", doc)
    write_section("B", "Command: `b`.", doc)
    write_section("A", "Command: `a` again.", doc)
    text = doc.read_text()
    assert text.index("## A") < text.index("## B")  # replaced where it stood
    assert "Command: `a`.\n" not in text
    line = f"Measured by {platform.python_implementation()} {platform.python_version()} (`"
    assert text.count(line) == 2  # one a section, not one more at each rewrite
    assert text.split("## B")[0].rstrip().endswith("cores.")
