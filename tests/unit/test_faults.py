"""Fault specs refuse bad values with a fix in the message; ``active`` always heals and records."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import faults
from harness.errors import ConfigError
from harness.faults.base import Fault
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter

API = "http://127.0.0.1:1"  # never called: binding a spec talks to nobody


@pytest.mark.parametrize(
    ("make", "needle", "fix"),
    [
        (lambda: faults.Latency(ms=-1), "latency ms=-1", "whole milliseconds"),
        (lambda: faults.Latency(ms=10, jitter_ms=-5), "jitter_ms=-5", "jitter"),
        (lambda: faults.Latency(ms=1.5), "latency ms=1.5", "whole"),  # type: ignore[arg-type]
        (lambda: faults.Latency(ms=True), "latency ms=True", "whole"),
        (lambda: faults.Latency(ms=10, toxicity=1.5), "toxicity=1.5", "0.0 to 1.0"),
        (lambda: faults.Latency(ms=10, toxicity=-0.1), "toxicity=-0.1", "0.0 to 1.0"),
        (lambda: faults.Latency(ms=10, toxicity=float("nan")), "toxicity=nan", "0.0 to 1.0"),
        (lambda: faults.Latency(ms=10, stream="sideways"), "stream='sideways'", "'downstream'"),
        (lambda: faults.Bandwidth(kb_per_s=0), "kb_per_s=0", "Timeout(ms=0)"),
        (lambda: faults.SlowClose(delay_ms=-1), "delay_ms=-1", "milliseconds"),
        (lambda: faults.Timeout(ms=-1), "timeout ms=-1", "half-open"),
        (lambda: faults.ResetPeer(timeout_ms=-1), "timeout_ms=-1", "at once"),
        (lambda: faults.Slicer(avg_size=0), "avg_size=0", "at least 1 byte"),
        (lambda: faults.Slicer(avg_size=10, size_variation=10), "size_variation=10", "smaller than avg_size"),
        (lambda: faults.Slicer(avg_size=10, delay_us=-1), "delay_us=-1", "microseconds"),
        (lambda: faults.LimitData(bytes=-1), "bytes=-1", "byte budget"),
        (lambda: faults.KillBroker("rabbitmq"), "'rabbitmq'", "activemq, kafka, postgres"),
        (lambda: faults.Pause(pid=0), "pid=0", "Managed.pid"),
        (lambda: faults.Pause(pid=os.getpid()), f"pid={os.getpid()}", "pause a worker"),
        (lambda: faults.Latency(ms=10).on("", API), "bad proxy ''", "name the proxy"),
    ],
)
def test_bad_spec_names_the_value_and_the_fix(make: Any, needle: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert needle in str(info.value)
    assert fix in (info.value.hint or "")


def test_good_specs_are_frozen_values() -> None:
    a = faults.Latency(ms=200, jitter_ms=20, stream="upstream", toxicity=0.5)
    b = faults.Latency(200, 20, stream="upstream", toxicity=0.5)
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.ms = 1  # type: ignore[misc]
    fault = a.on("postgres", API)
    assert fault.name == "latency:postgres:upstream"
    assert fault.params()["ms"] == 200
    assert fault.params()["toxicity"] == 0.5
    assert faults.Latency(1).on("postgres", API).toxic != faults.Latency(1).on("postgres", API).toxic  # no 409 on reuse
    assert faults.Partition().on("kafka", API).name == "partition:kafka"
    assert faults.Slicer(avg_size=10, size_variation=9, delay_us=5).attributes() == {
        "average_size": 10,
        "size_variation": 9,
        "delay": 5,
    }


@dataclass
class Recording:
    """A fault that only records calls, so ``active`` can be tested without a stack."""

    calls: list[str] = field(default_factory=list)
    fail_apply: bool = False

    @property
    def name(self) -> str:
        return "recording"

    def params(self) -> dict[str, object]:
        return {"size": 3, "offset": 7}  # 'offset' is also a ledger column: must stay in the detail

    def apply(self) -> None:
        self.calls.append("apply")
        if self.fail_apply:
            raise RuntimeError("apply broke half-way")

    def heal(self) -> None:
        self.calls.append("heal")


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    rows = []
    for seg in sorted((tmp_path / "segments").glob("*.jsonl")):
        rows += [json.loads(line) for line in seg.read_text().splitlines()]
    return rows


def test_active_records_a_start_end_pair(tmp_path: Path) -> None:
    fault = Recording()
    assert isinstance(fault, Fault)
    with LedgerWriter(tmp_path, "faults") as ledger, faults.active(fault, ledger) as got:
        assert got is fault
        assert fault.calls == ["apply"]
    assert fault.calls == ["apply", "heal"]
    start, end = _events(tmp_path)
    assert (start["kind"], end["kind"]) == (Kind.FAULT_START, Kind.FAULT_END)
    assert start["point"] == end["point"] == "recording"
    assert start["offset"] is None
    assert json.loads(start["detail"]) == {"size": 3, "fault_offset": 7}
    assert "heal_s" in json.loads(end["detail"])


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_active_heals_when_the_body_raises(tmp_path: Path, error: type[BaseException]) -> None:
    fault = Recording()
    with pytest.raises(error), LedgerWriter(tmp_path, "faults") as ledger, faults.active(fault, ledger):
        raise error()
    assert fault.calls == ["apply", "heal"]
    assert json.loads(_events(tmp_path)[-1]["detail"])["error"] == error.__name__


def test_active_heals_a_half_applied_fault(tmp_path: Path) -> None:
    fault = Recording(fail_apply=True)
    with pytest.raises(RuntimeError, match="half-way"), faults.active(fault):
        pytest.fail("the body must not run when apply failed")
    assert fault.calls == ["apply", "heal"]
