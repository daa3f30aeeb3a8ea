"""Build the docker provider's images from the project's Dockerfiles (``fixtures/docker/<service>/``).

Each build context is assembled under ``<cache>/docker/context/<service>/`` from the Dockerfile, the
shared fixtures and what ``txchaos install`` put in the cache (the ActiveMQ and Kafka jars, the
Go-built Toxiproxy and loopback DTM), so a container runs the very files the local provider runs.
Postgres and the JRE come from Debian's packages inside the build, as on the host.

The base is ``$TXCHAOS_DOCKER_BASE`` when set, else ``txchaos/base:bookworm`` when the daemon holds it
(the rootfs ``docker_engine`` imports where no registry answers), else the official
``debian:bookworm-slim``. Every image is labelled with the digest of its context and base; a build
is skipped when the daemon already holds an image with that digest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness import resources
from harness.errors import ConfigError, StackError
from harness.paths import cache_root
from harness.stack import bootstrap, dtm, topology

BASE_ENV = "TXCHAOS_DOCKER_BASE"
LOCAL_BASE = "txchaos/base:bookworm"
DEFAULT_BASE = "debian:bookworm-slim"
CONTEXT_LABEL = "txchaos.context"
IMAGES: dict[str, str] = {s.name: f"txchaos/{s.name}:{s.version}" for s in topology.SERVICES}
BUILD_TIMEOUT_S = 1800
_BUILD_ENV = {"DOCKER_BUILDKIT": "0"}  # the legacy builder: no buildx needed


def dockerfiles() -> Path:
    """Return the folder of the per-service Dockerfiles (shipped in the package)."""
    return resources.fixtures_dir() / "docker"


def kafka_properties() -> str:
    """Return the broker's server.properties: the shared file plus the listeners, as the local provider appends them."""
    proxy = topology.proxy_for("kafka")
    lo = "127.0.0.1"
    lines = [
        "",
        f"listeners=EXTERNAL://{lo}:{topology.KAFKA.port},INTERNAL://{lo}:{topology.KAFKA_INTERNAL_PORT},"
        f"CONTROLLER://{lo}:{topology.KAFKA_CONTROLLER_PORT}",
        f"advertised.listeners=EXTERNAL://{lo}:{proxy.listen_port},INTERNAL://{lo}:{topology.KAFKA_INTERNAL_PORT}",
        f"controller.quorum.voters=1@{lo}:{topology.KAFKA_CONTROLLER_PORT}",
        "log.dirs=/var/lib/txchaos/kafka/data",
        "",
    ]
    return (resources.fixture("kafka", "server.properties")).read_text() + "\n".join(lines)


def dtm_config() -> str:
    """Return fixtures/dtm/dtm.yml with the docker stack's fixed ports."""
    return dtm.render(dtm.CONFIG.read_text(), http_port=topology.DTM.port, grpc_port=topology.DTM_GRPC_PORT)


def _place(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)  # the jars are large; a hard link costs nothing
    except OSError:
        shutil.copy2(src, dest)


def _sources(service: str, tools: bootstrap.Tools) -> dict[str, Path | str]:
    """Return what the context of ``service`` holds: relative name -> a file to copy or a text to write."""
    from harness.stack.local_recipes import PG_HBA

    fixtures = resources.fixtures_dir()
    files: dict[str, Path | str] = {"Dockerfile": dockerfiles() / service / "Dockerfile"}
    if service == "postgres":
        files["pg_hba.conf"] = PG_HBA
    elif service in ("activemq", "kafka"):
        lib = Path(tools.activemq_lib if service == "activemq" else tools.kafka_lib)
        files.update({f"lib/{jar.name}": jar for jar in sorted(lib.glob("*.jar"))})
        files["log4j2.properties"] = fixtures / service / "log4j2.properties"
        if service == "activemq":
            for name in ("activemq.xml", "activemq-redelivery.xml"):
                files[name] = fixtures / "activemq" / name
        else:
            files["server.properties"] = kafka_properties()
    elif service == "toxiproxy":
        files["toxiproxy-server"] = Path(tools.toxiproxy)
    elif service == "dtm":
        files["dtm"] = Path(tools.dtm)
        files["dtm.yml"] = dtm_config()
    return files


def assemble(service: str, tools: bootstrap.Tools, base: str) -> tuple[Path, str]:
    """Write the build context of ``service``; return its folder and the digest of its contents and base."""
    context = cache_root() / "docker" / "context" / service
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    digest = hashlib.sha256(f"base={base}\n".encode())
    for name, source in sorted(_sources(service, tools).items()):
        dest = context / name
        if isinstance(source, str):
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(source)
        else:
            _place(source, dest)
        digest.update(name.encode() + b"\0" + hashlib.sha256(dest.read_bytes()).digest())
    return context, digest.hexdigest()[:16]


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["docker", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **_BUILD_ENV},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(
            f"`docker {' '.join(args[:2])}` failed: {exc}", hint="check that the Docker daemon answers"
        ) from exc


def has_image(ref: str) -> bool:
    return _docker("image", "inspect", ref).returncode == 0


def image_digest(ref: str) -> str | None:
    """Return the context digest ``ref`` was built from, or None when the daemon lacks it."""
    proc = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{CONTEXT_LABEL}"}}}}', ref)
    return proc.stdout.strip() if proc.returncode == 0 else None


def base_image() -> str:
    """Return the base image the Dockerfiles build on (see the module docstring)."""
    chosen = os.environ.get(BASE_ENV)
    if chosen:
        return chosen
    return LOCAL_BASE if has_image(LOCAL_BASE) else DEFAULT_BASE


def missing_images() -> list[str]:
    """Return the stack's images the daemon does not hold."""
    return [ref for ref in IMAGES.values() if not has_image(ref)]


def build_images(
    *, say: Callable[[str], None] = lambda _: None, base: str | None = None, force: bool = False
) -> dict[str, str]:
    """Build every service image whose context changed (all with ``force``); return service -> "built" or "kept".

    ``base`` defaults to ``base_image()``.
    """
    try:
        tools = bootstrap.load_tools()
    except bootstrap.BootstrapError as exc:
        raise ConfigError(str(exc), hint="run `txchaos install` first: the images copy its jars and binaries") from exc
    base = base or base_image()
    outcome: dict[str, str] = {}
    for service, ref in IMAGES.items():
        context, digest = assemble(service, tools, base)
        if not force and image_digest(ref) == digest:
            outcome[service] = "kept"
            continue
        say(f"building {ref} on {base}")
        args = ["build", "-t", ref, "--label", f"{CONTEXT_LABEL}={digest}", "--build-arg", f"{BASE_ENV}={base}"]
        proc = _docker(*args, str(context), timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise StackError(
                f"building the docker image {ref} failed (exit {proc.returncode})",
                hint=f"the base is {base} (set ${BASE_ENV} to another Debian bookworm image); "
                f"rerun by hand: DOCKER_BUILDKIT=0 docker build {context}",
                log_tail="\n".join((proc.stdout + proc.stderr).splitlines()[-30:]),
            )
        outcome[service] = "built"
    return outcome
