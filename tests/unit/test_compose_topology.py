"""docker-compose.yml and fixtures/toxiproxy/proxies.json build the topology of harness/stack/topology.py.

No services and no Docker daemon: the files are parsed and compared, and the comparison itself is
shown to catch drift on deliberately broken copies.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.errors import ConfigError, StackError
from harness.stack import topology as topo
from harness.stack.docker import (
    COMPOSE_FILE,
    PUBLISHED_HOST,
    DockerProvider,
    compose_endpoints,
    compose_topology_errors,
    docker_available,
    kafka_env_property,
    read_properties,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


@pytest.fixture(scope="module")
def proxies() -> list[dict[str, Any]]:
    return list(json.loads((ROOT / "fixtures" / "toxiproxy" / "proxies.json").read_text()))


@pytest.fixture(scope="module")
def server_properties() -> dict[str, str]:
    return read_properties((ROOT / "fixtures" / "kafka" / "server.properties").read_text())


def test_provider_reads_the_repository_compose_file() -> None:
    assert ROOT / "docker-compose.yml" == COMPOSE_FILE


def test_compose_agrees_with_topology(
    compose: dict[str, Any], proxies: list[dict[str, Any]], server_properties: dict[str, str]
) -> None:
    assert compose_topology_errors(compose, proxies, server_properties) == []


def test_services_and_pinned_versions(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "activemq", "kafka", "toxiproxy", "dtm"}
    assert services["postgres"]["image"] == "postgres:15"
    assert services["activemq"]["image"] == "apache/activemq-classic:6.1.8"
    assert services["kafka"]["image"] == "apache/kafka:4.1.2"
    assert services["toxiproxy"]["image"] == "golang:1.24"
    assert services["dtm"]["image"] == "yedf/dtm:1.19.0"
    install = " ".join(" ".join(services["toxiproxy"]["command"]).split())
    assert "go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0" in install
    for service in services.values():
        assert service["healthcheck"]["test"]


def test_only_toxiproxy_publishes_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("postgres", "activemq", "kafka", "dtm"):
        assert "ports" not in services[name], f"{name} must be reachable only through Toxiproxy"
    published = {str(p) for p in services["toxiproxy"]["ports"]}
    expected = {f"127.0.0.1:{p}:{p}" for p in (8474, *(r.listen_port for r in topo.PROXIES))}
    assert published == expected
    service_ports = {s.port for s in topo.SERVICES if s is not topo.TOXIPROXY}
    assert not {int(p.rsplit(":", 1)[1]) for p in published} & service_ports


def test_proxies_json_equals_topology_routes(proxies: list[dict[str, Any]]) -> None:
    assert [p["name"] for p in proxies] == [r.name for r in topo.PROXIES]
    for entry, route in zip(proxies, topo.PROXIES, strict=True):
        assert entry["listen"] == f"0.0.0.0:{route.listen_port}"
        assert entry["upstream"] == f"{route.service}:{route.port}"
        assert entry["enabled"] is True


def test_kafka_advertises_the_proxy_and_keeps_its_own_ports(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    kafka_proxy = topo.proxy_for("kafka")
    advertised = env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert f"EXTERNAL://{PUBLISHED_HOST}:{kafka_proxy.listen_port}" in advertised
    assert f"INTERNAL://kafka:{topo.KAFKA_INTERNAL_PORT}" in advertised
    listeners = env["KAFKA_LISTENERS"].split(",")
    assert f"EXTERNAL://0.0.0.0:{topo.KAFKA.port}" in listeners
    assert f"INTERNAL://0.0.0.0:{topo.KAFKA_INTERNAL_PORT}" in listeners
    assert f"CONTROLLER://0.0.0.0:{topo.KAFKA_CONTROLLER_PORT}" in listeners
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"


def test_kafka_env_agrees_with_server_properties(compose: dict[str, Any], server_properties: dict[str, str]) -> None:
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == server_properties["process.roles"] == "broker,controller"
    assert env["KAFKA_NODE_ID"] == server_properties["node.id"] == "1"
    assert (
        "./fixtures/kafka/server.properties:/mnt/shared/config/server.properties:ro"
        in (compose["services"]["kafka"]["volumes"])
    )


def test_activemq_mounts_the_shared_broker_config(compose: dict[str, Any]) -> None:
    activemq = compose["services"]["activemq"]
    assert "./fixtures/activemq/activemq.xml:/opt/apache-activemq/conf/activemq.xml:ro" in activemq["volumes"]
    assert f"-Dtxchaos.stomp.port={topo.ACTIVEMQ.port}" in activemq["environment"]["ACTIVEMQ_OPTS"].split()


def test_dtm_runs_the_shared_config_behind_its_proxy(compose: dict[str, Any], proxies: list[dict[str, Any]]) -> None:
    service = compose["services"]["dtm"]
    assert "./fixtures/dtm/dtm.yml:/app/dtm/configs/txchaos.yml:ro" in service["volumes"]
    assert service["command"] == ["-c", "/app/dtm/configs/txchaos.yml"]
    route = topo.proxy_for("dtm")
    assert {"name": "dtm", "listen": f"0.0.0.0:{route.listen_port}", "upstream": "dtm:36789", "enabled": True} in (
        proxies
    )
    assert '"dtm"' in " ".join(compose["services"]["toxiproxy"]["healthcheck"]["test"])


def test_endpoints_are_the_proxy_side(tmp_path: Path) -> None:
    ep = compose_endpoints("txchaos", tmp_path)
    for field, service in (("postgres", "postgres"), ("stomp", "activemq"), ("kafka", "kafka"), ("dtm", "dtm")):
        endpoint = getattr(ep, field)
        route = topo.proxy_for(service)
        assert (endpoint.host, endpoint.port) == (PUBLISHED_HOST, route.listen_port)
        assert endpoint.proxy == route.name
        assert (endpoint.upstream_host, endpoint.upstream_port) == (service, route.port)
    assert ep.toxiproxy_api == "http://127.0.0.1:8474"
    assert ep.dtm_url == f"http://127.0.0.1:{topo.proxy_for('dtm').listen_port}/api/dtmsvr"
    assert (ep.provider, ep.stack_id, ep.db_user) == ("docker", "txchaos", topo.DB_USER)


@pytest.mark.parametrize(
    ("key", "prop"),
    [
        ("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "listener.security.protocol.map"),
        ("KAFKA_NODE_ID", "node.id"),
        ("KAFKA_LOG__DIRS", "log_dirs"),
        ("KAFKA_A___B", "a-b"),
    ],
)
def test_kafka_env_property_names(key: str, prop: str) -> None:
    assert kafka_env_property(key) == prop


# -- the comparison catches drift ---------------------------------------------------------------


def _kafka_env(c: dict[str, Any]) -> dict[str, Any]:
    return dict(c["services"]["kafka"]["environment"])


def _set_kafka_env(key: str, value: str) -> Callable[[dict[str, Any], list[dict[str, Any]]], None]:
    def mutate(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
        c["services"]["kafka"]["environment"][key] = value

    return mutate


def _publish_postgres(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["postgres"]["ports"] = ["127.0.0.1:5432:5432"]


def _wrong_upstream(_c: dict[str, Any], p: list[dict[str, Any]]) -> None:
    p[2]["upstream"] = "kafka:29092"


def _drop_proxy(_c: dict[str, Any], p: list[dict[str, Any]]) -> None:
    del p[1]


def _old_kafka_image(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["kafka"]["image"] = "apache/kafka:3.9.0"


def _old_toxiproxy(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    command = c["services"]["toxiproxy"]["command"]
    c["services"]["toxiproxy"]["command"] = [s.replace("v2.12.0", "v2.11.0") for s in command]


def _other_activemq_xml(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["activemq"]["volumes"] = ["./elsewhere/activemq.xml:/opt/apache-activemq/conf/activemq.xml"]


def _unpublished_proxy(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["toxiproxy"]["ports"] = [p for p in c["services"]["toxiproxy"]["ports"] if "16613" not in p]


def _extra_service(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["zookeeper"] = {"image": "zookeeper:3.9"}


def _host_network(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["kafka"]["network_mode"] = "host"


def _no_healthcheck(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    del c["services"]["activemq"]["healthcheck"]


def _publish_dtm(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["dtm"]["ports"] = ["127.0.0.1:36789:36789"]


def _drop_dtm_proxy(_c: dict[str, Any], p: list[dict[str, Any]]) -> None:
    p[:] = [entry for entry in p if entry["name"] != "dtm"]


def _dtm_upstream_grpc(_c: dict[str, Any], p: list[dict[str, Any]]) -> None:
    next(entry for entry in p if entry["name"] == "dtm")["upstream"] = "dtm:36790"


def _other_dtm_tag(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["dtm"]["image"] = "yedf/dtm:latest"


def _dtm_config_elsewhere(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["dtm"]["volumes"] = ["./elsewhere/dtm.yml:/app/dtm/configs/txchaos.yml:ro"]


def _dtm_default_command(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    del c["services"]["dtm"]["command"]


def _dtm_port_from_env(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    c["services"]["dtm"]["environment"] = {"HTTP_PORT": "8080"}


def _no_dtm_service(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    del c["services"]["dtm"]


def _toxiproxy_health_ignores_dtm(c: dict[str, Any], _p: list[dict[str, Any]]) -> None:
    health = c["services"]["toxiproxy"]["healthcheck"]
    health["test"] = [part.replace("""&& grep -q '"dtm"' /tmp/proxies""", "") for part in health["test"]]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            _set_kafka_env("KAFKA_ADVERTISED_LISTENERS", "EXTERNAL://127.0.0.1:9092,INTERNAL://kafka:29092"),
            "advertised EXTERNAL",
        ),
        (
            _set_kafka_env("KAFKA_ADVERTISED_LISTENERS", "EXTERNAL://kafka:9092,INTERNAL://kafka:29092"),
            "advertised EXTERNAL",
        ),
        (
            _set_kafka_env(
                "KAFKA_LISTENERS", "EXTERNAL://0.0.0.0:9092,INTERNAL://0.0.0.0:29094,CONTROLLER://0.0.0.0:29093"
            ),
            "listeners",
        ),
        (_set_kafka_env("KAFKA_INTER_BROKER_LISTENER_NAME", "EXTERNAL"), "KAFKA_INTER_BROKER_LISTENER_NAME"),
        (_set_kafka_env("KAFKA_NUM_PARTITIONS", "1"), "contradicts server.properties num.partitions"),
        (_publish_postgres, "postgres: publishes"),
        (_wrong_upstream, "proxies.json"),
        (_drop_proxy, "proxies.json"),
        (_old_kafka_image, "kafka: image"),
        (_old_toxiproxy, "go install"),
        (_other_activemq_xml, "activemq.xml is not mounted"),
        (_unpublished_proxy, "toxiproxy: publishes"),
        (_extra_service, "compose services"),
        (_host_network, "network_mode"),
        (_no_healthcheck, "activemq: no healthcheck"),
        (_publish_dtm, "dtm: publishes"),
        (_drop_dtm_proxy, "proxies.json"),
        (_dtm_upstream_grpc, "proxies.json"),
        (_other_dtm_tag, "dtm: image"),
        (_dtm_config_elsewhere, "dtm.yml is not mounted"),
        (_dtm_default_command, "dtm: command"),
        (_dtm_port_from_env, "dtm: environment sets ['HTTP_PORT']"),
        (_no_dtm_service, "compose services"),
        (_toxiproxy_health_ignores_dtm, "healthcheck does not wait for proxy 'dtm'"),
    ],
)
def test_comparison_reports_drift(
    compose: dict[str, Any],
    proxies: list[dict[str, Any]],
    server_properties: dict[str, str],
    mutate: Callable[[dict[str, Any], list[dict[str, Any]]], None],
    expected: str,
) -> None:
    broken, broken_proxies = copy.deepcopy(compose), copy.deepcopy(proxies)
    mutate(broken, broken_proxies)
    errors = compose_topology_errors(broken, broken_proxies, server_properties)
    assert any(expected in e for e in errors), errors


def test_wrong_kafka_advertised_port_is_reported(compose: dict[str, Any], proxies: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(compose)
    env = _kafka_env(broken)
    env["KAFKA_ADVERTISED_LISTENERS"] = env["KAFKA_ADVERTISED_LISTENERS"].replace(":19092", ":19093")
    broken["services"]["kafka"]["environment"] = env
    [error] = compose_topology_errors(broken, proxies)
    assert "19093" in error
    assert "127.0.0.1:19092" in error


# -- no daemon here ------------------------------------------------------------------------------

_DAEMON = docker_available()


@pytest.mark.skipif(_DAEMON, reason="a Docker daemon answers on this machine")
def test_docker_available_is_false_and_quick_without_a_daemon() -> None:
    started = time.monotonic()
    assert docker_available(timeout_s=1.0) is False
    assert time.monotonic() - started < 3.0


@pytest.mark.skipif(_DAEMON, reason="a Docker daemon answers on this machine")
def test_start_without_a_daemon_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path))
    provider = DockerProvider()
    with pytest.raises(ConfigError, match="no Docker daemon") as info:
        provider.start()
    assert info.value.hint
    assert not (tmp_path / "stacks").exists(), "nothing may be created before the daemon answers"
    provider.stop()  # a no-op after a start that never began


def test_importing_the_provider_does_not_import_docker() -> None:
    code = (
        "import sys, harness.stack.docker\n"
        "loaded = [m for m in ('docker', 'testcontainers') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_stop_project_refuses_another_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPOSE_PROJECT_NAME", raising=False)
    with pytest.raises(ConfigError, match="not this checkout's project"):
        DockerProvider.stop_project("someone-else")


# -- health wait, on a stand-in for testcontainers' DockerCompose (the harness logic, not a service) ---


class _FakeContainer:
    def __init__(self, service: str, state: str = "running", health: str = "healthy") -> None:
        self.Service, self.State, self.Health, self.ExitCode = service, state, health, 1


class _FakeCompose:
    def __init__(self, containers: list[_FakeContainer]) -> None:
        self.containers = containers

    def get_containers(self, include_all: bool = False) -> list[_FakeContainer]:
        return self.containers

    def get_logs(self, *services: str) -> tuple[str, str]:
        return "".join(f"{s}-1  | line {i}\n" for s in services for i in range(100)), ""


def _provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, containers: list[_FakeContainer]) -> DockerProvider:
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path))
    monkeypatch.delenv("COMPOSE_PROJECT_NAME", raising=False)
    provider = DockerProvider(start_timeout_s=0.2, poll_s=0.05)
    provider._compose = _FakeCompose(containers)
    return provider


def test_wait_passes_when_every_service_is_healthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [s.name for s in topo.SERVICES]
    _provider(tmp_path, monkeypatch, [_FakeContainer(n) for n in names])._wait_healthy()


def test_wait_fails_fast_with_the_log_tail_of_an_exited_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers = [_FakeContainer(s.name) for s in topo.SERVICES]
    containers[2] = _FakeContainer("kafka", state="exited", health="")
    provider = _provider(tmp_path, monkeypatch, containers)
    with pytest.raises(StackError, match="kafka exited with code 1") as info:
        provider._wait_healthy()
    assert "server.properties" in (info.value.hint or "")
    assert info.value.log_tail.splitlines()[-1] == "line 99"
    assert "kafka-1  |" not in info.value.log_tail


def test_wait_times_out_naming_the_slow_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    containers = [_FakeContainer(s.name) for s in topo.SERVICES]
    containers[3] = _FakeContainer("toxiproxy", health="starting")
    provider = _provider(tmp_path, monkeypatch, containers)
    with pytest.raises(StackError, match=r"toxiproxy not healthy after 0s \(state: starting\)") as info:
        provider._wait_healthy()
    assert "go install" in (info.value.hint or "")


def test_stop_saves_one_log_per_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    downs: list[bool] = []
    provider = _provider(tmp_path, monkeypatch, [])
    provider._compose.stop = lambda down=True: downs.append(down)
    provider.stop()
    assert downs == [True]
    logs = sorted(p.name for p in (tmp_path / "stacks" / "txchaos" / "logs").iterdir())
    assert logs == sorted(f"{s.name}.log" for s in topo.SERVICES)
