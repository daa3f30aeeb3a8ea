"""Quiescence's settlement tracker: a message is settled only by the process that last received it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.ledger.schema import Kind
from harness.ledger.tail import LedgerTail
from harness.ledger.writer import LedgerWriter
from harness.run.transports import settle
from harness.run.transports.settle import Settlement

# A worker that receives m-1, commits the DB and is SIGKILLed before its broker commit.
KILLED_AFTER_DB_COMMIT = """
import os, signal, sys
from pathlib import Path
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
w = LedgerWriter(Path(sys.argv[1]), "worker-1")
w.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
w.emit(Kind.DB_COMMIT, op="op-1", msg="m-1")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_worker(ledger: Path) -> None:
    subprocess.run([sys.executable, "-c", KILLED_AFTER_DB_COMMIT, str(ledger)], check=False, timeout=60)


def test_a_message_held_by_a_killed_worker_is_unsettled_until_redelivered_and_committed(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    settlement = Settlement(ledger)
    _killed_worker(ledger)
    assert settlement.unsettled() == {"m-1"}
    # The replacement's segment sorts before the killed worker's: read order must not matter.
    with LedgerWriter(ledger, "a-replacement") as w:
        w.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=2)
        assert settlement.unsettled() == {"m-1"}
        w.emit(Kind.BROKER_COMMIT, op="op-1", msg="m-1")
    assert settlement.unsettled() == set()
    assert Settlement(ledger).unsettled() == set()  # the same from a cold read of both segments


def test_a_nack_settles_and_a_commit_by_another_process_does_not(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    _killed_worker(ledger)
    with LedgerWriter(ledger, "worker-2") as w:
        w.emit(Kind.DELIVER, op="op-2", msg="m-2", attempt=1)
        w.emit(Kind.NACK, op="op-2", msg="m-2")
        w.emit(Kind.BROKER_COMMIT, op="op-1", msg="m-1")
    # A commit of m-1 by a process that did not receive it last does not settle worker-1's delivery.
    settlement = Settlement(ledger)
    assert settlement.unsettled() == {"m-1"}


def test_the_tail_yields_each_complete_event_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    tail = LedgerTail(ledger)
    with LedgerWriter(ledger, "driver") as w:
        w.emit(Kind.SUBMIT, op="op-1")
        assert [e["op"] for e in tail.new()] == ["op-1"]
        w.emit(Kind.SUBMIT, op="op-2")
        segment = w.path
    with segment.open("ab") as fh:
        fh.write(b'{"kind": "submit", "op": "op-3"')  # a line still being written
    assert [e["op"] for e in tail.new()] == ["op-2"]
    assert list(tail.new()) == []


def test_a_nacked_operation_is_given_back_until_it_is_delivered_again_or_comes_out(tmp_path: Path) -> None:
    # With the broker's redelivery plugin a NACKed message is out of every queue for a second or
    # more: quiescence must not take that silence for an idle flow.
    ledger = tmp_path / "ledger"
    settlement = Settlement(ledger)
    with LedgerWriter(ledger, "worker-1") as w:
        w.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
        w.emit(Kind.NACK, op="op-1", msg="m-1")
        w.emit(Kind.DELIVER, op="op-2", msg="m-2", attempt=1)
        w.emit(Kind.FORCED_REDELIVERY, op="op-2", msg="m-2", action="nack")  # the NACK has no event of its own
        assert settlement.unsettled() == set()
        assert settlement.given_back(set()) == {"op-1", "op-2"}
        assert settlement.given_back({"op-2"}) == {"op-1"}  # op-2 came out (dead-lettered)
        w.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=2)
        assert settlement.given_back(set()) == {"op-2"}
        assert settlement.unsettled() == {"m-1"}


