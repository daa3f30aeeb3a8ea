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
