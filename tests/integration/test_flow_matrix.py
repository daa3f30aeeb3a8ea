"""Every registered flow x transport pair runs a smoke example on the real stack.

The example is a built-in scenario's variant made small (4 operations, its first crash on
operation 1): the run must crash where armed, close its books, and give the verdict the
scenario itself expects. A flow registered without a smoke example fails here, so a new flow
or transport cannot land untested.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow.compute as pc
import pytest

from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.run.spec.files import resolve
from harness.run.spec.flow import flows
from harness.run.spec.scenario import ScenarioSpec

MESSAGES = 4
SERVICES = Path(__file__).resolve().parents[2] / "examples" / "services" / "services_scenario.py"
# Flow name -> the built-in scenario variant its smoke example is made from.
SMOKE = {
    "activemq": "onepc_crash_gap:naive",
    "kafka": "kafka_consumer:naive-mid-batch",
    "kafka_saga": "kafka_saga:naive",
    "kafka_cqrs": "kafka_cqrs:versioned",
    "dtm": "dtm_transfer:after-commit",
    # A team's own service (examples/services): the Python STOMP one, the Go Kafka one.
    "service_activemq": f"{SERVICES}:py-naive",
    "service_kafka": f"{SERVICES}:go-naive",
}
MARKS = {"activemq": pytest.mark.activemq, "kafka": pytest.mark.kafka, "http": pytest.mark.dtm}
PAIRS = [pytest.param(f.name, f.transport, marks=MARKS[f.transport], id=f"{f.name}-{f.transport}") for f in flows()]


def smoke(flow: str) -> ScenarioSpec:
    """Return the small example of ``flow``: its scenario variant with 4 operations and one crash on op 1."""
    spec = resolve(SMOKE[flow], seed=0)[0]
    crash = replace(spec.crashes[0], op_index=1)
    return replace(spec, messages=MESSAGES, crashes=(crash,))


def test_every_registered_flow_has_a_smoke_example_of_its_own_flow() -> None:
    assert {f.name for f in flows()} == set(SMOKE)
    for flow in flows():
        spec = smoke(flow.name)
        assert spec.flow is flow
        assert spec.messages == MESSAGES
        assert len(spec.crashes) == 1


@pytest.mark.integration
@pytest.mark.parametrize(("flow", "transport"), PAIRS)
def test_flow_runs_a_smoke_example(txchaos_run, flow: str, transport: str) -> None:  # type: ignore[no-untyped-def]
    spec = smoke(flow)
    assert spec.flow.transport == transport
    result = txchaos_run(spec)
    events = read_ledger(result.run_dir / "ledger")
    kinds = events["kind"].to_pylist()
    submitted = set(events.filter(pc.equal(events["kind"], str(Kind.SUBMIT)))["op"].to_pylist())
    ops = [f"{spec.variant}-s0-op{n:05d}" for n in range(MESSAGES)]
    # The driver records a SUBMIT before each operation goes out; DTM's service records one once
    # its debit commits (the snapshot adds a debit committed under the crash).
    assert (set(ops) if transport != "http" else {ops[1]}) <= submitted
    assert str(Kind.CRASH) in kinds, "the armed crash never fired"
    assert json.loads((result.run_dir / "manifest.json").read_text()).get("complete") is True
    assert result.as_expected, f"{spec.label}: {result.verdict.headline()} (expected {sorted(spec.expect)})"
