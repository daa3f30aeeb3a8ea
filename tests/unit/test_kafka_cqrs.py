"""The CQRS pattern's event plan and what its scenario expects, without services."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from harness import Crash
from harness.errors import ConfigError
from harness.machines.stage import stage_machine
from harness.machines.targets import TARGETS
from harness.patterns.kafka_cqrs import EntityEvent, entity_event
from tests.support import make_spec, refused


def _scenario() -> ModuleType:
    path = Path(__file__).parents[2] / "scenarios" / "kafka_cqrs_scenario.py"
    spec = importlib.util.spec_from_file_location("kafka_cqrs_scenario", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_entity_is_created_updated_and_deleted_in_order() -> None:
    assert [entity_event(n) for n in range(4)] == [
        EntityEvent("e00000", 1, False),
        EntityEvent("e00000", 2, False),
        EntityEvent("e00000", 3, True),
        EntityEvent("e00001", 1, False),
    ]


def test_naive_expectation_names_the_replayed_events_before_a_delete() -> None:
    scenario = _scenario()
    first, _ = scenario.crashed_op_indexes(0)
    expected = scenario.expected_ops("naive", 0)
    batch = scenario.batch_of(first, scenario.BATCH)
    assert expected["resurrected"], "every batch must hold a delete and an earlier event of its entity"
    assert expected["resurrected"] <= expected["out-of-order"] <= set(batch)
    for n in expected["resurrected"]:
        assert not entity_event(n).tombstone
    assert scenario.expected_ops("versioned", 0) == {}
    assert scenario.variants(0)["versioned"].contract.per_key


def test_a_kafka_cqrs_spec_takes_only_kafka_crash_points() -> None:
    cqrs = {"flow": "kafka_cqrs", "handler": "harness.patterns.kafka_cqrs:naive_replica", "schema": "kafka_cqrs"}
    crash = Crash("after_broker_commit", op_index=0)
    refused(lambda: make_spec(**cqrs, effect_table="cqrs_journal", crashes=(crash,)), "unknown crash point")


@pytest.mark.parametrize("pattern", ["cqrs", "saga"])
def test_the_stage_machine_refuses_a_pattern_with_its_own_machine(pattern: str) -> None:
    # A CQRS spec driven by the ActiveMQ stage machine ran its Kafka replica as STOMP workers and
    # reported every operation dead-lettered: refuse it, naming the machine to use.
    target = TARGETS[pattern]()
    with pytest.raises(ConfigError, match=f"{target.machine.__name__}"):
        stage_machine(target.bad, None)  # type: ignore[arg-type]