def test_the_tail_parses_only_the_kinds_asked_for_and_still_sees_every_line(tmp_path: Path) -> None:
    """Settlement reads four kinds of a worker's five or so a message: the others are skipped by
    their bytes, unparsed, but a line of any kind still tells the driver the ledger grew."""
    ledger = tmp_path / "ledger"
    tail = LedgerTail(ledger)
    with LedgerWriter(ledger, "worker-1") as w:
        w.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
        w.emit(Kind.SEND, op="op-1", msg="m-1", note='"kind":"deliver" in a detail')  # escaped there
        w.emit(Kind.DB_COMMIT, op="op-1", msg="m-1")
        w.emit(Kind.BROKER_COMMIT, op="op-1", msg="m-1")
        segment = w.path
    with segment.open("ab") as fh:
        fh.write(b'{"ts_ns":2,"kind":"deliver","op":"op-3" torn\n')  # a wanted kind, damaged
        fh.write(b'{"ts_ns":3,"kind":"db_commit","op":"op-4" torn\n')  # an unwanted kind: skipped unread
    # another writer's spacing: no line of that segment is skipped by its bytes
    (ledger / "segments" / "other-1.jsonl").write_bytes(
        b'{"kind": "deliver", "op": "op-2", "ts_ns": 1}\n{"kind": "send", "op": "op-2"} torn\n'
    )
    got = [(e["kind"], e["op"]) for e in tail.new((Kind.DELIVER, Kind.BROKER_COMMIT))]
    assert got == [("deliver", "op-2"), ("deliver", "op-1"), ("broker_commit", "op-1")]
    assert tail.lines == 8
    assert tail.damaged == 2  # the torn deliver, and the other writer's torn line (parsed to know its kind)
    assert list(tail.new((Kind.DELIVER,))) == []
    assert tail.lines == 8


def test_any_event_tells_the_settlement_the_ledger_grew(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    settlement = Settlement(ledger)
    with LedgerWriter(ledger, "worker-1") as w:
        w.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
        settlement.unsettled()
        before = settlement.last_event
        w.emit(Kind.DB_COMMIT, op="op-1", msg="m-1")  # a kind the settlement does not read
        settlement.unsettled()
        assert settlement.last_event > before


def _as_pid(ledger: Path, src: str, pid: int) -> LedgerWriter:
    """A writer whose events say they came from process ``pid`` (one test process plays several)."""
    w = LedgerWriter(ledger, src)
    w.pid = pid
    return w


def test_a_dead_receivers_stale_copy_of_a_committed_message_is_settled_at_once(tmp_path: Path) -> None:
    # worker-1 froze holding m-1; the broker gave m-1 to worker-0, which committed it; worker-1,
    # thawed, read the stale frame (the latest delivery) and died of its cut connection.
    ledger = tmp_path / "ledger"
    with _as_pid(ledger, "worker-0", 100) as w0, _as_pid(ledger, "worker-1", 200) as w1:
        w0.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
        w0.emit(Kind.BROKER_COMMIT, op="op-1", msg="m-1")
        w1.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
    settlement = Settlement(ledger)
    assert settlement.unsettled() == {"m-1"}  # no liveness known: the receiver may still settle it
    assert settlement.unsettled((), live={100, 200}) == {"m-1"}  # worker-1 alive: it settles it or dies
    # worker-1 gone: the broker dropped m-1 at worker-0's commit, nothing can come of the copy,
    # whether or not its operation is known to be out and however recent the delivery
    assert settlement.unsettled((), live={100}) == set()


def test_a_dead_receivers_message_nobody_committed_waits_until_in_doubt_and_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # worker-1 died holding m-1 (its connection cut under a fault); the broker may still hold it.
    ledger = tmp_path / "ledger"
    with _as_pid(ledger, "worker-1", 200) as w1:
        w1.emit(Kind.DELIVER, op="op-1", msg="m-1", attempt=1)
    settlement = Settlement(ledger)
    assert settlement.unsettled({"op-1"}, live={100}) == {"m-1"}  # recent: a redelivery may be on its way
    monkeypatch.setattr(settle, "IN_DOUBT_S", 0.0)
    assert settlement.unsettled(set(), live={100}) == {"m-1"}  # old, but its operation never came out
    assert settlement.unsettled({"op-1"}, live={100}) == set()  # old and out: the commit came from elsewhere
