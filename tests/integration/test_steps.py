"""Steps as data on the real stack: a run records the steps it applied, and they replay to the same verdict.

A counterexample is its steps: the run folder's ``steps.jsonl`` is what ``replay`` runs again on a
fresh run of the same spec, no Hypothesis in the loop. Faults a step opens are the run's: healed by
a ``Heal`` in reverse order, or by ``close`` before quiescence at the latest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import Crash, FaultWindow, RunSession
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.faults import Latency, Partition
from harness.ledger.reader import read_ledger
from harness.run.core.replay import load_steps, replay
from harness.run.core.session import run_scenario
from harness.run.spec.steps import Arm, Heal, Kill, Open, Start, Submit, Wait
from harness.stack.base import Endpoints
from tests.support import make_spec

pytestmark = [pytest.mark.integration, pytest.mark.activemq]


def test_a_run_records_its_steps_and_they_replay_to_the_same_verdict(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    spec = make_spec(
        messages=5,
        crashes=(Crash("after_db_commit", op_index=2),),
        faults=(FaultWindow(Latency(30), after_ops=3, hold_s=0.3, target="postgres"),),
        expect=frozenset({"duplicate-effect"}),
    )
    first = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    steps = load_steps(first.run_dir)
    assert steps == [
        Start(),
        Arm(Crash("after_db_commit", op_index=2)),
        Submit(3),
        Open(Latency(30), "postgres"),  # a slow network carries the rest of the submissions
        Submit(2),
        Wait(0.3),
        Heal(),
    ]
    again = replay(spec, txchaos_stack, steps, runs_root=tmp_path)
    assert again.run_dir != first.run_dir
    assert first.verdict.found() == again.verdict.found() == {"duplicate-effect": 1}
    assert first.verdict.ops("duplicate-effect") == again.verdict.ops("duplicate-effect") == {"naive-s0-op00002"}
    assert load_steps(again.run_dir) == steps


def test_faults_opened_by_steps_heal_in_reverse_by_heal_and_by_close(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    admin = ToxiproxyAdmin(txchaos_stack.toxiproxy_api)
    with RunSession(make_spec(messages=2), txchaos_stack, runs_root=tmp_path) as run:
        run.apply(Open(Latency(20), "postgres"))
        run.apply(Open(Latency(10), "activemq_stomp"))
        assert admin.toxics("postgres")
        assert admin.toxics("activemq_stomp")
        run.apply(Heal())
        assert not admin.toxics("postgres")
        assert not admin.toxics("activemq_stomp")
        run.apply(Open(Latency(20), "postgres"))  # left open: close heals it before quiescence
        run.apply(Submit(2))
        result = run.close()
    assert not admin.toxics("postgres")
    assert result.verdict.anomaly_free
    # The first two were open while nothing was in flight: the verdict says so, the third fired.
    assert [f["fired"] for f in result.verdict.faults] == [False, False, True]
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    order = [(e["kind"], e["point"]) for e in events if e["kind"] in ("fault_start", "fault_end")]
    assert [k for k, _ in order] == ["fault_start", "fault_start", "fault_end", "fault_end", "fault_start", "fault_end"]
    # Healed in reverse: the last opened is the first healed.
    assert order[2][1] == order[1][1]
    assert order[3][1] == order[0][1]


def test_the_harness_reads_the_database_past_the_faults_it_opens(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    """The session's own reads (a machine's invariant after each step, the books) skip the Postgres
    proxy: a partition opened for the flow neither fails nor blocks them. Through the proxy, every
    invariant read paid three round trips of the latency a machine opened, and a cut refused it."""
    with RunSession(make_spec(messages=2), txchaos_stack, runs_root=tmp_path) as run:
        run.apply(Submit(2))
        run.apply(Open(Partition(), "postgres"))
        assert run.duplicate_effects() == []
        run.apply(Heal())
        result = run.close()
    assert result.verdict.found() == {}


def test_a_kill_step_kills_a_worker_wherever_it_is_and_it_restarts(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    spec = make_spec(variant="check-then-skip", handler="harness.patterns.onepc:check_then_skip", messages=6)
    with RunSession(spec, txchaos_stack, runs_root=tmp_path) as run:
        for step in (Submit(3), Kill(0), Submit(3)):
            run.apply(step)
        result = run.close()
    events = read_ledger(result.run_dir / "ledger").to_pylist()
    who = [(e["kind"], json.loads(e["detail"])["worker"]) for e in events if e["kind"] in ("crash", "worker_exit")]
    assert who == [("crash", "worker-0"), ("worker_exit", "worker-0")]
    assert result.verdict.anomaly_free  # the fix holds under a kill at any moment
    assert load_steps(result.run_dir)[-2:] == [Kill(0), Submit(3)]


def test_txchaos_replay_runs_a_folders_steps_again(
    txchaos_stack: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.cli import main
    from harness.run.spec.files import resolve

    (spec,) = resolve("onepc_crash_gap:naive", 0)
    first = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(txchaos_stack.to_json())
    monkeypatch.setenv("TXCHAOS_ENDPOINTS", str(endpoints))
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path / "reports"))
    assert main(["replay", str(first.run_dir)]) == first.verdict.exit_code == 1
    (again,) = (tmp_path / "reports" / "runs").iterdir()
    assert load_steps(again) == load_steps(first.run_dir)
    assert json.loads((again / "verdict.json").read_text())["anomalies"] == first.verdict.anomalies
