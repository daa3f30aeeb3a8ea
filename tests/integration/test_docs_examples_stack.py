"""The docs' examples that act on a running stack (faults, traps) run as written against the real one.

``tests/unit/test_docs_examples.py`` runs every other block; these name the stack's ``endpoints``
and get the real ones, a real ledger, a real worker process (in its own process group, as the
harness starts workers) and a real service process for the trap to kill.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from harness.ledger.reader import read_segments
from harness.ledger.writer import LedgerWriter
from harness.stack.base import Endpoints
from tests.unit.test_docs_examples import STACK_BLOCKS

pytestmark = [pytest.mark.integration, pytest.mark.activemq]


@pytest.mark.parametrize(("where", "code"), STACK_BLOCKS, ids=[w for w, _ in STACK_BLOCKS])
def test_each_stack_example_runs_as_written(where: str, code: str, txchaos_stack: Endpoints, tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []

    def start(**_: Any) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(["sleep", "120"], start_new_session=True))
        return procs[-1]

    fired: list[object] = []
    ledger = LedgerWriter(tmp_path / "ledger", "docs")
    namespace: dict[str, Any] = {
        "__name__": "example",
        "endpoints": txchaos_stack,
        "ep": txchaos_stack,
        "ledger": ledger,
        "worker": start(),
        "ledger_event": fired.append,
        "start_service": start,
    }
    started = time.monotonic()
    try:
        exec(compile(code, where, "exec"), namespace)
    finally:
        ledger.close()
        for p in procs:
            p.kill()
            p.wait()
    if "active(" in code:  # each fault the example applies is in the ledger, opened and healed
        kinds = read_segments(tmp_path / "ledger").column("kind").to_pylist()
        assert kinds.count("fault_start") == kinds.count("fault_end") == code.count("with active(")
    assert time.monotonic() - started < 120
