"""Set up what the docker provider needs: the engine, a base image, Compose v2 and the stack's images.

Every step is idempotent and does work only when something is missing, so CI can call it before
every run (a second call takes about a second):

1. ``docker.io`` from apt (root only) when there is no ``dockerd``;
2. a plain ``dockerd`` when no daemon answers: data root, pidfile and log under
   ``<cache>/docker/``, socket at the default path; ``stop_daemon`` stops it only when we started it;
3. the base image: ``$TXCHAOS_DOCKER_BASE`` when set, else the official ``debian:bookworm-slim``
   when the daemon can pull it, else ``txchaos/base:bookworm`` made without any registry:
   ``debootstrap --variant=minbase bookworm`` from the mirror apt already uses, then ``docker import``;
4. Compose v2 built from the Go module proxy at ``COMPOSE_VERSION`` (``go install`` refuses the
   module because of its exclude directives; ``go build ./cmd`` in a copy of the module works),
   installed as ``~/.docker/cli-plugins/docker-compose``;
5. the service images (``docker_images.build_images``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from harness import procfs
from harness.errors import ConfigError, StackError
from harness.paths import cache_root
from harness.stack import docker_images, go_builds
from harness.stack.docker_project import compose_v2, docker_available

COMPOSE_MODULE = "github.com/docker/compose/v2"
COMPOSE_VERSION = "v2.40.3"
SOCKET = "/var/run/docker.sock"
DEFAULT_BASE = docker_images.DEFAULT_BASE
LOCAL_BASE = docker_images.LOCAL_BASE
Say = Callable[[str], None]


def engine_dir() -> Path:
    return cache_root() / "docker"


def plugin_path() -> Path:
    return Path.home() / ".docker" / "cli-plugins" / "docker-compose"


def _say(text: str) -> None:
    sys.stderr.write(f"txchaos install: {text}\n")
    sys.stderr.flush()


def _run(
    cmd: list[str],
    what: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: IO[bytes] | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=1800, check=False, env=env, cwd=cwd, stdin=stdin
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"{what} failed: {exc}", hint=f"run it by hand: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        raise StackError(
            f"{what} failed (exit {proc.returncode})",
            hint=f"run it by hand: {' '.join(cmd)}",
            log_tail="\n".join((proc.stdout + proc.stderr).splitlines()[-20:]),
        )
    return proc


def _apt(*packages: str, say: Say) -> None:
    if os.geteuid() != 0:
        raise ConfigError(
            f"missing Debian package(s) {', '.join(packages)}",
            hint=f"run `sudo apt-get install -y {' '.join(packages)}`, then `txchaos install --docker` again",
        )
    say(f"installing {', '.join(packages)} from apt...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update", "-q"], "apt-get update", env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], "apt-get install", env=env)


def ensure_package(say: Say = _say) -> None:
    """Install Debian's ``docker.io`` when neither a daemon answers nor ``dockerd`` is installed."""
    if shutil.which("dockerd") is None and not docker_available():
        _apt("docker.io", say=say)


def ensure_daemon(say: Say = _say, timeout_s: float = 30) -> bool:
    """Start a plain ``dockerd`` unless a daemon answers; return True when this call started it."""
    if docker_available():
        return False
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise ConfigError("no Docker daemon answers and there is no `dockerd`", hint="run `txchaos install --docker`")
    root = engine_dir()
    root.mkdir(parents=True, exist_ok=True)
    say(f"starting dockerd (data root {root / 'data'}, log {root / 'dockerd.log'})...")
    cmd = [
        dockerd,
        "--data-root",
        str(root / "data"),
        "--pidfile",
        str(root / "dockerd.pid"),
        "--host",
        f"unix://{SOCKET}",
    ]
    with (root / "dockerd.log").open("ab") as log:
        # Its own session: the daemon outlives this process (a test session, `txchaos install`).
        subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not docker_available():
        if time.monotonic() > deadline:
            tail = "\n".join((root / "dockerd.log").read_text(errors="replace").splitlines()[-20:])
            raise StackError("dockerd did not answer within 30 s", hint=f"read {root / 'dockerd.log'}", log_tail=tail)
        time.sleep(0.2)
    return True


