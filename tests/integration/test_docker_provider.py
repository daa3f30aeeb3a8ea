"""The docker provider against a real Docker engine (issue 17): faults, reaping and the flagship.

The module fixture runs the idempotent engine set-up ``txchaos install --docker`` runs (docker.io,
a dockerd, a base image, Compose v2, the images: about a second when everything is in place) and
stops at the end a daemon it started, so the rest of the suite keeps choosing its provider as
before. One docker stack runs per daemon (fixed ports), so each group below brings its own stack
up and down in turn: the reaping test, the fault class, then the flagship and one test each of a state machine,
a Kafka and a DTM scenario in a pytest child with ``--txchaos-provider docker``.

``TXCHAOS_DOCKER_TESTS=0`` skips the module (a laptop without root or Docker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.cli.suite import FLAGSHIP_SCENARIOS
from harness.clients import db, kafka
from harness.clients.activemq import StompClient
from harness.clients.toxiproxy import ToxiproxyAdmin
from harness.errors import HarnessError
from harness.faults import KillBroker, Latency, Partition, active
from harness.stack import docker, docker_engine, docker_project
from harness.stack.base import Endpoints

pytestmark = [
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.skipif(os.environ.get("TXCHAOS_DOCKER_TESTS") == "0", reason="TXCHAOS_DOCKER_TESTS=0"),
]
REPO = Path(__file__).resolve().parents[2]
# The whole flagship, plus a state machine, a Kafka and a DTM scenario: one test of each (their
# files whole ran 220 s more on docker, every test of them also running on the local stack).
ONE_OF_EACH = (
    "onepc_machine_scenario.py::test_check_then_skip_holds_under_the_same_rules",
    "kafka_consumer_scenario.py::test_consumer_crash_windows[inbox-offset]",
    "dtm_transfer_scenario.py::test_dtm_transfer[branch-crash]",
)
SCENARIOS = (*FLAGSHIP_SCENARIOS, *(node.split("_scenario.py")[0] for node in ONE_OF_EACH))


def _labelled(kind: str) -> set[str]:
    """Return the ids of every container (``ps``), network or volume a txchaos stack made."""
    args = ["ps", "-a", "-q", "--no-trunc"] if kind == "ps" else [kind, "ls", "-q"]
    out: set[str] = set()
    for label in (docker_project.STACK_LABEL, f"{docker_project.PROJECT_LABEL}={docker_project.COMPOSE_PROJECT}"):
        proc = subprocess.run(
            ["docker", *args, "--filter", f"label={label}"], capture_output=True, text=True, check=True
        )
        out |= set(proc.stdout.split())
    return out


@pytest.fixture(scope="module", autouse=True)
def engine() -> Iterator[None]:
    started = docker_engine.ensure_engine()
    problem = docker_project.docker_unusable()
    if problem and "in use by" in problem:
        pytest.skip(f"this session's own stack runs on docker ({problem})")
    assert problem is None, problem
    try:
        yield
    finally:
        if started:
            docker_engine.stop_daemon()


def test_next_start_reaps_the_stack_of_a_sigkilled_runner(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from harness.stack.docker import DockerProvider\n"
            "DockerProvider().start()\n"
            "open(sys.argv[1], 'w').close()\n"
            "time.sleep(600)\n",
            str(ready),
        ],
        env={**os.environ, "TXCHAOS_REPORTS": str(tmp_path / "reports")},
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert runner.poll() is None, "the runner died before its stack was up"
            assert time.monotonic() < deadline, "the runner's stack did not come up in 120 s"
            time.sleep(0.2)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    leaked = _labelled("ps")
    assert len(leaked) == 5, "the killed runner's containers should still be there"
    assert docker_project.docker_unusable() is None, "auto must not count a dead owner's stack as in use"
    provider = docker.DockerProvider()
    provider.start()
    try:
        assert not leaked & _labelled("ps"), "the new start kept containers of the killed runner"
        owners = {c.owner for c in docker_project.containers()}
        assert owners == {str(os.getpid())}
        assert "in use by process" in (docker_project.docker_unusable() or "")
    finally:
        provider.stop()
    assert _labelled("ps") == set()
    assert _labelled("network") == set()
    assert _labelled("volume") == set()


@pytest.fixture(scope="class")
def stack() -> Iterator[Endpoints]:
    """Yield a docker stack for one class: it is down again before the next group starts its own."""
    with docker.DockerProvider() as ep:
        yield ep


class TestFaultsOnDocker:
    """Toxics, partitions and broker kill -9 with data kept, on a docker stack of this class."""

    def test_latency_and_partition_act_on_the_proxy(self, stack: Endpoints) -> None:
        admin = ToxiproxyAdmin(stack.toxiproxy_api)
        admin.reset()
        assert stack.provider == "docker"
        with active(Latency(ms=400).on(stack.postgres, stack)):
            started = time.monotonic()
            db.ping(stack.postgres_url)
            assert time.monotonic() - started >= 0.4
        with active(Partition().on(stack.stomp, stack)), pytest.raises(HarnessError):
            StompClient(stack.stomp.host, stack.stomp.port, heartbeats=(0, 0))
        with StompClient(stack.stomp.host, stack.stomp.port, heartbeats=(0, 0)):
            pass

    @pytest.mark.activemq
    def test_activemq_kill9_keeps_persistent_messages(self, stack: Endpoints) -> None:
        q = f"txchaos.kill.{uuid.uuid4().hex[:8]}"
        with StompClient(stack.stomp.host, stack.stomp.port, heartbeats=(0, 0)) as c:
            c.send(q, "kept", persistent=True)
            c.send(q, "lost", persistent=False)
        with active(KillBroker("activemq").on(stack)) as fault:
            assert not docker_project.service_running("activemq")
            with pytest.raises(HarnessError):
                StompClient(stack.stomp.host, stack.stomp.port, heartbeats=(0, 0))
        assert fault.killed
        assert fault.restart_s is not None
        with StompClient(stack.stomp.host, stack.stomp.port, heartbeats=(0, 0)) as c:
            c.subscribe(q)
            got = []
            while (msg := c.receive(2)) is not None:
                got.append(msg.body)
                c.ack(msg)
        assert got == ["kept"], "non-persistent messages must die with the broker, persistent ones stay"

    def test_postgres_kill9_keeps_a_committed_row(self, stack: Endpoints) -> None:
        eng = db.engine(stack.postgres_url, pool_size=1)
        try:
            with eng.begin() as conn:
                conn.execute(sa.text("CREATE TABLE IF NOT EXISTS kill_probe (v text)"))
                conn.execute(sa.text("INSERT INTO kill_probe VALUES ('kept')"))
            with active(KillBroker("postgres").on(stack)), pytest.raises(sa.exc.OperationalError):
                db.ping(stack.postgres_url)
            eng.dispose()
            with eng.connect() as conn:
                assert conn.execute(sa.text("SELECT v FROM kill_probe")).scalars().all() == ["kept"]
                # The clients' role is still no superuser after the restart.
                assert (
                    conn.execute(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar()
                    is False
                )
        finally:
            eng.dispose()

    @pytest.mark.kafka
    def test_kafka_kill9_keeps_acknowledged_records(self, stack: Endpoints) -> None:
        topic = f"txchaos.kill.{uuid.uuid4().hex[:8]}"
        kafka.create_topics(stack.kafka.address, [topic], partitions=1)
        values = [(f"k{i}", f"v{i}") for i in range(10)]
        assert kafka.produce(stack.kafka.address, topic, values) == 10
        with active(KillBroker("kafka").on(stack)):
            assert not kafka.broker_ready(stack.kafka.address, 1.0)
        assert sorted(kafka.consume_all(stack.kafka.address, topic, expect=10)) == sorted(values)


def test_flagship_and_a_machine_kafka_and_dtm_scenario_pass_on_docker(tmp_path: Path) -> None:
    files = [f"scenarios/{name}_scenario.py" for name in FLAGSHIP_SCENARIOS]
    files += [f"scenarios/{node}" for node in ONE_OF_EACH]
    report = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("TXCHAOS_PROVIDER", "TXCHAOS_ENDPOINTS")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *files,
            "-q",
            "-p",
            "no:cacheprovider",
            "--txchaos-provider=docker",
            f"--junitxml={report}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, tail
    cases = ET.parse(report).getroot().iter("testcase")
    passed: dict[str, int] = {}
    for case in cases:
        assert not [c.tag for c in case if c.tag in ("failure", "error", "skipped")], case.get("name")
        module = next(p for p in str(case.get("classname")).split(".") if p.endswith("_scenario"))
        passed[module] = passed.get(module, 0) + 1
    assert set(passed) == {f"{name}_scenario" for name in SCENARIOS}, json.dumps(passed)


def test_a_service_image_runs_as_containers_and_a_trap_kills_one(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    # The Go example service's binary in an image of the base, run with image=: each instance a
    # container on the host's network, killed by a pg_after_commit trap through its init process.
    from dataclasses import replace

    from harness.run.core.session import run_scenario
    from harness.run.processes.service_build import ensure_built
    from harness.run.spec.files import load_file
    from harness.run.spec.scenario import Crash, ScenarioSpec
    from harness.stack import containers

    ex = load_file(REPO / "examples" / "services" / "services_scenario.py")
    native = ex.service("go", "naive")
    built = ensure_built(native)
    assert built is not None
    context = tmp_path / "image"
    context.mkdir()
    (context / "orders-go").write_bytes((built / "orders-go").read_bytes())
    (context / "orders-go").chmod(0o755)
    base = docker_engine.ensure_base()
    (context / "Dockerfile").write_text(f'FROM {base}\nCOPY orders-go /orders-go\nENTRYPOINT ["/orders-go"]\n')
    image = "txchaos-test/orders-go:latest"
    subprocess.run(["docker", "build", "-q", "-t", image, str(context)], check=True, capture_output=True, timeout=300)
    # A container a harness SIGKILLed mid-run left behind (its owner process is gone): reaped at the next start.
    stale = subprocess.run(
        ["docker", "run", "-d", f"--label={containers.OWNER_LABEL}=999999999:1", base, "sleep", "300"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    service = replace(native, image=image, command=("--variant", "naive"), build=(), source=None)
    spec = ScenarioSpec.for_service(
        service,
        variant="image-naive",
        name="services",
        schema=ex.scenario("go", "naive").schema,
        effect_table="go_effects",
        messages=8,
        crashes=(Crash("pg_after_commit", op_index=3),),
        timeout_s=60,
    )
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path / "runs")
    assert result.verdict.found() == {"duplicate-effect": 1}, result.verdict.headline()
    assert result.verdict.ops("duplicate-effect") == {"image-naive-s0-op00003"}
    assert any("fired on op image-naive-s0-op00003" in s for s in result.verdict.steps)
    assert containers.remove_run(result.run_dir.name) == []  # the run removed its containers itself
    gone = subprocess.run(["docker", "ps", "-a", "-q", "--no-trunc"], capture_output=True, text=True, check=True)
    assert stale not in gone.stdout.split()
