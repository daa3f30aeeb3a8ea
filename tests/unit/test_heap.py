"""The collector kept off a long process's loaded heap: frozen for a block, or for good in a fork server."""

from __future__ import annotations

import gc
import subprocess
import sys

from harness.heap import loaded_frozen


def test_the_loaded_heap_is_frozen_for_the_block_and_given_back_after() -> None:
    assert gc.get_freeze_count() == 0
    with loaded_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 1_000  # the interpreter's and the test run's own objects
        made = [[] for _ in range(100)]  # what the block allocates is collected as before
        # not frozen: the count does not grow (it may shrink: a frozen object still dies when its
        # last reference goes, as other threads of the test run let some go)
        assert gc.get_freeze_count() <= frozen
        del made
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_already_is_left_as_it_was() -> None:
    # In a child: freezing the test process for good would change every later test's collections.
    code = (
        "import gc\n"
        "from harness.heap import loaded_frozen\n"
        "gc.freeze(); before = gc.get_freeze_count()\n"
        "with loaded_frozen():\n"
        "    assert gc.get_freeze_count() == before\n"
        "assert gc.get_freeze_count() == before > 0\n"
        "print('kept')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout == "kept\n"
