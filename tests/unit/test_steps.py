"""Steps as data: each kind round-trips through its record, a bad record or value is refused by name."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.faults import KillBroker, Latency, Partition, ResetPeer
from harness.run.core.folder import EAGER_STEPS, STEPS, RunFolder
from harness.run.core.plan import plan
from harness.run.core.replay import load_steps
from harness.run.spec.scenario import Crash, FaultWindow, ScenarioSpec
from harness.run.spec.steps import (
    VOCABULARY,
    Arm,
    Freeze,
    Heal,
    Hold,
    Idle,
    Kill,
    Open,
    Start,
    Step,
    Submit,
    Thaw,
    Wait,
    describe,
    from_record,
    to_record,
)
from tests.support import refused

EVERY_KIND = [
    Start(),
    Submit(3),
    Submit(1, poison=True),
    Submit(1, extra=(("refuse", True), ("hold_s", 2.5))),
    Arm(Crash("after_db_commit"), at=2),
    Arm(Crash("pg_after_commit", nth=3, action="freeze")),
    Arm(Crash("after_db_commit", worker="payment"), op="naive-s1-op00002.pay"),
    Open(Latency(150, jitter_ms=10), "postgres"),
    Open(Partition(), "kafka"),
    Hold(ResetPeer(), "activemq_stomp", 0.5),
    Hold(KillBroker("activemq"), hold_s=0.0),
    Wait(1.5),
    Heal(),
    Kill(1),
    Freeze(1),
    Thaw(),
    Idle(),
]


def test_the_vocabulary_is_every_kind() -> None:
    assert {type(s) for s in EVERY_KIND} == set(VOCABULARY.values())


@pytest.mark.parametrize("step", EVERY_KIND, ids=lambda s: describe(s))
def test_each_step_round_trips_through_json(step: object) -> None:
    record = json.loads(json.dumps(to_record(step)))  # type: ignore[arg-type]
    assert from_record(record) == step
    assert record["step"] in VOCABULARY


def test_a_step_reads_as_a_line_for_people() -> None:
    assert describe(Arm(Crash("after_db_commit"), at=2)) == "arm kill at after_db_commit on op #2"
    assert describe(Arm(Crash("pg_after_commit", nth=3, action="freeze"))) == "arm freeze at pg_after_commit on hit #3"
    assert describe(Submit(2, extra=(("refuse", True),))) == "submit 2, refuse=True"
    assert describe(Thaw()) == "thaw"


def test_bad_steps_are_refused_naming_the_value_and_the_fix() -> None:
    refused(lambda: Submit(0), "submit count", "0")
    refused(lambda: Arm("after_db_commit"), "is not a Crash", "Arm(Crash(")  # type: ignore[arg-type]
    refused(lambda: Arm(Crash("x"), at=1, op="a-op1"), "at=1", "op=")
    refused(lambda: Open(Latency(10), "nowhere"), "'nowhere'", "activemq_stomp")
    refused(lambda: Open("latency", "postgres"), "not a fault spec", "Latency(")
    refused(lambda: Hold(Latency(10), "postgres", -1), "hold_s")
    refused(lambda: Wait(-1), "wait seconds")
    refused(lambda: from_record({"step": "dance"}), "dance", "to_record")
    refused(lambda: from_record({"step": "submit", "cont": 2}), "cont", "to_record")
    refused(lambda: from_record({"step": "open", "fault": {"kind": "Meteor"}}), "Meteor", "harness.faults")


def test_a_folder_records_steps_in_order_and_load_steps_reads_them_back(tmp_path: Path) -> None:
    folder = RunFolder.create("m", "v", 0, tmp_path)
    for step in EVERY_KIND:
        folder.record(step)
    assert load_steps(folder.path) == EVERY_KIND


def test_a_long_runs_step_texts_do_not_rewrite_the_manifest_each_time_and_all_reach_it(tmp_path: Path) -> None:
    folder = RunFolder.create("m", "v", 0, tmp_path)
    folder.manifest = {"steps": []}
    saves = 0
    save = folder.save

    def counted() -> None:
        nonlocal saves
        saves += 1
        save()

    folder.save = counted  # type: ignore[method-assign]
    on_disk = lambda: json.loads((folder.path / "manifest.json").read_text())["steps"]  # noqa: E731
    folder.step("first")
    assert on_disk() == ["first"]  # a short run's steps are on disk as they happen
    for n in range(1, 5_000):
        folder.step(f"submit {n}")
    # One save per step would be 5,000 rewrites of a manifest growing to 5,000 lines.
    assert EAGER_STEPS <= saves <= EAGER_STEPS + 50, saves
    folder.close_books()
    assert len(on_disk()) == 5_000


def test_load_steps_refuses_a_folder_without_steps_and_a_damaged_line(tmp_path: Path) -> None:
    refused(lambda: load_steps(tmp_path), str(tmp_path), STEPS)
    (tmp_path / STEPS).write_text('{"step": "start"}\n{"step": "sub\n')
    refused(lambda: load_steps(tmp_path), f"{STEPS}:2", "damaged")


def test_the_spec_of_a_folder_is_its_scenarios_variant_at_its_seed_with_its_timing(tmp_path: Path) -> None:
    from harness.run.core.replay import spec_of_folder

    manifest = {
        "scenario": "onepc_crash_gap",
        "variant": "naive",
        "seed": 7,
        "spec": {"settle_s": 0.2, "timeout_s": 20},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    spec = spec_of_folder(tmp_path)
    assert (spec.label, spec.seed, spec.settle_s, spec.timeout_s) == ("onepc_crash_gap:naive", 7, 0.2, 20)
    refused(lambda: spec_of_folder(tmp_path / "nowhere"), "manifest.json", "run folder")


def test_txchaos_replay_refuses_a_folder_without_steps_before_any_service_starts(tmp_path: Path) -> None:
    from harness.cli import main

    assert main(["replay", str(tmp_path)]) == 2


PLAN_SPEC = ScenarioSpec(name="synth", variant="v", handler="mod:func", schema="s", effect_table="t")


def _planned(
    spec: ScenarioSpec, *, late: bool = False, alone: frozenset[int] = frozenset(), via: frozenset[str] | None = None
) -> list[Step]:
    """The steps ``plan`` yields for ``spec``, each Submit counted as sent before the next is drawn."""
    steps: list[Step] = []

    def sent() -> int:
        return sum(s.count for s in steps if isinstance(s, Submit))

    kwargs = {} if via is None else {"submits_via": via}
    for step in plan(spec, late=late, alone=set(alone), submitted=sent, **kwargs):
        steps.append(step)
    return steps


def test_a_spec_plans_as_start_arm_submit_up_to_each_window_hold_it_then_the_rest() -> None:
    crash = Crash("after_db_commit", op_index=2)
    window = FaultWindow(ResetPeer(), after_ops=3, hold_s=0.5, target="postgres")
    spec = replace(PLAN_SPEC, messages=8, crashes=(crash,), faults=(window,))
    hold = Hold(ResetPeer(), "postgres", 0.5)
    assert _planned(spec) == [Start(), Arm(crash), Submit(3), hold, Submit(5)]
    # A flow that submits operation 5 alone: idle before and after it.
    assert _planned(spec, alone=frozenset({5})) == [
        Start(),
        Arm(crash),
        Submit(3),
        hold,
        Submit(2),
        Idle(),
        Submit(1),
        Idle(),
        Submit(2),
    ]
    # Workers that join late get the first window's backlog before they start.
    assert _planned(spec, late=True) == [Arm(crash), Submit(3), Start(), hold, Submit(5)]


def test_a_window_that_only_slows_carries_the_submissions_up_to_the_next_window() -> None:
    """Operations are in flight under a slow network however fast the flow drained the ones before;
    a window that cuts still holds the submissions until it is healed."""
    slow = FaultWindow(Latency(100), after_ops=2, hold_s=0.5, target="activemq_stomp")
    cut = FaultWindow(ResetPeer(), after_ops=6, hold_s=0.3, target="postgres")
    spec = replace(PLAN_SPEC, messages=9, faults=(cut, slow))
    opened = [Open(Latency(100), "activemq_stomp"), Submit(4), Wait(0.5), Heal()]
    assert _planned(spec) == [Start(), Submit(2), *opened, Hold(ResetPeer(), "postgres", 0.3), Submit(3)]
    last = replace(PLAN_SPEC, messages=5, faults=(slow,))
    assert _planned(last) == [Start(), Submit(2), Open(Latency(100), "activemq_stomp"), Submit(3), Wait(0.5), Heal()]


def test_a_window_that_cuts_a_proxy_the_submissions_do_not_pass_carries_them_too() -> None:
    stomp = frozenset({"activemq_stomp"})
    for fault, target in ((ResetPeer(), "postgres"), (Partition(), "postgres")):
        spec = replace(PLAN_SPEC, messages=4, faults=(FaultWindow(fault, after_ops=1, hold_s=0.5, target=target),))
        assert _planned(spec, via=stomp) == [Start(), Submit(1), Open(fault, target), Submit(3), Wait(0.5), Heal()]
    # The submissions' own proxy cut, or the broker killed: they wait until it is healed.
    dtm = frozenset({"dtm", "postgres"})  # a DTM transfer asks both at once
    for fault, target in ((ResetPeer(), "activemq_stomp"), (KillBroker("activemq"), None), (ResetPeer(), "postgres")):
        via = dtm if target == "postgres" else stomp
        spec = replace(PLAN_SPEC, messages=4, faults=(FaultWindow(fault, after_ops=1, hold_s=0.5, target=target),))
        assert _planned(spec, via=via) == [Start(), Submit(1), Hold(fault, target, 0.5), Submit(3)]
