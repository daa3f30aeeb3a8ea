"""docker-compose.yml and the project's Dockerfiles build the local provider's topology and settings.

No services and no Docker daemon: the files are parsed and compared with ``topology`` and with the
local provider's own commands, and the comparison itself is shown to catch drift on broken copies.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.errors import ConfigError, StackError
from harness.stack import bootstrap, docker, docker_engine, docker_images, local_recipes
from harness.stack import topology as topo
from harness.stack.base import Endpoints
from harness.stack.docker import PUBLISHED_HOST, compose_endpoints, compose_topology_errors, owner_role_sql
from harness.stack.docker_project import COMPOSE_FILE, OWNER_LABEL, STACK_LABEL, docker_available

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ROOT / "fixtures" / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def _entrypoint(service: str) -> list[str]:
    """Return the exec-form ENTRYPOINT of ``service``'s Dockerfile."""
    text = (DOCKERFILES / service / "Dockerfile").read_text()
    found = re.findall(r"(?m)^ENTRYPOINT (\[.*\])$", text)
    assert len(found) == 1, f"{service}: one exec-form ENTRYPOINT expected"
    return list(json.loads(found[0]))


def _settings(argv: list[str]) -> dict[str, str]:
    """Return the ``-c key=value`` settings of a postgres command line."""
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")


def test_provider_reads_the_repository_compose_file() -> None:
    assert ROOT / "docker-compose.yml" == COMPOSE_FILE


def test_compose_agrees_with_topology(compose: dict[str, Any]) -> None:
    assert compose_topology_errors(compose) == []


def test_services_run_the_projects_images_on_the_hosts_loopback(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {name: s["image"] for name, s in services.items()} == {
        "postgres": "txchaos/postgres:15",
        "activemq": "txchaos/activemq:6.1.8",
        "kafka": "txchaos/kafka:4.1.2",
        "toxiproxy": "txchaos/toxiproxy:2.12.0",
        "dtm": "txchaos/dtm:1.19.0",
    }
    for service in services.values():
        assert service["network_mode"] == "host"
        assert "ports" not in service
        assert service["labels"][STACK_LABEL] == "txchaos"
        assert service["labels"][OWNER_LABEL] == "${TXCHAOS_OWNER:-detached}"


@pytest.mark.parametrize("service", [s.name for s in topo.SERVICES])
def test_every_dockerfile_builds_on_the_configurable_base(service: str) -> None:
    text = (DOCKERFILES / service / "Dockerfile").read_text()
    arg = text.index(f"ARG {docker_images.BASE_ENV}=")
    assert text.index(f"FROM ${{{docker_images.BASE_ENV}}}") > arg
    assert re.search(r"(?m)^FROM ", text)
    assert len(re.findall(r"(?m)^FROM ", text)) == 1


def test_postgres_runs_the_local_providers_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path))
    tools = bootstrap.Tools("java", "/usr/lib/postgresql/15/bin", "a", "k", "t", None, "d")
    recipes = local_recipes.Recipes(tools, local_recipes.Ports.pick(), tmp_path, tmp_path / "pg", "activemq.xml")
    recipes._pg_started = True  # the argv only: no template, no data folder
    argv, _ = recipes.postgres_argv(fresh=False)
    ours = _entrypoint("postgres")
    assert _settings(ours) == _settings(argv)
    assert _settings(ours)["listen_addresses"] == "127.0.0.1"
    assert ours[ours.index("-p") + 1] == str(topo.POSTGRES.port)
    dockerfile = (DOCKERFILES / "postgres" / "Dockerfile").read_text()
    assert f"-U {topo.DB_ADMIN}" in dockerfile
    assert "--auth-host=scram-sha-256" in dockerfile


@pytest.mark.parametrize(("service", "heap"), [("activemq", "-Xmx1g"), ("kafka", "-Xmx384m")])
def test_brokers_run_with_the_local_providers_jvm_flags(service: str, heap: str) -> None:
    argv = _entrypoint(service)
    assert argv[:3] == ["java", heap, "-Xms64m"]
    assert argv[3 : 3 + len(local_recipes.JVM_FLAGS)] == local_recipes.JVM_FLAGS


def test_activemq_binds_loopback_on_the_topology_port() -> None:
    argv = _entrypoint("activemq")
    assert "-Dtxchaos.bind=127.0.0.1" in argv
    assert f"-Dtxchaos.stomp.port={topo.ACTIVEMQ.port}" in argv
    assert f"-Dtxchaos.openwire.port={topo.ACTIVEMQ_OPENWIRE_PORT}" in argv


