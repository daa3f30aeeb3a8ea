"""A team's service under test as a spec (issue 16): every bad value is refused before anything starts,
naming the value and the fix; what the service is told is filled from the stack and its trap relays."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ConfigError, Crash, RunSession, ScenarioSpec, Service
from harness.run.processes.service_build import build_dir, ensure_built, source_hash
from tests.support import make_spec, refused
from tests.unit.fake_endpoints import fake_endpoints

STOMP_ENV = {"DATABASE_URL": "{postgres_url}", "STOMP_HOST": "{stomp_host}", "STOMP_PORT": "{stomp_port}"}


def svc(**kw: object) -> Service:
    base: dict[str, object] = {"command": ("{python}", "-c", "print('READY')"), "env": STOMP_ENV}
    base.update(kw)
    return Service("orders", **base)  # type: ignore[arg-type]


def scenario(service: Service, **kw: object) -> ScenarioSpec:
    return ScenarioSpec.for_service(service, variant="naive", schema="onepc", effect_table="onepc_effects", **kw)


@pytest.mark.parametrize(
    ("kw", "named", "fix"),
    [
        ({"env": {"DB": "{postgres_uri}"}}, "unknown placeholder {postgres_uri}", "{postgres_url}"),
        ({"command": ("{pyhton}",)}, "unknown placeholder {pyhton}", "{python}"),
        ({"body": '{{"op": "{opid}"}}'}, "unknown placeholder {opid}", "{op}"),
        ({"body": '{"op": "{op}"}'}, """has {"op"}, which is not a placeholder""", "'{{'"),
        ({"transport": "rabbitmq"}, "transport 'rabbitmq'", "transport='kafka'"),
        ({"ready": "READY("}, "is not a regular expression", "ready='READY'"),
        ({"instances": 0}, "instances=0 is out of range", "from 1"),
        ({"command": ()}, "has no command", "command="),
        ({"command": "java -jar svc.jar"}, "is not a list of arguments", 'command=("program"'),
        ({"build": ("make",)}, "has a build but no source", "source="),
        ({"source": "/no/such/folder"}, "is not a folder", "source folder"),
        ({"image": "Orders Service"}, "is not an image reference", "docker build -t"),
        ({"queues": "{input}.ship"}, "is not a list of queue names", "queues=('{input}.ship',)"),
        ({"queues": ("orders.ship",)}, "does not name {input}", "each run has its own queues"),
        ({"queues": ("{input}.{group}",)}, "unknown placeholder {group}", "{input}"),
        ({"queues": ("{input}.ship",), "transport": "kafka"}, "on transport 'kafka'", "transport='activemq'"),
    ],
)
def test_a_bad_service_value_is_refused_naming_it_and_the_fix(kw: dict[str, object], named: str, fix: str) -> None:
    with pytest.raises(ConfigError) as err:
        svc(**kw)
    assert named in str(err.value)
    assert err.value.hint is not None
    assert fix in err.value.hint


def test_a_trap_point_the_service_cannot_reach_is_refused_with_the_points_it_can() -> None:
    # A STOMP and Postgres service has no Kafka connection: an offset-commit trap could never fire.
    with pytest.raises(ConfigError) as err:
        scenario(svc(), crashes=(Crash("kafka_before_offset_commit", op_index=1),))
    assert "'kafka_before_offset_commit' is not on a connection of service orders (it speaks postgres, stomp)" in str(
        err.value
    )
    assert err.value.hint is not None
    assert "pg_after_commit" in err.value.hint
    assert "stomp_before_ack" in err.value.hint
    with pytest.raises(ConfigError, match="has relays=False but"):
        scenario(svc(relays=False), crashes=(Crash("pg_after_commit", op_index=1),))
    with pytest.raises(ConfigError, match="unknown crash action 'pause'"):
        scenario(svc(), crashes=(Crash("pg_after_commit", op_index=1, action="pause"),))
    with pytest.raises(ConfigError, match="unknown crash point 'after_db_commit'"):
        scenario(svc(), crashes=(Crash("after_db_commit", op_index=1),))  # a txchaos worker's point, not a trap


def test_the_protocols_and_points_come_from_the_placeholders_the_service_uses() -> None:
    kafka = svc(env={"B": "{kafka_bootstrap}", "G": "{group}"}, transport="kafka")
    assert kafka.protocols() == {"kafka"}
    assert set(kafka.points()) == {"kafka_before_offset_commit", "kafka_before_end_txn", "kafka_after_produce"}
    spec = scenario(svc(), crashes=(Crash("pg_after_commit", op_index=1, action="freeze"),))
    assert spec.flow.name == "service_activemq"
    assert spec.handler == ""


def test_an_image_needs_no_command_and_passes_its_environment_by_name_only() -> None:
    from harness.stack.containers import run_argv

    image = svc(command=(), image="orders:1.2")
    assert image.command == ()
    argv = run_argv("orders:1.2", ("--variant", "naive"), image.env, name="c1", run_id="r1")
    assert argv[:4] == ("docker", "run", "--rm", "--network=host")
    assert "--env=DATABASE_URL" in argv  # the value (a password) stays out of the process list
    assert argv[-3:] == ("orders:1.2", "--variant", "naive")


def test_a_service_scenario_cannot_be_built_by_hand_with_a_handler() -> None:
    by_hand = {"handler": "orders.handlers:naive", "flow": "service_activemq", "service": svc()}
    refused(lambda: make_spec(**by_hand), "ScenarioSpec.for_service")


def test_a_command_that_is_not_there_is_refused_before_the_run_exists(tmp_path: Path) -> None:
    spec = scenario(svc(command=("orders-service-not-installed", "--port", "1")))
    with pytest.raises(ConfigError) as err:
        RunSession(spec, fake_endpoints(), runs_root=tmp_path / "runs")  # no stack answers: none is needed
    assert "command 'orders-service-not-installed' is not found" in str(err.value)
    assert not (tmp_path / "runs").exists()  # no run folder was made


def test_a_failed_build_says_what_failed_with_its_log_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "svc"
    source.mkdir()
    (source / "main.go").write_text("package main\n")
    service = svc(source=source, build=("bash", "-c", "echo 'main.go:1: undefined: kgo'; exit 3"))
    with pytest.raises(ConfigError) as err:
        RunSession(scenario(service), fake_endpoints(), runs_root=tmp_path / "runs")
    assert "building service orders failed (exit 3)" in str(err.value)
    assert "undefined: kgo" in str(err.value)
    services = tmp_path / "cache" / "services"
    assert [p.name.endswith(".build.log") for p in services.iterdir()] == [True]  # the log, no half-built folder


def test_a_build_runs_once_per_version_of_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "svc"
    (source / "node_modules").mkdir(parents=True)
    (source / "service.py").write_text("print('READY')\n")
    count = tmp_path / "builds"
    build = ("bash", "-c", f"echo x >> {count}; cp service.py {{build}}/", "build")
    service = svc(source=source, build=build, command=("{python}", "{build}/service.py"))
    first = ensure_built(service)
    assert first is not None
    assert (first / "service.py").exists()
    (source / "node_modules" / "dep.js").write_text("x")  # dependency folders do not change the version
    assert ensure_built(service) == first
    assert count.read_text() == "x\n"
    before = source_hash(source)
    (source / "service.py").write_text("print('READY', flush=True)\n")
    assert source_hash(source) != before
    assert build_dir(service) != first
    assert ensure_built(service) != first
    assert count.read_text() == "x\nx\n"


def test_a_service_run_reads_the_inner_queues_it_declares(tmp_path: Path) -> None:
    # Their residue and dead letters are the run's evidence: an operation waiting (or dead-lettered)
    # between the service's own stages is stuck (dead-lettered), not lost.
    spec = scenario(svc(queues=["{input}.ship", "{input}.pack"]))
    assert spec.service is not None
    assert spec.service.queues == ("{input}.ship", "{input}.pack")
    run = RunSession(spec, fake_endpoints(), runs_root=tmp_path)
    queues = run.topology.stage_queues  # type: ignore[attr-defined]
    assert queues == [queues[0], f"{queues[0]}.ship", f"{queues[0]}.pack"]


def test_an_output_names_its_operation_where_the_service_says() -> None:
    from harness.run.transports.sink import json_path

    assert json_path('{"order": {"id": "op-7"}, "op": "x"}', ("order", "id")) == "op-7"
    assert json_path(b'{"order": {"id": 12}}', ("order", "id")) == "12"
    assert json_path('{"order": {}}', ("order", "id")) is None
    assert json_path("not json", ("order", "id")) is None
    assert json_path('{"order": {"id": {"a": 1}}}', ("order", "id")) is None  # an object names no op
    assert svc(output_op="order.id").output_op == "order.id"
    with pytest.raises(ConfigError, match="is not a dotted path"):
        svc(output_op="order..id")
