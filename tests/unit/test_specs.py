"""Specs reject bad input before any service starts, naming the value and the fix."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import ConfigError, Crash, ScenarioSpec
from harness.run.spec.scenario import Helper, Stage
from harness.stack.base import Endpoints
from harness.worker.crash import CrashArm
from tests.support import KAFKA, make_spec, refused
from tests.unit.fake_endpoints import fake_endpoints


def spec(**kw: object) -> ScenarioSpec:
    return make_spec(**kw)


@pytest.mark.parametrize(
    ("kw", "named", "fix"),
    [
        ({"messages": 0}, "messages=0", "1 to 1,000,000"),
        ({"workers": 40}, "workers=40", "1 to 16"),
        ({"handler": "harness.patterns.onepc.naive"}, "harness.patterns.onepc.naive", "package.module:function"),
        ({"name": "Bad Name"}, "'Bad Name'", "lower-case"),
        ({"crashes": (Crash("after_dinner", op_index=1),)}, "after_dinner", "after_db_commit"),
        ({"crashes": (Crash("after_db_commit", op_index=20),)}, "op_index=20", "from 0 to 19"),
        ({"crashes": (Crash("after_db_commit"),)}, "names no message", "op_index"),
        ({"expect": frozenset({"dupe"})}, "dupe", "duplicate-effect"),
        ({"timeout_s": 0}, "timeout_s=0", "> 0"),
        ({"crashes": (Crash("after_db_commit", op_index=1, action="explode"),)}, "explode", "abort_unsubscribe"),
        ({"crashes": (Crash("relay_after_send", op_index=1),)}, "relay_after_send", "after_db_commit"),
        ({"poison": frozenset({3, 25})}, "[25]", "from 0 to 19"),
        ({"chain": (Stage("worker", "m:f"),)}, "repeat", "its own name"),
        # Issue 12 finding 8: each was accepted, or failed with a raw TypeError, until a run began.
        ({"timeout_s": float("nan")}, "timeout_s=nan", "number of seconds"),
        ({"timeout_s": float("inf")}, "timeout_s=inf", "number of seconds"),
        ({"settle_s": float("nan")}, "settle_s=nan", "number of seconds"),
        ({"settle_s": -1}, "settle_s=-1", ">= 0"),
        ({"messages": "20"}, "messages='20'", "as an int"),
        ({"messages": 20.0}, "messages=20.0", "as an int"),
        ({"workers": True}, "workers=True", "as an int"),
        ({"workers": 1.5}, "workers=1.5", "as an int"),
        ({"seed": "7"}, "seed='7'", "as an int"),
        ({"effect_table": 'orders"; DROP TABLE x; --'}, "DROP TABLE", "plain SQL identifier"),
        ({"effect_column": "op id"}, "'op id'", "plain SQL identifier"),
        ({"options": ["batch", 5]}, "['batch', 5]", "{'name': value}"),
        ({"crashes": Crash("after_db_commit", op_index=1)}, "crashes=Crash(", "crashes=(Crash("),
        ({"expect": "duplicate-effect"}, "expect='duplicate-effect'", 'expect=("duplicate-effect",)'),
        ({"handler": "orders.handlers:"}, "'orders.handlers:'", "package.module:function"),
        ({"handler": "orders handlers:naive"}, "'orders handlers:naive'", "package.module:function"),
    ],
)
def test_bad_spec_names_value_and_fix(kw: dict[str, object], named: str, fix: str) -> None:
    refused(lambda: spec(**kw), named, "Hint:", fix)


def test_good_spec_is_frozen() -> None:
    s = spec(crashes=(Crash("after_db_commit", op_index=3),))
    with pytest.raises(AttributeError):
        s.messages = 5  # type: ignore[misc]
    assert s.label == "onepc:naive"


def test_crash_arm_validates_nth() -> None:
    with pytest.raises(ConfigError, match="nth=0"):
        CrashArm(id="a", point="after_db_commit", nth=0)


def test_pattern_points_are_accepted_once_declared() -> None:
    declared = spec(points=("relay_after_send",), crashes=(Crash("relay_after_send", op_index=1, worker="relay"),))
    assert declared.crashes[0].worker == "relay"


def test_bad_helper_is_refused_where_it_is_made() -> None:
    with pytest.raises(ConfigError, match="no-colon") as info:
        Helper("relay", "no-colon")
    assert "package.module:function" in str(info.value)


def test_fault_windows_are_checked_before_any_service_starts() -> None:
    from harness import Latency
    from harness.run.spec.scenario import FaultWindow

    with pytest.raises(ConfigError, match="'activemq'") as info:
        FaultWindow(Latency(100), target="activemq")
    assert "activemq_stomp" in str(info.value)
    with pytest.raises(ConfigError, match="after_ops=30"):
        spec(messages=20, faults=(FaultWindow(Latency(100), after_ops=30, target="postgres"),))
    with pytest.raises(ConfigError, match="not a fault spec"):
        FaultWindow("latency", target="postgres")


@pytest.mark.parametrize(
    ("make", "named", "fix"),
    [
        (lambda: Crash("after_db_commit", nth=0), "nth=0", "counts from 1"),
        (lambda: Crash("after_db_commit", nth=-2), "nth=-2", "counts from 1"),
        (lambda: Crash("after_db_commit", nth=1.0), "nth=1.0", "as an int"),
        (lambda: Crash("after_db_commit", op_index=-1), "op_index=-1", "from 0"),
        (lambda: Crash("after_db_commit", op_index="3"), "op_index='3'", "as an int"),
        (lambda: Crash("", op_index=1), "''", "after_db_commit"),
        (lambda: Stage("ship", "m:f", workers=True), "workers=True", "as an int"),
        (lambda: Stage("ship", "m:f", workers=0), "workers=0", "from 1 to 16"),
        (lambda: Stage("ship", "m:f", options=None), "options None", "{'name': value}"),
        (lambda: Helper("relay", "m:f", port=1), "port=1", "port=True"),
    ],
)
def test_parts_refuse_bad_values_where_they_are_made(make: Callable[[], object], named: str, fix: str) -> None:
    # Crash(nth=0) used to be caught only when the run armed it, after its workers had started.
    refused(make, named, fix)


@pytest.mark.parametrize(
    ("kw", "named", "fix"),
    [
        ({"hold_s": float("nan")}, "hold_s=nan", "number of seconds"),
        ({"hold_s": 0}, "hold_s=0", "> 0"),
        ({"after_ops": "3"}, "after_ops='3'", "as an int"),
        ({"after_ops": -1}, "after_ops=-1", "from 0"),
    ],
)
def test_fault_window_refuses_bad_numbers(kw: dict[str, object], named: str, fix: str) -> None:
    from harness import Latency
    from harness.run.spec.scenario import FaultWindow

    refused(lambda: FaultWindow(Latency(100), target="postgres", **kw), named, fix)  # type: ignore[arg-type]


def test_lists_become_tuples_so_a_frozen_spec_stays_frozen() -> None:
    s = spec(crashes=[Crash("after_db_commit", op_index=3)], expect={"duplicate-effect"})
    assert s.crashes == (Crash("after_db_commit", op_index=3),)
    assert s.expect == frozenset({"duplicate-effect"})


def _endpoints() -> Endpoints:
    return fake_endpoints()


def test_every_spec_names_a_registered_flow_and_an_unknown_one_lists_them() -> None:
    from harness.run.spec.flow import flows

    assert spec().flow.name == "activemq"
    refused(lambda: spec(flow="rabbitmq"), *(repr(flow.name) for flow in flows()))


def test_flow_takes_a_registered_flow_or_its_name_and_broker_is_its_deprecated_alias() -> None:
    from harness.run.spec.flow import flow_named

    kafka = {k: v for k, v in KAFKA.items() if k != "flow"}
    assert spec(flow="kafka", **kafka).flow is flow_named("kafka")
    assert spec(flow=flow_named("kafka"), **kafka).flow is flow_named("kafka")
    assert spec(flow="kafka", **kafka).flow.transport == "kafka"
    assert spec().flow is flow_named("activemq")  # the default is the registered Flow, not a copy
    with pytest.deprecated_call(match="write flow='kafka'"):
        assert spec(broker="kafka", **kafka).flow is flow_named("kafka")
    refused(lambda: spec(flow="kafka", broker="kafka", **kafka), "names its flow twice", "drop broker=")
    # Even the default flow, given as a Flow, is a flow given.
    refused(lambda: spec(flow=flow_named("activemq"), broker="kafka"), "names its flow twice")
    refused(lambda: spec(flow="rabbitmq"), "unknown flow 'rabbitmq'", "'activemq' or 'kafka'")


@pytest.mark.parametrize("flow", ["activemq", "kafka"])
def test_the_manifest_records_the_specs_flow_by_name(tmp_path: Path, flow: str) -> None:
    import json

    from harness.run.core.folder import RunFolder

    made = spec() if flow == "activemq" else make_spec(KAFKA)
    folder = RunFolder.create(made.name, made.variant, made.seed, root=tmp_path)
    folder.start(made, _endpoints())
    recorded = json.loads((folder.path / "manifest.json").read_text())["spec"]
    # The key manifests had before flow= keeps its meaning, for readers of older runs.
    assert recorded["flow"] == recorded["broker"] == flow
    assert recorded["contract"]["expects_downstream"] is True


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"slow_commits": "3"}, "slow_commits='3'"),
        ({"slow_commits": [1.5]}, "slow_commits=[1.5]"),
        ({"hold_s": "long"}, "hold_s='long'"),
    ],
)
def test_dtm_options_are_refused_when_the_spec_is_made(options: dict[str, object], named: str) -> None:
    # They used to be read only once the run had started its service and branch.
    refused(
        lambda: spec(flow="dtm", handler="harness.patterns.dtm_transfer:service", options=options),
        named,
        "slow_commits as a list",
    )


@pytest.mark.parametrize(
    ("scenario", "module", "topology", "workload", "quiescence"),
    [
        ("onepc_crash_gap", "harness.run.flows.activemq", "Queues", "Messages", "AllOut"),
        ("kafka_consumer", "harness.run.flows.kafka", "Topics", "Messages", "AllOut"),
        ("kafka_saga", "harness.run.flows.saga", "SagaTopics", "SagaStarts", "UntilDone"),
        ("kafka_cqrs", "harness.run.flows.cqrs", "Topics", "EntityEvents", "AllOut"),
        ("dtm_transfer", "harness.run.flows.dtm", "DtmService", "Transfers", "UntilDone"),
    ],
)
def test_each_flow_registers_its_parts_in_its_own_module(
    scenario: str, module: str, topology: str, workload: str, quiescence: str, tmp_path: Path
) -> None:
    from harness.run.core.session import RunSession
    from harness.run.spec.files import resolve

    first = resolve(scenario, 0)[0]
    assert importlib.import_module(module).FLOW is first.flow
    # One session class for every flow: the parts it is built with are the flow's.
    run = RunSession(first, fake_endpoints(dtm=True), runs_root=tmp_path)
    parts = (type(run.topology).__name__, type(run.workload).__name__, type(run.quiescence).__name__)
    assert parts == (topology, workload, quiescence)
    run.topology.release()


def test_no_flow_subclasses_the_session() -> None:
    from harness.run.core.session import RunSession

    assert RunSession.__subclasses__() == []


def test_a_session_refuses_a_handler_that_does_not_import_before_it_makes_a_folder(tmp_path: Path) -> None:
    from harness.run.core.session import RunSession

    bad = spec(handler="harness.patterns.onepc:naiv")
    refused(lambda: RunSession(bad, _endpoints(), runs_root=tmp_path), "naiv")
    assert list(tmp_path.iterdir()) == []