def test_both_activemq_connectors_have_their_own_proxy() -> None:
    routes = {r.name: r for r in topo.PROXIES if r.service == "activemq"}
    assert set(routes) == {"activemq_stomp", "activemq_openwire"}
    assert routes["activemq_openwire"].port == topo.ACTIVEMQ_OPENWIRE_PORT
    assert topo.proxy_named("activemq_openwire") is routes["activemq_openwire"]
    assert topo.proxy_for("activemq") is routes["activemq_stomp"]
    for config in ("activemq.xml", "activemq-redelivery.xml", "activemq-journal-periodic.xml"):
        text = (ROOT / "fixtures" / "activemq" / config).read_text()
        assert "tcp://${txchaos.bind:0.0.0.0}:${txchaos.openwire.port:61616}?" in text, config


def test_kafka_properties_append_the_listeners_to_the_shared_file() -> None:
    text = docker_images.kafka_properties()
    shared = (ROOT / "fixtures" / "kafka" / "server.properties").read_text()
    assert text.startswith(shared)
    props = dict(line.split("=", 1) for line in text[len(shared) :].splitlines() if "=" in line)
    proxy = topo.proxy_for("kafka")
    assert props["advertised.listeners"] == (
        f"EXTERNAL://{PUBLISHED_HOST}:{proxy.listen_port},INTERNAL://127.0.0.1:{topo.KAFKA_INTERNAL_PORT}"
    )
    assert props["listeners"] == (
        f"EXTERNAL://127.0.0.1:{topo.KAFKA.port},INTERNAL://127.0.0.1:{topo.KAFKA_INTERNAL_PORT},"
        f"CONTROLLER://127.0.0.1:{topo.KAFKA_CONTROLLER_PORT}"
    )


def test_dtm_config_is_the_shared_file_on_the_topology_ports() -> None:
    text = docker_images.dtm_config()
    assert text.startswith((ROOT / "fixtures" / "dtm" / "dtm.yml").read_text().rstrip())
    assert f"HttpPort: {topo.DTM.port}" in text
    assert f"GrpcPort: {topo.DTM_GRPC_PORT}" in text


def test_no_fixed_port_lies_in_the_ephemeral_range_where_a_client_socket_can_hold_it() -> None:
    fixed = topo.fixed_ports()
    assert len(set(fixed.values())) == len(fixed) == len(topo.SERVICES) + len(topo.PROXIES) + 4
    ranges = [(32768, 60999)]  # Linux's default
    here = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if here.exists():
        low, high = (int(x) for x in here.read_text().split())
        ranges.append((low, high))
    inside = {name: port for name, port in fixed.items() for low, high in ranges if low <= port <= high}
    assert inside == {}


def test_a_taken_fixed_port_stops_the_start_before_any_container_naming_the_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as held, socket.socket() as client:
        held.bind((PUBLISHED_HOST, 0))
        held.listen()
        port = held.getsockname()[1]
        client.connect((PUBLISHED_HOST, port))  # a client socket holds its local port just as well
        client_port = client.getsockname()[1]
        monkeypatch.setattr(topo, "fixed_ports", lambda: {"postgres": port, "dtm": client_port})
        with pytest.raises(StackError, match=f"taken on 127.0.0.1: postgres {port}, dtm {client_port}") as caught:
            docker.DockerProvider()._check_ports()
        assert f"sport = :{port}" in str(caught.value)
    with socket.socket() as spare:
        spare.bind((PUBLISHED_HOST, 0))
        free = spare.getsockname()[1]
    assert docker.port_free(PUBLISHED_HOST, free)


