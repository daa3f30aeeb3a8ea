"""The 1PC stage under a Hypothesis state machine: crashes at every stage point, slow networks.

The naive stage must be *caught*: Hypothesis finds a program that ends in duplicate-effect and
shrinks it (a program has at most ``stateful_step_count`` = 5 steps, so the test asserts that the
shrink ran, not a bound on the length). The check-then-skip stage must hold under the same rules.
Run it: ``pytest scenarios/onepc_machine_scenario.py`` (profile: ``TXCHAOS_PROFILE=dev|ci|nightly``).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness import Endpoints, ScenarioSpec
from harness.machines.profiles import profile
from harness.machines.search import find_counterexample
from harness.machines.stage import stage_machine

pytestmark = [pytest.mark.integration, pytest.mark.activemq]


def spec(variant: str, handler: str) -> ScenarioSpec:
    return ScenarioSpec(
        name="onepc_machine",
        variant=variant,
        handler=f"harness.patterns.onepc:{handler}",
        schema="onepc",
        effect_table="onepc_effects",
        options={"table": "onepc_effects"},
    )


def test_naive_stage_is_caught_and_shrunk(txchaos_stack: Endpoints) -> None:
    machine = stage_machine(spec("naive", "naive"), txchaos_stack)
    started = time.monotonic()
    # Search until found: the run stops at the first counterexample, so the bound only caps a miss.
    # About 1 example in 4 reaches the window, so 8 examples miss it ~10% of the time; 60 never do.
    # No example database: the test measures the search itself, as on a fresh CI checkout.
    search = settings(profile(), max_examples=max(60, profile().max_examples), database=None)
    failure = find_counterexample(machine, search)
    assert "duplicate-effect" in failure, failure or f"no counterexample in {machine.examples} examples"
    took = time.monotonic() - started
    steps = machine.last_steps
    found = machine.found_at
    assert found is not None
    print(
        f"naive 1PC: first counterexample at example {found[0]} after {found[1]:.0f}s; shrunk to "
        f"{len(steps)} steps after {machine.examples} examples, {took:.0f}s in all: {steps}"
    )
    # The shrunk program redelivers a message whose effect is committed: a crash or a forced
    # redelivery after the DB commit.
    assert any("'after_db_commit'" in step for step in steps), steps
    # Hypothesis shrank it: examples ran after the first counterexample besides its final replay.
    assert machine.examples > found[0] + 1, f"no shrink after example {found[0]} of {machine.examples}"
    assert "seed:" in failure
    assert "run folder:" in failure


def test_check_then_skip_holds_under_the_same_rules(txchaos_stack: Endpoints) -> None:
    machine = stage_machine(spec("check-then-skip", "check_then_skip"), txchaos_stack)
    run_state_machine_as_test(machine, settings=profile())
    assert machine.examples >= profile().max_examples
    assert machine.last_result is not None
    # no anomaly on the last example; an arm it never reached is counted, not a failure
    assert machine.last_result.verdict.anomaly_free, machine.last_result.verdict.headline()
    summary = machine.fired_summary()
    print(f"check-then-skip 1PC held: {summary}")
    fired, requested = sum(f for f, _ in machine.fired.values()), sum(r for _, r in machine.fired.values())
    assert fired > 0, f"no requested fault ever fired: the fixed variant held against nothing ({summary})"
    assert fired <= requested
