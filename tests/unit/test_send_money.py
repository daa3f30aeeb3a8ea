"""The send-money pattern's pure parts: the state machine's steps, the invariant, the bank over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.ledger.schema import Kind
from harness.patterns.bank import BankError, BankServer, Execute, transfer
from harness.patterns.send_money import Outcome, State, Step, outcomes, step_for, violations


def test_first_delivery_calls_an_unfinished_call_refuses_a_finished_one_completes() -> None:
    assert step_for(None) is Step.CALL
    assert step_for(State.CALLING) is Step.REFUSE
    assert step_for(State.DONE) is Step.COMPLETE


def _events(op: str, *kinds: Kind) -> list[dict[str, Any]]:
    return [{"kind": str(k), "op": op} for k in (Kind.SUBMIT, *kinds)]


def test_outcomes_count_per_submitted_operation() -> None:
    events = [
        *_events("a", Kind.DELIVER, Kind.EXTERNAL_CALL, Kind.DELIVER, Kind.EXTERNAL_CALL, Kind.RESIDUE_EFFECT),
        *_events("b", Kind.DELIVER, Kind.ALERT, Kind.DEAD_LETTER),
        {"kind": str(Kind.RUN_END), "op": None},
        {"kind": str(Kind.EXTERNAL_CALL), "op": "never-submitted"},
    ]
    assert outcomes(events) == {
        "a": Outcome(transfers=2, booked=1, dead_letters=0, alerts=0),
        "b": Outcome(transfers=0, booked=0, dead_letters=1, alerts=1),
    }


@pytest.mark.parametrize(
    ("outcome", "broken"),
    [
        (Outcome(1, 1, 0, 0), []),  # paid and booked
        (Outcome(1, 0, 1, 1), []),  # in doubt, flagged: a human reads the statement
        (Outcome(0, 0, 1, 1), []),  # never sent, flagged
        (Outcome(1, 0, 1, 0), []),  # a silent dead letter is the verdict's dead-lettered, not this
        (Outcome(2, 1, 0, 0), ["op: 2 transfers"]),
        (Outcome(0, 0, 0, 0), ["op: no transfer, and not dead-lettered"]),
        (Outcome(0, 0, 1, 0), ["op: no transfer, and dead-lettered without an alert"]),
        (Outcome(0, 1, 0, 0), ["op: no transfer, and not dead-lettered", "op: booked with no transfer"]),
        (Outcome(3, 1, 1, 1), ["op: 3 transfers"]),
    ],
)
def test_invariant(outcome: Outcome, broken: list[str]) -> None:
    assert violations({"op": outcome}) == broken


class Bank:
    """An in-memory bank behind the real HTTP front."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []
        self.hook: Execute | None = None

    def execute(self, op: str, amount: int) -> str:
        if self.hook is not None:
            self.hook(op, amount)
        self.done.append((op, amount))
        return f"T{len(self.done)}"


def _serve(server: BankServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def bank() -> Iterator[tuple[Bank, BankServer]]:
    book = Bank()
    server = BankServer(0, book.execute)
    _serve(server)
    yield book, server
    server.shutdown()
    server.server_close()


def test_a_transfer_returns_the_bank_reference(bank: tuple[Bank, BankServer]) -> None:
    book, server = bank
    assert transfer(server.url, "op-1", 5) == "T1"
    assert transfer(server.url, "op-1", 5) == "T2"  # the bank executes what it is told, twice if told twice
    assert book.done == [("op-1", 5), ("op-1", 5)]


def test_a_refusal_is_known_not_executed(bank: tuple[Bank, BankServer]) -> None:
    _, server = bank
    with pytest.raises(BankError, match="HTTP 404") as info:
        transfer(server.url + "/nowhere", "op-1", 5)
    assert info.value.sent is False


def test_a_dropped_connection_is_in_doubt(bank: tuple[Bank, BankServer]) -> None:
    book, server = bank

    def die(op: str, amount: int) -> str:
        raise RuntimeError("the bank process died here")  # the server drops the connection unanswered

    book.hook = die
    with pytest.raises(BankError, match="in doubt") as info:
        transfer(server.url, "op-1", 5)
    assert info.value.sent is True


def test_a_slow_answer_is_in_doubt(bank: tuple[Bank, BankServer]) -> None:
    book, server = bank
    book.hook = lambda op, amount: str(time.sleep(0.5))
    with pytest.raises(BankError, match="in doubt") as info:
        transfer(server.url, "op-1", 5, timeout_s=0.1)
    assert info.value.sent is True


def test_a_refused_connection_is_retried_while_the_bank_restarts() -> None:
    book = Bank()
    probe = BankServer(0, book.execute)
    port = probe.server_address[1]
    probe.server_close()  # nothing listens on port now: connections are refused
    started: list[BankServer] = []

    def restart() -> None:
        time.sleep(0.3)
        started.append(BankServer(port, book.execute))
        _serve(started[0])

    threading.Thread(target=restart, daemon=True).start()
    try:
        assert transfer(f"http://127.0.0.1:{port}", "op-1", 5, connect_for_s=5) == "T1"
    finally:
        for server in started:
            server.shutdown()
            server.server_close()
    with pytest.raises(BankError, match="refused connections") as info:
        transfer(f"http://127.0.0.1:{port}", "op-2", 5, connect_for_s=0.2)
    assert info.value.sent is False
    assert book.done == [("op-1", 5)]