def stop_daemon(timeout_s: float = 30) -> bool:
    """Stop the ``dockerd`` ``ensure_daemon`` started (its pidfile under the cache); return True if one ran."""
    pidfile = engine_dir() / "dockerd.pid"
    text = pidfile.read_text().strip() if pidfile.is_file() else ""
    if not text.isdigit():
        return False
    pid = int(text)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _ended(pid):
            return True
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return True


def _ended(pid: int) -> bool:
    """Tell whether process ``pid`` has exited: gone, or a zombie (reaped here when it is our child).

    A signal 0 reaches a zombie too: a dockerd this process started stayed one after its exit, and
    stopping it waited the whole timeout every time (30 s of each docker test module).
    """
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass  # not our child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return procfs.state(pid) == "Z"


def apt_mirror(sources: tuple[Path, ...] | None = None) -> str:
    """Return the Debian mirror apt uses for bookworm's main archive, read from its source lists."""
    paths = sources or (Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*")))
    for path in paths:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"(?m)^(\w[\w-]*):\s*(.*)$", stanza))
                if "bookworm" in fields.get("Suites", "").split() and fields.get("URIs"):
                    return str(fields["URIs"]).split()[0]
        else:
            for match in re.finditer(r"(?m)^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", text):
                return match.group(1)
    raise ConfigError(
        "no Debian bookworm mirror in apt's source lists",
        hint=f"set ${docker_images.BASE_ENV} to a Debian bookworm image the daemon holds",
    )


def ensure_base(say: Say = _say) -> str:
    """Return the base image for the Dockerfiles, making ``txchaos/base:bookworm`` when no registry answers."""
    chosen = os.environ.get(docker_images.BASE_ENV)
    if chosen:
        if not docker_images.has_image(chosen):
            _run(["docker", "pull", chosen], f"pulling ${docker_images.BASE_ENV}={chosen}")
        return chosen
    for ref in (LOCAL_BASE, DEFAULT_BASE):
        if docker_images.has_image(ref):
            return ref
    pulled = subprocess.run(["docker", "pull", DEFAULT_BASE], capture_output=True, text=True, timeout=600, check=False)
    if pulled.returncode == 0:
        return DEFAULT_BASE
    say(f"no registry answers ({pulled.stderr.strip()[:80]}): making {LOCAL_BASE} with debootstrap...")
    if shutil.which("debootstrap") is None:
        _apt("debootstrap", say=say)
    with tempfile.TemporaryDirectory(prefix="txchaos-rootfs-", dir=engine_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), apt_mirror()], "debootstrap")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        _run(["docker", "import", "-c", 'CMD ["/bin/bash"]', "-", LOCAL_BASE], "docker import", stdin=tar.stdout)
        tar.wait()
    return LOCAL_BASE


def ensure_compose(say: Say = _say) -> str:
    """Return Compose v2's version, building it from the Go module proxy once when it is missing."""
    have = compose_v2()
    if have is not None:
        return have
    go = shutil.which("go")
    if go is None:
        raise ConfigError("Compose v2 is missing and there is no `go` to build it", hint="install Go 1.24+")
    say(f"building Compose {COMPOSE_VERSION} from the Go module proxy (minutes, once)...")
    env = go_builds.go_env()
    out = _run([go, "mod", "download", "-json", f"{COMPOSE_MODULE}@{COMPOSE_VERSION}"], "go mod download", env=env)
    module_dir = Path(json.loads(out.stdout)["Dir"])
    dest = plugin_path()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="txchaos-compose-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(module_dir, src)
        for path in [src, *src.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        stamp = f"-w -s -X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}"
        _run(
            [go, "build", "-trimpath", "-ldflags", stamp, "-o", str(partial), "./cmd"],
            "building Compose",
            env=env,
            cwd=src,
        )
    partial.chmod(0o755)
    partial.rename(dest)
    version = compose_v2()
    if version is None:
        raise StackError(
            f"Compose built at {dest} but `docker compose version` does not answer", hint="read its output"
        )
    return version


def ensure_engine(say: Say = _say, *, images: bool = True) -> bool:
    """Run every step of the module docstring; return True when this call started the daemon."""
    ensure_package(say)
    started = ensure_daemon(say)
    ensure_compose(say)
    base = ensure_base(say)
    if images:
        docker_images.build_images(say=say, base=base)
    return started