def test_context_holds_the_local_pg_hba_and_its_digest_follows_the_base(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(docker_images, "cache_root", lambda: tmp_path)
    tools = bootstrap.Tools("java", "pg", "a", "k", "t", None, "d")
    context, digest = docker_images.assemble("postgres", tools, "debian:bookworm-slim")
    assert sorted(p.name for p in context.iterdir()) == ["Dockerfile", "pg_hba.conf"]
    assert (context / "pg_hba.conf").read_text() == local_recipes.PG_HBA
    assert docker_images.assemble("postgres", tools, docker_images.LOCAL_BASE)[1] != digest


def test_endpoints_are_the_proxy_side(tmp_path: Path) -> None:
    ep = compose_endpoints("txchaos", tmp_path, "s3cret")
    assert ep.provider == "docker"
    assert ep.stack_id == "txchaos"
    for field, route in (
        ("postgres", topo.proxy_for("postgres")),
        ("stomp", topo.proxy_named("activemq_stomp")),
        ("kafka", topo.proxy_for("kafka")),
        ("dtm", topo.proxy_for("dtm")),
        ("openwire", topo.proxy_named("activemq_openwire")),
    ):
        endpoint = getattr(ep, field)
        assert (endpoint.host, endpoint.port) == (PUBLISHED_HOST, route.listen_port)
        assert (endpoint.upstream_host, endpoint.upstream_port) == ("127.0.0.1", route.port)
    assert ep.toxiproxy_api == f"http://{PUBLISHED_HOST}:{topo.TOXIPROXY.port}"
    assert ep.postgres_url.endswith(f"txchaos:s3cret@{PUBLISHED_HOST}:15432/txchaos")
    assert ep.openwire_url == f"tcp://{PUBLISHED_HOST}:16616"


def test_the_harness_own_kafka_clients_can_skip_the_proxy_on_the_listener_that_advertises_itself(
    tmp_path: Path,
) -> None:
    """The EXTERNAL listener advertises the proxy, so only the INTERNAL one keeps a client off it."""
    ep = compose_endpoints("txchaos", tmp_path, "s3cret")
    assert ep.kafka_bootstrap() == ep.kafka.address == f"{PUBLISHED_HOST}:{topo.proxy_for('kafka').listen_port}"
    assert ep.kafka_bootstrap(direct=True) == f"127.0.0.1:{topo.KAFKA_INTERNAL_PORT}"
    props = docker_images.kafka_properties()
    assert f"INTERNAL://127.0.0.1:{topo.KAFKA_INTERNAL_PORT}" in props.split("advertised.listeners=")[1].splitlines()[0]
    again = Endpoints.from_json(ep.to_json())
    assert again.kafka_bootstrap(direct=True) == ep.kafka_bootstrap(direct=True)
    older = json.loads(ep.to_json())
    del older["kafka_direct_port"]  # an endpoints.json written before the field: the proxy, as then
    assert Endpoints.from_json(json.dumps(older)).kafka_bootstrap(direct=True) == ep.kafka.address


def test_owner_role_sql_makes_a_non_superuser_and_refuses_quotes() -> None:
    sql = owner_role_sql("txchaos", "abc123", "txchaos")
    assert "NOSUPERUSER" in sql
    assert "PASSWORD 'abc123'" in sql
    assert 'OWNER TO "txchaos"' in sql
    with pytest.raises(ConfigError, match="not letters"):
        owner_role_sql("txchaos", "x'; DROP ROLE postgres; --", "txchaos")


def test_apt_mirror_reads_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n"
    )
    assert docker_engine.apt_mirror((deb822,)) == "http://mirror.invalid/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://other.invalid/debian bookworm main\n")
    assert docker_engine.apt_mirror((one_line,)) == "http://other.invalid/debian"
    empty = tmp_path / "x.list"
    empty.write_text("deb http://other.invalid/debian trixie main\n")
    with pytest.raises(ConfigError, match="no Debian bookworm mirror"):
        docker_engine.apt_mirror((empty,))


def _set(service: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(c: dict[str, Any]) -> None:
        c["services"][service][key] = value

    return mutate


def _drop(service: str, key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(c: dict[str, Any]) -> None:
        del c["services"][service][key]

    return mutate


def _no_owner_label(c: dict[str, Any]) -> None:
    c["services"]["kafka"]["labels"] = {STACK_LABEL: "txchaos"}


def _extra_service(c: dict[str, Any]) -> None:
    c["services"]["redis"] = copy.deepcopy(c["services"]["dtm"])


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set("kafka", "image", "apache/kafka:4.1.2"), "kafka: image"),
        (_set("postgres", "image", "postgres:15"), "postgres: image"),
        (_drop("dtm", "network_mode"), "dtm: network_mode"),
        (_set("postgres", "ports", ["127.0.0.1:5432:5432"]), "postgres: publishes"),
        (_drop("activemq", "pull_policy"), "activemq: pull_policy"),
        (_no_owner_label, f"kafka: no {OWNER_LABEL} label"),
        (_drop("toxiproxy", "healthcheck"), "toxiproxy: no healthcheck"),
        (_extra_service, "compose services are"),
    ],
)
def test_comparison_reports_drift(
    compose: dict[str, Any], mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    errors = compose_topology_errors(broken)
    assert any(e.startswith(expected) for e in errors), errors


def test_docker_available_is_false_and_quick_without_a_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no.sock'}")
    started = time.monotonic()
    assert docker_available() is False
    assert time.monotonic() - started < 5


def test_importing_the_provider_imports_no_docker_sdk() -> None:
    code = "import sys, harness.stack.docker; print('docker' in sys.modules or 'testcontainers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_the_periodic_journal_config_is_the_shipped_one_but_for_the_sync() -> None:
    """`txchaos bench journal` compares the two: any other difference would be measured as the sync's."""
    shipped = (ROOT / "fixtures" / "activemq" / "activemq.xml").read_text()
    periodic = (ROOT / "fixtures" / "activemq" / "activemq-journal-periodic.xml").read_text()
    body = periodic[periodic.index("-->") :].replace(' journalDiskSyncStrategy="periodic"', "")
    assert body == shipped[shipped.index("-->") :]
    assert 'journalDiskSyncStrategy="periodic"' in periodic
    assert "journalDiskSyncStrategy" not in shipped  # KahaDB's default: always
