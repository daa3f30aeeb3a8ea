"""The docker provider: docker-compose.yml driven through testcontainers, handing out the same ``Endpoints``.

This is the only module that imports ``docker`` or ``testcontainers``. Both are imported inside the
functions that need them, so importing this module costs nothing where no daemon runs.
``compose_topology_errors`` compares docker-compose.yml with ``topology``; a unit test runs it.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import resources
from harness.errors import ConfigError, StackError
from harness.paths import stacks_root
from harness.stack import topology as topo
from harness.stack.base import Endpoint, Endpoints

# Must equal the compose file's top-level ``name:`` (checked by compose_topology_errors).
COMPOSE_PROJECT = "txchaos"
COMPOSE_FILE = resources.compose_file()
# Proxy ports are published on loopback only; Kafka advertises this host too, as the local provider does.
PUBLISHED_HOST = "127.0.0.1"
SERVICE_NAMES: tuple[str, ...] = tuple(s.name for s in topo.SERVICES)
# Endpoints field -> the service behind it.
ENDPOINT_SERVICES = {"postgres": "postgres", "stomp": "activemq", "kafka": "kafka", "dtm": "dtm"}
LOG_TAIL_LINES = 40

# Where the fixtures are mounted inside the containers.
ACTIVEMQ_CONFIG_TARGET = "/opt/apache-activemq/conf/activemq.xml"
KAFKA_CONFIG_TARGET = "/mnt/shared/config/server.properties"
DTM_CONFIG_TARGET = "/app/dtm/configs/txchaos.yml"

_HINTS = {
    "toxiproxy": "a fresh container compiles Toxiproxy with `go install`, so the daemon needs the Go module "
    "proxy; on a slow network raise TXCHAOS_START_TIMEOUT (seconds)",
    "kafka": "check that fixtures/kafka/server.properties still agrees with the KAFKA_* listeners in "
    "docker-compose.yml (tests/unit/test_compose_topology.py compares them)",
    "activemq": "check that fixtures/activemq/activemq.xml loads (STOMP on 0.0.0.0:61613)",
    "postgres": "check that the daemon can start postgres:15 and has disk space",
    "dtm": "check that fixtures/dtm/dtm.yml loads (tests/unit/test_dtm_config.py checks it)",
}


def docker_available(timeout_s: float = 2.0) -> bool:
    """Return True only if a Docker daemon answers a ping within about ``timeout_s``; never raise."""
    try:
        # By name: with no harness/__init__.py, mypy would take `import docker` to mean this very file.
        sdk = importlib.import_module("docker")
    except ImportError:
        return False
    client = None
    try:
        client = sdk.from_env(timeout=timeout_s)
        return bool(client.ping())
    except Exception:
        return False
    finally:
        if client is not None:
            client.close()


def docker_unusable(compose_file: Path | None = None, timeout_s: float = 2.0) -> str | None:
    """Return why the docker provider cannot run the stack here, or None when it can; never raise.

    ``auto`` takes docker only on None: a daemon answers, Compose v2 is there, the compose file
    ships, and every image is on the daemon (none is built; a pull is left to the user, since a
    daemon without registry access would fail minutes later, on every test).
    """
    compose = compose_file or COMPOSE_FILE
    if not compose.is_file():
        return f"no compose file at {compose}"
    if not docker_available(timeout_s):
        return "no Docker daemon answers"
    try:
        subprocess.run(["docker", "compose", "version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "`docker compose` (Compose v2) is not available"
    missing = _missing_images(timeout_s)
    if missing:
        return f"image(s) {', '.join(missing)} not on the daemon (`docker compose -f {compose} pull` fetches them)"
    return None


def _missing_images(timeout_s: float) -> list[str]:
    """Return the stack's images the daemon does not hold (all of them when it cannot say)."""
    images = [s.image for s in topo.SERVICES]
    client = None
    try:
        client = importlib.import_module("docker").from_env(timeout=timeout_s)
        have = {tag for image in client.images.list() for tag in image.tags}
    except Exception:
        return images
    finally:
        if client is not None:
            client.close()
    return [i for i in images if i not in have]


