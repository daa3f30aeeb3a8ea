"""The docker provider: docker-compose.yml run with the project's own images, handing out the same ``Endpoints``.

The containers run the local provider's topology on the host's network (see docker-compose.yml):
every server binds 127.0.0.1 on the fixed ports of ``topology``, the provider creates the Toxiproxy
proxies through its API and makes the clients' non-superuser role over the Postgres Unix socket,
as the local provider does, and waits with the same readiness probes through the proxies.

Reaping: ``stop`` (a test session's end) and ``txchaos down`` remove the project's containers,
networks and volumes; a start first removes whatever an owner that is gone (a SIGKILLed runner)
left (``docker_project.reap``). Only the ``docker`` CLI is used (no SDK, no testcontainers reaper).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, StackError
from harness.paths import stacks_root
from harness.protocols import PROTOCOLS
from harness.stack import topology as topo
from harness.stack.base import Endpoint, Endpoints
from harness.stack.docker_images import IMAGES
from harness.stack.docker_project import (
    COMPOSE_FILE,
    COMPOSE_PROJECT,
    DETACHED,
    OWNER_LABEL,
    STACK_LABEL,
    containers,
    docker,
    docker_available,
    docker_unusable,
    reap,
    tail,
    who,
)

# Must equal the compose file's top-level ``name:`` (checked by compose_topology_errors).
PUBLISHED_HOST = "127.0.0.1"
SERVICE_NAMES: tuple[str, ...] = tuple(s.name for s in topo.SERVICES)
PG_DATA = "/var/lib/txchaos/pg"  # the image's data folder, which also holds the server's Unix socket
INSTALL_HINT = "`txchaos install --docker` sets up the engine, Compose v2 and the images"


def compose_endpoints(project: str, state_dir: Path, db_password: str = topo.DB_PASSWORD) -> Endpoints:
    """Return the addresses clients use: the Toxiproxy side of each route, on loopback."""

    def ep(route: topo.ProxyRoute) -> Endpoint:
        return Endpoint(PUBLISHED_HOST, route.listen_port, route.name, PUBLISHED_HOST, route.port)

    proxied: dict[str, Any] = {p.endpoint: ep(topo.proxy_named(p.proxy)) for p in PROTOCOLS}
    return Endpoints(
        provider="docker",
        stack_id=project,
        **proxied,
        toxiproxy_api=f"http://{PUBLISHED_HOST}:{topo.TOXIPROXY.port}",
        db_user=topo.DB_USER,
        db_password=db_password,
        db_name=topo.DB_NAME,
        state_dir=str(state_dir),
        kafka_direct_port=topo.KAFKA_INTERNAL_PORT,
    )


def port_free(host: str, port: int) -> bool:
    """Return True when a server could listen on ``host:port`` now (as Go and the JVM bind: SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class DockerProvider:
    """Run the stack of docker-compose.yml; ``stop`` also cleans up after a partial ``start``.

    The host ports are fixed, so one docker stack runs per daemon. Example::

        with DockerProvider() as ep:
            engine = create_engine(ep.postgres_url)
    """

    name = "docker"

    def __init__(self, *, compose_file: Path | None = None, detached: bool = False) -> None:
        self.compose_file = compose_file or COMPOSE_FILE
        self.project = COMPOSE_PROJECT
        self.detached = detached
        self.state_dir = stacks_root() / self.project
        self.endpoints: Endpoints | None = None
        self.timings: dict[str, float] = {}
        self._started = False

    def start(self) -> Endpoints:
        """Reap what a killed run left, bring the project up, wait until every service answers through its proxy."""
        self._preflight()
        reap()
        running = containers()
        if running:
            raise StackError(
                f"docker stack {self.project!r} is already running, owned by {who(running[0].owner)}",
                hint="stop that run first (`txchaos down` stops one `txchaos up` started)",
            )
        self._check_ports()
        started = time.monotonic()
        self._started = True
        try:
            (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
            password = secrets.token_hex(16)  # letters and digits: it goes into a URL and a SQL literal
            self._compose("up", "--detach", "--no-build", "--pull", "never", timeout=300)
            ep = compose_endpoints(self.project, self.state_dir, password)
            self._wire(ep)
        except BaseException as exc:
            try:
                self.stop()
            except Exception as cleanup:
                exc.add_note(f"cleanup after the failed start also failed: {cleanup}")
            raise
        self.timings["total"] = time.monotonic() - started
        self.endpoints = ep
        ep.save(self.state_dir / "endpoints.json")
        return ep

    def stop(self) -> None:
        """Save each service's log to ``<state_dir>/logs/<service>.log``; remove its containers, networks, volumes."""
        if not self._started:
            return
        try:
            self._save_logs()
            proc = self._compose("down", "--volumes", "--remove-orphans", "--timeout", "2", timeout=180, check=False)
            left = reap(everything=True)  # what down could not remove (a container it does not know)
            if proc.returncode != 0 and left:
                raise StackError(
                    f"docker compose down failed for project {self.project!r}",
                    hint=f"remove it by hand: docker compose -p {self.project} down --volumes",
                    log_tail=tail(proc.stderr),
                )
        finally:
            (self.state_dir / "endpoints.json").unlink(missing_ok=True)
            self._started = False

    @classmethod
    def stop_project(cls, project: str) -> None:
        """Stop a stack another process started and left up (``txchaos down``): save logs, remove it."""
        if project != COMPOSE_PROJECT:
            raise ConfigError(
                f"docker stack {project!r} is not txchaos's project {COMPOSE_PROJECT!r}",
                hint=f"run: docker compose -p {project} down --volumes",
            )
        if not docker_available():
            raise ConfigError("no Docker daemon answers", hint="start Docker, then run `txchaos down` again")
        provider = cls()
        provider._started = True
        provider.stop()

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps of start() ------------------------------------------------------------------------

    def _preflight(self) -> None:
        problem = docker_unusable(self.compose_file)
        if problem is not None:
            raise ConfigError(f"the docker provider cannot run the stack here: {problem}", hint=INSTALL_HINT)

    def _check_ports(self) -> None:
        """Refuse to start when a fixed port is taken: on the host's network the server would just exit."""
        taken = [(name, port) for name, port in topo.fixed_ports().items() if not port_free(PUBLISHED_HOST, port)]
        if taken:
            raise StackError(
                f"the docker stack's fixed ports are taken on {PUBLISHED_HOST}: "
                + ", ".join(f"{name} {port}" for name, port in taken),
                hint=f"stop what holds them (`ss -tanp 'sport = :{taken[0][1]}'` names it), "
                "or use --provider local, which picks free ports",
            )

    def _compose(self, *args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "TXCHAOS_OWNER": DETACHED if self.detached else str(os.getpid())}
        cmd = ["docker", "compose", "-f", str(self.compose_file), "-p", self.project, *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StackError(f"`docker compose {args[0]}` failed: {exc}", hint="check the Docker daemon") from exc
        if check and proc.returncode != 0:
            raise StackError(
                f"docker compose {args[0]} failed for project {self.project!r} (exit {proc.returncode})",
                hint=_up_hint(proc.stderr, self.compose_file),
                log_tail=tail(proc.stderr),
            )
        return proc

    def _wire(self, ep: Endpoints) -> None:
        """Create the proxies, make the clients' role, then wait for every service through its proxy."""
        from harness.stack.waits import Wait, port_open, wait_each
        from harness.stack.wiring import create_proxies, readiness

        api = Wait("toxiproxy API", port_open(PUBLISHED_HOST, topo.TOXIPROXY.port), timeout=60)
        self.timings["toxiproxy"] = self._watch("toxiproxy", api.run)
        create_proxies(ep)

        def wait(service: str) -> None:
            if service == "postgres":  # the clients' role first, while the others start
                self.timings["postgres-role"] = self._watch(service, lambda: self._make_role(ep))
            self.timings[service] = self._watch(service, lambda: readiness(service, ep).run(None))

        wait_each(ENDPOINT_SERVICES, wait)

    def _watch(self, service: str, wait: object) -> float:
        """Run ``wait`` (returns seconds); a failure carries the container's state and log tail."""
        assert callable(wait)
        try:
            return float(wait())
        except StackError as exc:
            if exc.log_tail:
                raise
            failure: Exception = exc  # a readiness wait that timed out: it knows no container
        except Exception as exc:
            failure = exc
        state = ", ".join(f"{c.service}:{'up' if c.running else 'exited'}" for c in containers(self.project))
        reason = failure.message if isinstance(failure, StackError) else str(failure)  # the hint below is ours
        raise StackError(
            f"docker stack {self.project!r}: {service} did not answer: {reason}",
            hint=f"containers: {state or 'none'}; full log: {self.state_dir / 'logs' / f'{service}.log'}",
            log_tail=tail(self._logs(service)),
        ) from failure

    def _make_role(self, ep: Endpoints) -> float:
        """Make ``ep.db_user`` a non-superuser owning the run database, over the server's private socket."""
        started = time.monotonic()
        box = [c.id for c in containers(self.project, service="postgres")]
        if not box:
            raise StackError("no postgres container", hint="read the compose output")
        deadline = started + 60
        while docker("exec", box[0], "/usr/lib/postgresql/15/bin/pg_isready", "-q", "-h", PG_DATA).returncode:
            if time.monotonic() > deadline:
                raise TimeoutError("postgres did not open its Unix socket within 60 s")
            time.sleep(0.1)
        proc = docker(
            "exec", "-i", box[0], "psql", "-q", "-v", "ON_ERROR_STOP=1", "-h", PG_DATA,
            "-U", topo.DB_ADMIN, "-d", "postgres", "-f", "-",
            stdin=owner_role_sql(ep.db_user, ep.db_password, ep.db_name),
        )  # fmt: skip
        if proc.returncode != 0:
            raise StackError(
                "making the clients' Postgres role failed", hint="read the postgres log", log_tail=proc.stderr
            )
        return time.monotonic() - started

    def _logs(self, service: str) -> str:
        found = containers(self.project, service=service)
        if not found:
            return ""
        proc = docker("logs", found[0].id, timeout=30)
        return proc.stdout + proc.stderr

    def _save_logs(self) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for service in SERVICE_NAMES:
            text = self._logs(service)
            if text:
                (logs / f"{service}.log").write_text(text)


# Endpoints field -> the service behind it, waited for through its proxy.
ENDPOINT_SERVICES = ("postgres", "activemq", "kafka", "dtm")


def owner_role_sql(role: str, password: str, name: str) -> str:
    """Return psql input that makes ``role`` a non-superuser owning ``name`` (as ``db.ensure_owner_role``)."""
    for what, value in (("role", role), ("database", name), ("password", password)):
        if not value.replace("_", "").isalnum():
            raise ConfigError(f"{what} {value!r} is not letters, digits and _", hint="use a plain identifier")
    attrs = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
    return (
        f"SELECT 'CREATE ROLE \"{role}\"' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}')\\gexec\n"
        f"ALTER ROLE \"{role}\" WITH {attrs} PASSWORD '{password}';\n"
        f'SELECT \'CREATE DATABASE "{name}" OWNER "{role}"\' '
        f"WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '{name}')\\gexec\n"
        f'ALTER DATABASE "{name}" OWNER TO "{role}";\n'
    )


def _up_hint(stderr: str, compose_file: Path) -> str:
    low = stderr.lower()
    if "already allocated" in low or "address already in use" in low:
        ports = ", ".join(str(s.port) for s in topo.SERVICES)
        return f"free the loopback ports {ports} and {', '.join(str(r.listen_port) for r in topo.PROXIES)}"
    if "no such image" in low or "pull" in low:
        return INSTALL_HINT
    return f"run `docker compose -f {compose_file} up` by hand to see the full error"


# -- topology check ------------------------------------------------------------------------------


def compose_topology_errors(compose: Mapping[str, Any]) -> list[str]:
    """Return how docker-compose.yml (parsed) differs from ``topology`` and the images; [] if they agree."""
    errors: list[str] = []
    if compose.get("name") != COMPOSE_PROJECT:
        errors.append(f"compose project name is {compose.get('name')!r}, expected {COMPOSE_PROJECT!r}")
    services: Mapping[str, Any] = compose.get("services") or {}
    if set(services) != set(SERVICE_NAMES):
        errors.append(f"compose services are {sorted(services)}, expected {sorted(SERVICE_NAMES)}")
    for name, spec in services.items():
        if name in IMAGES and spec.get("image") != IMAGES[name]:
            errors.append(f"{name}: image is {spec.get('image')!r}, expected the project's {IMAGES[name]!r}")
        # The host's network: every server binds 127.0.0.1 as the local provider's do, and DTM's
        # check-backs reach the workers on 127.0.0.1.
        if spec.get("network_mode") != "host":
            errors.append(f"{name}: network_mode is {spec.get('network_mode')!r}, expected 'host'")
        if spec.get("ports"):
            errors.append(f"{name}: publishes {spec['ports']}; clients reach services only through Toxiproxy")
        if spec.get("pull_policy") != "never":
            errors.append(f"{name}: pull_policy must be 'never' (the images are built, never pulled)")
        labels = spec.get("labels") or {}
        for label in (STACK_LABEL, OWNER_LABEL):
            if label not in labels:
                errors.append(f"{name}: no {label} label, so a killed run's container would never be reaped")
        health = spec.get("healthcheck") or {}
        if not health.get("test") or health.get("test") == ["NONE"] or health.get("disable"):
            errors.append(f"{name}: no healthcheck")
    return errors
