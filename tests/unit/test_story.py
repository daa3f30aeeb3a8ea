"""An operation's story: what the ledger recorded of it, in order, from segments or the compacted parquet."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.ledger.reader import compact
from harness.ledger.schema import Kind
from harness.ledger.story import REASON_CHARS, story
from harness.ledger.writer import LedgerWriter

OP = "guarded-bank-crash-s0-op00007"
REFUSED = "not transferred: the bank at http://127.0.0.1:5 refused connections for 5s"


def _ledger(tmp_path: Path) -> Path:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "driver") as driver, LedgerWriter(ledger, "worker-0") as worker:
        driver.emit(Kind.SUBMIT, op=OP)
        driver.emit(Kind.SUBMIT, op="another-op")
        worker.emit(Kind.DELIVER, op=OP, attempt=1)
        worker.emit(Kind.DELIVER, op=OP, attempt=2)
        worker.emit(Kind.ALERT, op=OP, reason=REFUSED)
        driver.emit(Kind.DEAD_LETTER, op=OP)
    return ledger


@pytest.mark.parametrize("compacted", [False, True], ids=["segments", "parquet"])
def test_the_story_names_each_event_of_the_operation_in_order_with_its_reason(tmp_path: Path, compacted: bool) -> None:
    ledger = _ledger(tmp_path)
    if compacted:
        compact(ledger)
    assert story(ledger, OP) == (
        f"the ledger has of {OP}: submit (driver); deliver (worker-0); deliver (worker-0, attempt 2); "
        f"alert (worker-0, {REFUSED!r}); dead_letter (driver)"
    )


def test_a_long_story_and_a_long_reason_are_cut(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with LedgerWriter(ledger, "worker-0") as worker:
        worker.emit(Kind.ALERT, op=OP, reason="x" * (REASON_CHARS + 50))
        for attempt in range(1, 15):
            worker.emit(Kind.DELIVER, op=OP, attempt=attempt)
    told = story(ledger, OP, limit=3)
    assert f"alert (worker-0, {'x' * REASON_CHARS + '...'!r})" in told
    assert told.endswith("deliver (worker-0, attempt 2), and 12 more")


def test_an_operation_the_ledger_never_saw_is_said_so(tmp_path: Path) -> None:
    assert story(_ledger(tmp_path), "op-nobody-sent") == "the ledger has no event of op-nobody-sent"