def compose_endpoints(project: str, state_dir: Path) -> Endpoints:
    """Return the addresses clients use: the Toxiproxy side of each route, as published on the host."""

    def ep(service: str) -> Endpoint:
        route = topo.proxy_for(service)
        return Endpoint(PUBLISHED_HOST, route.listen_port, route.name, service, route.port)

    return Endpoints(
        provider="docker",
        stack_id=project,
        postgres=ep(ENDPOINT_SERVICES["postgres"]),
        stomp=ep(ENDPOINT_SERVICES["stomp"]),
        kafka=ep(ENDPOINT_SERVICES["kafka"]),
        dtm=ep(ENDPOINT_SERVICES["dtm"]),
        toxiproxy_api=f"http://{PUBLISHED_HOST}:{topo.TOXIPROXY.port}",
        db_user=topo.DB_USER,
        db_password=topo.DB_PASSWORD,
        db_name=topo.DB_NAME,
        state_dir=str(state_dir),
    )


class DockerProvider:
    """Run the stack of docker-compose.yml; ``stop`` also cleans up after a partial ``start``.

    The host ports are fixed, so one docker stack runs per daemon. Example::

        with DockerProvider() as ep:
            engine = create_engine(ep.postgres_url)
    """

    name = "docker"

    def __init__(
        self, *, compose_file: Path | None = None, start_timeout_s: float | None = None, poll_s: float = 2.0
    ) -> None:
        self.compose_file = compose_file or COMPOSE_FILE
        # Compose lets COMPOSE_PROJECT_NAME override the file's `name:`; follow it so stack_id stays true.
        self.project = os.environ.get("COMPOSE_PROJECT_NAME") or COMPOSE_PROJECT
        self.start_timeout_s = start_timeout_s or float(os.environ.get("TXCHAOS_START_TIMEOUT", "600"))
        self.poll_s = poll_s
        self.state_dir = stacks_root() / self.project
        self.endpoints: Endpoints | None = None
        self._compose: Any = None

    def start(self) -> Endpoints:
        """Bring the compose project up, wait until every service is healthy, return its endpoints."""
        self._preflight()
        self._claim()
        self._compose = self._make_compose()
        try:
            self._up()
            self._wait_healthy()
        except BaseException as exc:
            try:
                self.stop()
            except Exception as cleanup:
                exc.add_note(f"cleanup after the failed start also failed: {cleanup}")
            raise
        self.endpoints = compose_endpoints(self.project, self.state_dir)
        (self.state_dir / "endpoints.json").write_text(self.endpoints.to_json())
        return self.endpoints

    def stop(self) -> None:
        """Save each service's log to ``<state_dir>/logs/<service>.log``, then ``compose down -v``."""
        if self._compose is None:
            return
        try:
            self._save_logs()
            self._compose.stop(down=True)
        except subprocess.CalledProcessError as exc:
            raise StackError(
                f"docker compose down failed for project {self.project!r}",
                hint=f"remove it by hand: docker compose -p {self.project} down --volumes",
                log_tail=_tail(_text(exc.stderr)),
            ) from exc
        finally:
            (self.state_dir / "owner.pid").unlink(missing_ok=True)
            self._compose = None

    @classmethod
    def stop_project(cls, project: str) -> None:
        """Stop a stack another process started and left up (``txchaos down``): save logs, down -v."""
        provider = cls()
        if project != provider.project:
            raise ConfigError(
                f"docker stack {project!r} is not this checkout's project {provider.project!r}",
                hint=f"run: docker compose -p {project} down --volumes",
            )
        if not docker_available():
            raise ConfigError("no Docker daemon answers", hint="start Docker, then run `txchaos down` again")
        provider._compose = provider._make_compose()
        provider.stop()

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps of start() ------------------------------------------------------------------------

    def _preflight(self) -> None:
        if not self.compose_file.is_file():
            raise ConfigError(
                f"no compose file at {self.compose_file}",
                hint="run from a checkout of the txchaos repository, or pass compose_file=",
            )
        if not docker_available():
            raise ConfigError(
                "no Docker daemon answers",
                hint="start Docker (or point DOCKER_HOST at a daemon), or use the local provider",
            )
        try:
            subprocess.run(["docker", "compose", "version"], capture_output=True, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(
                "`docker compose` (Compose v2) is not available",
                hint="install the Docker Compose v2 plugin, or use the local provider",
            ) from exc

    def _make_compose(self) -> Any:
        from testcontainers.compose import DockerCompose

        # wait=False: `up --wait` has no deadline; _wait_healthy polls with one and reports which service.
        return DockerCompose(
            context=str(self.compose_file.parent), compose_file_name=self.compose_file.name, wait=False
        )

    def _claim(self) -> None:
        """Record this process as the stack's owner; refuse if a live process already owns it."""
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        owner = self.state_dir / "owner.pid"
        text = owner.read_text().strip() if owner.is_file() else ""
        pid = int(text) if text.isdigit() else 0
        if pid and pid != os.getpid() and _alive(pid):
            raise StackError(
                f"docker stack {self.project!r} is in use by process {pid}",
                hint=f"stop that run first; if it is gone, delete {owner}",
            )
        owner.write_text(str(os.getpid()))

    def _up(self) -> None:
        try:
            # An earlier run killed before stop() leaves containers and volumes: start from nothing.
            self._compose.stop(down=True)
            self._compose.start()
        except subprocess.CalledProcessError as exc:
            err = _text(exc.stderr)
            raise StackError(
                f"docker compose up failed for project {self.project!r} (exit {exc.returncode})",
                hint=_up_hint(err, self.compose_file),
                log_tail=_tail(err),
            ) from exc

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                containers = {c.Service: c for c in self._compose.get_containers(include_all=True)}
            except subprocess.CalledProcessError as exc:
                raise StackError(
                    f"docker compose ps failed for project {self.project!r}",
                    hint="check that the Docker daemon is still up",
                    log_tail=_tail(_text(exc.stderr)),
                ) from exc
            pending: list[tuple[str, str]] = []
            for service in SERVICE_NAMES:
                c = containers.get(service)
                if c is None:
                    pending.append((service, "not created"))
                elif c.State in ("exited", "dead"):
                    raise self._failure(service, f"exited with code {c.ExitCode}")
                elif c.Health == "unhealthy":
                    raise self._failure(service, "failed its healthcheck")
                elif c.Health != "healthy":
                    pending.append((service, c.Health or c.State or "unknown"))
            if not pending:
                return
            if time.monotonic() > deadline:
                service, state = pending[0]
                waited = f"{self.start_timeout_s:.0f}s"
                raise self._failure(service, f"not healthy after {waited} (state: {state})")
            time.sleep(self.poll_s)

    def _failure(self, service: str, what: str) -> StackError:
        log = self.state_dir / "logs" / f"{service}.log"
        return StackError(
            f"docker stack {self.project!r}: {service} {what}",
            hint=f"{_HINTS.get(service, 'read its log')}; full log: {log}",
            log_tail=_tail(self._logs(service)),
        )

    def _logs(self, service: str) -> str:
        try:
            out, _ = self._compose.get_logs(service)
        except (OSError, subprocess.SubprocessError):
            return ""
        # Drop compose's "service-1  | " prefix: the file is already per service.
        return re.sub(r"(?m)^\S+\s+\| ?", "", str(out))

    def _save_logs(self) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for service in SERVICE_NAMES:
            text = self._logs(service)
            if text:
                (logs / f"{service}.log").write_text(text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _text(raw: bytes | str | None) -> str:
    if isinstance(raw, bytes):
        return raw.decode(errors="replace")
    return raw or ""


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _up_hint(stderr: str, compose_file: Path) -> str:
    low = stderr.lower()
    if "already allocated" in low or "address already in use" in low:
        ports = ", ".join(str(p) for p in (topo.TOXIPROXY.port, *(r.listen_port for r in topo.PROXIES)))
        return f"free the host ports {ports} (another stack or program holds one)"
    if "pull" in low or "manifest" in low or "no such host" in low:
        images = ", ".join(s.image for s in topo.SERVICES)
        return f"the daemon could not pull an image ({images}); check its network or registry mirror"
    return f"run `docker compose -f {compose_file} up` by hand to see the full error"


# -- topology check ------------------------------------------------------------------------------


def read_properties(text: str) -> dict[str, str]:
    """Parse a Java .properties text of plain ``key=value`` lines (comments and blanks skipped)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def kafka_env_property(key: str) -> str:
    """Return the server property a KAFKA_* variable sets, as the apache/kafka image derives it."""
    return key.removeprefix("KAFKA_").lower().replace("_", ".").replace("...", "-").replace("..", "_")


def compose_topology_errors(
    compose: Mapping[str, Any],
    proxies: list[dict[str, Any]],
    server_properties: Mapping[str, str] | None = None,
) -> list[str]:
    """Return how docker-compose.yml and proxies.json (parsed) differ from ``topology``; [] if they agree.

    ``server_properties`` (fixtures/kafka/server.properties, parsed) adds a check that no KAFKA_*
    variable contradicts the shared file.
    """
    errors: list[str] = []
    if compose.get("name") != COMPOSE_PROJECT:
        errors.append(f"compose project name is {compose.get('name')!r}, expected {COMPOSE_PROJECT!r}")
    services: Mapping[str, Any] = compose.get("services") or {}
    if set(services) != set(SERVICE_NAMES):
        errors.append(f"compose services are {sorted(services)}, expected {sorted(SERVICE_NAMES)}")
    for svc in topo.SERVICES:
        spec = services.get(svc.name)
        if spec is None:
            continue
        if spec.get("image") != svc.image:
            errors.append(f"{svc.name}: image is {spec.get('image')!r}, expected {svc.image!r}")
        test = (spec.get("healthcheck") or {}).get("test")
        if not test or test == ["NONE"] or (spec.get("healthcheck") or {}).get("disable"):
            errors.append(f"{svc.name}: no healthcheck")
        if "network_mode" in spec:
            errors.append(f"{svc.name}: network_mode {spec['network_mode']!r} would bypass Toxiproxy")
        if svc is not topo.TOXIPROXY and spec.get("ports"):
            errors.append(f"{svc.name}: publishes {spec['ports']}; clients may reach it only via Toxiproxy")
    errors += _toxiproxy_errors(services.get("toxiproxy") or {}, proxies)
    errors += _kafka_errors(services.get("kafka") or {}, server_properties)
    errors += _activemq_errors(services.get("activemq") or {})
    errors += _postgres_errors(services.get("postgres") or {})
    errors += _dtm_errors(services.get("dtm") or {})
    return errors


def _toxiproxy_errors(spec: Mapping[str, Any], proxies: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    command = _command(spec)
    install = f"go install {topo.TOXIPROXY_MODULE}@v{topo.TOXIPROXY.version}"
    if install not in command:
        errors.append(f"toxiproxy: command does not run {install!r}")
    args = command.split()
    if _flag(args, "-host") != "0.0.0.0" or _flag(args, "-port") != str(topo.TOXIPROXY.port):
        errors.append(f"toxiproxy: server must run with -host 0.0.0.0 -port {topo.TOXIPROXY.port}")
    config = _flag(args, "-config")
    if config is None or _binds(spec).get(config) != "fixtures/toxiproxy/proxies.json":
        errors.append("toxiproxy: -config must name the mounted fixtures/toxiproxy/proxies.json")
    expected = {(PUBLISHED_HOST, p, p) for p in (topo.TOXIPROXY.port, *(r.listen_port for r in topo.PROXIES))}
    published = {_published(p) for p in spec.get("ports") or []}
    if published != expected:
        errors.append(f"toxiproxy: publishes {sorted(published)}, expected {sorted(expected)}")
    health = " ".join(str(t) for t in (spec.get("healthcheck") or {}).get("test") or [])
    for route in topo.PROXIES:
        if f'"{route.name}"' not in health:
            errors.append(f"toxiproxy: healthcheck does not wait for proxy {route.name!r}")
    want = {r.name: (f"0.0.0.0:{r.listen_port}", f"{r.service}:{r.port}", True) for r in topo.PROXIES}
    got = {p.get("name"): (p.get("listen"), p.get("upstream"), p.get("enabled")) for p in proxies}
    if got != want:
        errors.append(f"proxies.json routes are {got}, expected {want}")
    return errors


def _kafka_errors(spec: Mapping[str, Any], server_properties: Mapping[str, str] | None) -> list[str]:
    errors: list[str] = []
    env = _env(spec)
    listeners = _listeners(env.get("KAFKA_LISTENERS", ""))
    advertised = _listeners(env.get("KAFKA_ADVERTISED_LISTENERS", ""))
    proxy = topo.proxy_for("kafka")
    want_listeners = {
        "EXTERNAL": topo.KAFKA.port,
        "INTERNAL": topo.KAFKA_INTERNAL_PORT,
        "CONTROLLER": topo.KAFKA_CONTROLLER_PORT,
    }
    if {k: v[1] for k, v in listeners.items()} != want_listeners:
        errors.append(f"kafka: listeners are {listeners}, expected ports {want_listeners}")
    if advertised.get("EXTERNAL") != (PUBLISHED_HOST, proxy.listen_port):
        errors.append(
            f"kafka: advertised EXTERNAL listener is {advertised.get('EXTERNAL')}, expected the kafka proxy "
            f"{PUBLISHED_HOST}:{proxy.listen_port}, or clients bypass Toxiproxy after metadata"
        )
    if advertised.get("INTERNAL") != ("kafka", topo.KAFKA_INTERNAL_PORT):
        got = advertised.get("INTERNAL")
        errors.append(f"kafka: advertised INTERNAL is {got}, expected kafka:{topo.KAFKA_INTERNAL_PORT}")
    if set(advertised) - {"EXTERNAL", "INTERNAL"}:
        errors.append(f"kafka: advertises {sorted(advertised)}; only EXTERNAL and INTERNAL may be advertised")
    expected_env = {
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_NODE_ID": "1",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "INTERNAL",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
    }
    for key, value in expected_env.items():
        if env.get(key) != value:
            errors.append(f"kafka: {key}={env.get(key)!r}, expected {value!r}")
    protocol_map = env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "")
    mapped = sorted(p.split(":", 1)[0] for p in protocol_map.split(",") if ":" in p)
    if mapped != sorted(want_listeners):
        errors.append(f"kafka: security protocol map names {mapped}, expected {sorted(want_listeners)}")
    voters = env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "")
    if not voters.startswith("1@") or not voters.endswith(f":{topo.KAFKA_CONTROLLER_PORT}"):
        errors.append(f"kafka: controller quorum voters {voters!r} must be node 1 on the CONTROLLER port")
    if _binds(spec).get(KAFKA_CONFIG_TARGET) != "fixtures/kafka/server.properties":
        errors.append(f"kafka: fixtures/kafka/server.properties is not mounted at {KAFKA_CONFIG_TARGET}")
    shared = server_properties or {}
    for key, value in env.items():
        prop = kafka_env_property(key)
        if key.startswith("KAFKA_") and prop in shared and shared[prop] != value:
            errors.append(f"kafka: {key}={value!r} contradicts server.properties {prop}={shared[prop]!r}")
    return errors


def _activemq_errors(spec: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    if _binds(spec).get(ACTIVEMQ_CONFIG_TARGET) != "fixtures/activemq/activemq.xml":
        errors.append(f"activemq: fixtures/activemq/activemq.xml is not mounted at {ACTIVEMQ_CONFIG_TARGET}")
    opts = _env(spec).get("ACTIVEMQ_OPTS", "").split()
    for prop in ("-Dtxchaos.bind=0.0.0.0", f"-Dtxchaos.stomp.port={topo.ACTIVEMQ.port}"):
        if prop not in opts:
            errors.append(f"activemq: ACTIVEMQ_OPTS lacks {prop}")
    return errors


def _postgres_errors(spec: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    env = _env(spec)
    for key, value in (
        ("POSTGRES_USER", topo.DB_USER),
        ("POSTGRES_PASSWORD", topo.DB_PASSWORD),
        ("POSTGRES_DB", topo.DB_NAME),
    ):
        if env.get(key) != value:
            errors.append(f"postgres: {key}={env.get(key)!r}, expected {value!r}")
    if "fsync=off" not in _command(spec).split():
        errors.append("postgres: command must set fsync=off")
    return errors


def _dtm_errors(spec: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    if _binds(spec).get(DTM_CONFIG_TARGET) != "fixtures/dtm/dtm.yml":
        errors.append(f"dtm: fixtures/dtm/dtm.yml is not mounted at {DTM_CONFIG_TARGET}")
    if _flag(_command(spec).split(), "-c") != DTM_CONFIG_TARGET:
        errors.append(f"dtm: command must be `-c {DTM_CONFIG_TARGET}` (the image's entrypoint is the server)")
    # The ports come from DTM's defaults in docker; an environment override would move them.
    moved = sorted(k for k in _env(spec) if k in ("HTTP_PORT", "GRPC_PORT"))
    if moved:
        errors.append(f"dtm: environment sets {moved}; the proxy expects HTTP on {topo.DTM.port}")
    return errors


def _command(spec: Mapping[str, Any]) -> str:
    raw = spec.get("command") or ""
    text = " ".join(str(part) for part in raw) if isinstance(raw, list) else str(raw)
    return " ".join(text.split())


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


def _env(spec: Mapping[str, Any]) -> dict[str, str]:
    raw = spec.get("environment") or {}
    if isinstance(raw, list):
        return dict(str(item).split("=", 1) for item in raw if "=" in str(item))
    return {str(k): " ".join(str(v).split()) for k, v in raw.items()}


def _binds(spec: Mapping[str, Any]) -> dict[str, str]:
    """Return the service's bind mounts as container path -> host path relative to the compose file."""
    binds: dict[str, str] = {}
    for volume in spec.get("volumes") or []:
        if isinstance(volume, dict):
            source, target = str(volume.get("source", "")), str(volume.get("target", ""))
        else:
            source, target = ([*str(volume).split(":"), ""])[:2]
        binds[target] = source.removeprefix("./")
    return binds


def _published(entry: Any) -> tuple[str, int, int]:
    """Return (host ip, host port, container port) of a ``ports`` entry; host port 0 means ephemeral."""
    if isinstance(entry, dict):
        return str(entry.get("host_ip", "")), int(entry.get("published") or 0), int(entry["target"])
    parts = str(entry).split("/")[0].rsplit(":", 2)
    if len(parts) == 1:
        return "", 0, int(parts[0])
    if len(parts) == 2:
        return "", int(parts[0]), int(parts[1])
    return parts[0], int(parts[1]), int(parts[2])


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    """Parse ``NAME://host:port,...`` into {NAME: (host, port)}."""
    out: dict[str, tuple[str, int]] = {}
    for item in value.split(","):
        name, sep, address = item.strip().partition("://")
        if sep:
            host, _, port = address.rpartition(":")
            out[name] = (host, int(port) if port.isdigit() else -1)
    return out
