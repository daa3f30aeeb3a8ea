"""A soak's witness sample names the nemesis kills of the workers an anomalous operation passed through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.ledger.reader import compact
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.soak.witnesses import Kill, kills_during, nemesis_kills, witness_sample
from harness.verify.verdict import Verdict, Witness


def _event(ts: int, src: str, kind: Kind, **extra: Any) -> dict[str, Any]:
    return {"ts_ns": ts, "src": src, "seq": ts, "kind": str(kind), "op": "op-1", **extra}


# worker-1 commits the effect and is killed before the broker commit; worker-2 applies it again
CHAIN = (
    _event(5, "driver", Kind.SUBMIT),
    _event(10, "worker-1", Kind.DELIVER),
    _event(20, "worker-1", Kind.DB_COMMIT),
    _event(40, "worker-2", Kind.DELIVER),
    _event(45, "worker-2", Kind.DB_COMMIT),
    _event(100, "driver", Kind.RESIDUE_EFFECT),  # the books at close: not part of the flight
)
DUPLICATE = Witness("duplicate-effect", "op-1", ("m-1",), {"effects": 2}, CHAIN)


def test_a_kill_counts_when_it_hits_a_writer_of_the_operation_while_in_flight() -> None:
    kills = [
        Kill(30, "worker-1"),  # between worker-1's commit and the redelivery: the cause
        Kill(30, "worker-3"),  # another worker: it never held the operation
        Kill(2, "worker-1"),  # before the operation was submitted
        Kill(60, "worker-2"),  # after its last event and before the snapshot at close
    ]
    assert kills_during(DUPLICATE, kills) == [Kill(30, "worker-1")]
    assert kills_during(Witness("lost", "op-2", (), {}, ()), kills) == []


def test_a_service_operation_counts_every_instance_killed_while_it_was_in_flight() -> None:
    # A service writes no event: the driver's submission and the output it read are the flight.
    chain = (
        _event(5, "driver", Kind.SUBMIT),
        _event(50, "driver", Kind.DOWNSTREAM),
        _event(52, "driver", Kind.DOWNSTREAM),  # the redelivered copy's output
        _event(100, "driver", Kind.RESIDUE_EFFECT),
    )
    kills = [Kill(2, "svc-0"), Kill(30, "svc-1"), Kill(40, "svc-0"), Kill(70, "svc-1")]
    witness = Witness("duplicate-effect", "op-1", ("m-1",), {"effects": 2}, chain)
    assert kills_during(witness, kills) == [Kill(30, "svc-1"), Kill(40, "svc-0")]


def test_the_sample_lists_the_kill_beside_the_crashes_in_its_chain() -> None:
    crash = _event(25, "worker-1", Kind.CRASH, point="after_db_commit", detail={"action": "kill"})
    witness = Witness("duplicate-effect", "op-1", ("m-1",), {"effects": 2}, (*CHAIN, crash))
    others = tuple(Witness("duplicate-effect", f"op-{i}", (), {}, ()) for i in range(2, 9))
    verdict = Verdict({"duplicate-effect": 8}, (witness, *others), {}, "in-process")
    sample = witness_sample(verdict, [Kill(30, "worker-1")], per_class=3)
    assert [w["op"] for w in sample["duplicate-effect"]] == ["op-1", "op-2", "op-3"]
    assert sample["duplicate-effect"][0]["crashes"] == [
        "kill at after_db_commit in worker-1",
        "kill of worker-1 (nemesis)",
    ]
    assert sample["duplicate-effect"][1]["crashes"] == []


def test_the_kills_are_read_from_the_compacted_ledger(tmp_path: Path) -> None:
    assert nemesis_kills(tmp_path) == ()  # no compacted ledger: nothing to read
    driver = LedgerWriter(tmp_path / "ledger", "driver")
    driver.emit(Kind.SUBMIT, op="op-1")
    driver.emit(Kind.CRASH, point="kill", stage="s", worker="worker-1", action="kill")
    worker = LedgerWriter(tmp_path / "ledger", "worker-0")
    worker.emit(Kind.CRASH, op="op-1", point="after_db_commit", worker="worker-0", action="kill")  # a crash point
    worker.emit(Kind.CRASH, point="poison", worker="worker-0")  # not a kill
    driver.emit(Kind.CRASH, point="kill", stage="s", worker="instance-2", action="kill")
    driver.close()
    worker.close()
    compact(tmp_path / "ledger")
    kills = nemesis_kills(tmp_path)
    assert [k.worker for k in kills] == ["worker-1", "instance-2"]
    assert kills[0].ts_ns < kills[1].ts_ns


def test_the_driver_does_not_load_pyarrow_dataset_while_it_drives() -> None:
    """pyarrow.dataset is 45 MB of the driver's resident size: only the sample, after the run, loads it."""
    code = "import sys, harness.soak.driver; print('pyarrow.dataset' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_invariant_witness_says_what_the_books_show_not_a_fault_it_fell_in() -> None:
    # A soak of deposit_crash_gap:upsert printed "invariant-broken: op invariant:balance during no
    # fault window or kill": the check is of the books at the close, not of an operation in flight.
    detail = {"label": "sum(accounts.balance)", "actual": 1040, "expected": 1000, "holds": False}
    detail |= {"applied_twice": ["op-7"], "applied_twice_n": 1}
    books = (_event(100, "driver", Kind.RESIDUE_INVARIANT, detail=detail),)
    broken = Witness("invariant-broken", "invariant:balance", (), {}, books)
    sample = witness_sample(Verdict({"invariant-broken": 1}, (broken, DUPLICATE), {}, "in-process"))
    (said,) = sample["invariant-broken"]
    assert said["said"].startswith("sum(accounts.balance) = 1,040, expected 1,000: op")
    assert "said" not in sample["duplicate-effect"][0]


def test_an_operation_that_stopped_short_gets_the_fault_that_came_next() -> None:
    # A service that acknowledged a message first and then died with the database wrote nothing
    # more: the lost operation's span ends at its submit, no window overlaps it, and the sample
    # said "during no fault window or kill" about an operation lost 0.8 s before kill9:postgres.
    lost = Witness("lost", "op-1", (), {"submitted": 1}, (_event(5, "driver", Kind.SUBMIT),))
    faults = (
        {"type": "fault", "name": "latency:postgres", "armed_ns": 2, "fired_ns": 2, "end_ns": 4},  # before it
        {"type": "fault", "name": "kill9:postgres", "armed_ns": 805, "fired_ns": 805, "end_ns": 900},
        {"type": "crash", "name": "after_db_commit", "armed_ns": 6, "fired_ns": 7},  # not a window
    )
    duplicate = Witness("duplicate-effect", "op-2", (), {"effects": 2}, (_event(5, "driver", Kind.SUBMIT),))
    verdict = Verdict({"lost": 1, "duplicate-effect": 1}, (lost, duplicate), {}, "in-process", faults=faults)
    sample = witness_sample(verdict, [Kill(2_000_000_005, "svc-0")])
    assert sample["lost"][0]["after"] == "its last event came 0.0s before kill9:postgres"
    assert "after" not in sample["duplicate-effect"][0]  # a duplicate with no fault is the flow's own race
    later = witness_sample(
        Verdict({"lost": 1}, (lost,), {}, "in-process", faults=faults[:1]), [Kill(1_500_000_005, "svc-0")]
    )
    assert later["lost"][0]["after"] == "its last event came 1.5s before a kill of svc-0 (nemesis)"
    assert "after" not in witness_sample(Verdict({"lost": 1}, (lost,), {}, "in-process"))["lost"][0]  # nothing came
