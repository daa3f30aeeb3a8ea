"""The saga's options, step ids and state transitions, validated without services."""

from __future__ import annotations

import pytest

from harness import Crash, ScenarioSpec
from harness.errors import ConfigError
from harness.patterns.kafka_saga import TRANSITIONS, is_final
from harness.patterns.saga_options import FINAL_STATES, STEPS, SagaOptions, step_op


def _spec(**kw: object) -> ScenarioSpec:
    base: dict[str, object] = {
        "name": "kafka_saga",
        "variant": "t",
        "flow": "kafka_saga",
        "handler": "harness.patterns.kafka_saga:orchestrator",
        "schema": "kafka_saga",
        "effect_table": "saga_payments",
    }
    return ScenarioSpec(**(base | kw))  # type: ignore[arg-type]


def test_options_default_to_the_fixed_saga() -> None:
    opts = SagaOptions.from_options({"batch_size": 1, "refuse_seat": [2]})
    assert (opts.participant, opts.reply, opts.dlt_replies, opts.commit) == (
        "inbox",
        "transaction",
        True,
        "transaction",
    )
    assert opts.refuse_seat == (2,)


@pytest.mark.parametrize(
    "bad", [{"participant": "careful"}, {"reply": "later"}, {"dlt_replies": "yes"}, {"resend": 1}, {"flaky_seat": [-1]}]
)
def test_bad_options_are_refused_with_a_hint(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        SagaOptions.from_options(bad)
    assert info.value.hint


def test_a_saga_crash_must_name_its_process() -> None:
    with pytest.raises(ConfigError, match="names process"):
        _spec(crashes=(Crash("after_db_commit", op_index=1),))
    assert _spec(crashes=(Crash("after_db_commit", op_index=1, worker="payment"),)).flow.name == "kafka_saga"


def test_every_step_has_an_operation_id_and_a_participant() -> None:
    assert step_op("s-op00001", "pay") == "s-op00001.pay"
    assert set(STEPS) == {step for _, step, _ in TRANSITIONS}


def test_every_transition_path_ends_in_a_final_state() -> None:
    # From 'paying', following any reply, the saga reaches a final state (no cycle, no dead end).
    def ends(state: str, seen: frozenset[str]) -> bool:
        if is_final(state):
            return True
        moves = [nxt for (st, _, _), (nxt, _) in TRANSITIONS.items() if st == state]
        return bool(moves) and all(nxt not in seen and ends(nxt, seen | {nxt}) for nxt in moves)

    assert ends("paying", frozenset({"paying"}))
    assert {nxt for nxt, _ in TRANSITIONS.values() if is_final(nxt)} == set(FINAL_STATES)
