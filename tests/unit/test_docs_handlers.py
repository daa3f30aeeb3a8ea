"""Every Python block of docs/handlers.md runs: the names it imports are exported and its specs are valid."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "handlers.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_an_example_per_handler_kind() -> None:
    text = "".join(BLOCKS)
    for name in ("StageContext", "KafkaContext", "batch_handler", "BatchFailed", "ProcessContext", "FaultWindow"):
        assert name in text


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_each_block_runs(block: str) -> None:
    exec(compile(block, str(DOC), "exec"), {"__name__": "docs_handlers"})


def test_the_readme_example_expects_what_the_example_project_proves() -> None:
    # Issue 13 finding 6: the README asserted `verdict.clean` for a naive insert crashed after its
    # DB commit, which (correctly) reports duplicate-effect. The section now follows the example.
    readme = (DOC.parents[1] / "README.md").read_text()
    section = readme.split("## Using it from another repository", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    test_block = next(b for b in blocks if "def test_" in b)
    assert "place_order_naive" in test_block
    assert "verdict.clean" not in test_block
    assert '{"duplicate-effect"}' in test_block
    example = DOC.parents[1] / "examples" / "orders-service"
    handlers = (example / "orders" / "handlers.py").read_text()
    tests = (example / "tests" / "test_orders.py").read_text()
    for name in re.findall(r"orders\.handlers:(\w+)", section) + re.findall(r"`(place_order\w*)`", section):
        assert f"def {name}(" in handlers, name
    assert '{"duplicate-effect"}' in tests
