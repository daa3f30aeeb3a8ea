"""Install what the local stack needs, idempotently, into a cache under the user's home.

Standard library only: ``./txchaos`` runs this file before the project's virtualenv exists.

- the project's virtualenv (``<repo>/.venv``), refreshed when pyproject.toml changes;
- Java 17+ (checked), Postgres server binaries (Debian package, installed when root);
- ActiveMQ Classic and Kafka jars resolved by Maven from the pinned POMs in ``fixtures/jars``;
- the Toxiproxy server built with ``go install`` at a pinned tag;
- the DTM server built with ``go build`` at a pinned release (Go caches kept under the cache);
- the Allure command line from the npm registry, for offline HTML reports.

Each missing tool gives one line: what is missing and how to get it.

Run as a script, this file's folder is ``sys.path[0]``: no module beside it may share a name
with a standard library module (``tests/unit/test_architecture.py`` checks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
TOXIPROXY_VERSION = "v2.12.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
DTM_VERSION = "v1.19.0"
DTM_MODULE = "github.com/dtm-labs/dtm"
JAVA_MIN = 17


class BootstrapError(Exception):
    """A tool is missing or failed to install; the message says how to get it."""


def cache_root() -> Path:
    """Return the cache directory: ``$TXCHAOS_CACHE`` or ``~/.cache/txchaos``."""
    return Path(os.environ.get("TXCHAOS_CACHE") or Path.home() / ".cache" / "txchaos")


@dataclass(frozen=True)
class Tools:
    """Where the installed server binaries are; written to ``<cache>/tools.json``."""

    java: str
    postgres_bin: str
    activemq_lib: str
    kafka_lib: str
    toxiproxy: str
    allure: str | None
    # Defaulted so a tools.json written before DTM joined the stack still loads (load_tools says rebuild).
    dtm: str = ""


def _run(cmd: list[str], *, what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BootstrapError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def _say(text: str) -> None:
    """Print a progress line before a step that does real work (minutes on a fresh machine)."""
    print(f"txchaos bootstrap: {text}", file=sys.stderr, flush=True)


def _is_root() -> bool:
    return os.geteuid() == 0


def _apt_install(package: str) -> None:
    if not _is_root():
        raise BootstrapError(f"missing Debian package {package}: run `sudo apt-get install -y {package}`")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _say(f"installing the Debian package {package}...")
    _run(["apt-get", "update", "-q"], what="apt-get update", env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], what=f"installing {package}", env=env)


def _need(cmd: str, how: str) -> str:
    found = shutil.which(cmd)
    if not found:
        raise BootstrapError(f"missing `{cmd}`: {how}")
    return found


def ensure_java() -> str:
    """Return the java executable after checking it is version 17 or newer."""
    java = _need("java", "install a JDK 17+ (Debian: `apt-get install -y openjdk-17-jre-headless`)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < JAVA_MIN:
        raise BootstrapError(f"java is too old ({out.splitlines()[0] if out else 'unknown'}): install JDK 17+")
    return java


def ensure_postgres() -> str:
    """Return the Postgres server bin directory, installing the Debian package if missing."""

    def find() -> Path | None:
        candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
        return candidates[-1].parent if candidates else None

    found = find()
    if found is None:
        _apt_install("postgresql")
        found = find()
    if found is None:
        raise BootstrapError("postgres server binaries not found under /usr/lib/postgresql after install")
    return str(found)


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def ensure_jars(name: str) -> str:
    """Return a directory holding the runtime jars resolved from ``fixtures/jars/<name>/pom.xml``."""
    pom = REPO / "fixtures" / "jars" / name / "pom.xml"
    dest = cache_root() / "jars" / f"{name}-{_digest(pom)}"
    if (dest / ".complete").exists():
        return str(dest)
    if not shutil.which("mvn"):
        _apt_install("maven")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    _say(f"resolving the {name} jars with Maven (once, about a minute)...")
    _run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(pom),
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ],
        what=f"resolving {name} jars with Maven",
    )
    (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return str(dest)


def ensure_toxiproxy() -> str:
    """Return the Toxiproxy server binary, built with ``go install`` at the pinned tag."""
    dest = cache_root() / "bin" / f"toxiproxy-server-{TOXIPROXY_VERSION}"
    if dest.exists():
        return str(dest)
    go = _need("go", "install Go 1.22+ (https://go.dev/doc/install); toxiproxy is built with `go install`")
    gobin = dest.parent / "gobin.partial"
    shutil.rmtree(gobin, ignore_errors=True)
    gobin.mkdir(parents=True)
    env = dict(os.environ, GOBIN=str(gobin), CGO_ENABLED="0")
    _say(f"building toxiproxy {TOXIPROXY_VERSION} with go install (once, about a minute)...")
    _run([go, "install", f"{TOXIPROXY_MODULE}@{TOXIPROXY_VERSION}"], what="building toxiproxy", env=env)
    (gobin / "server").rename(dest)
    shutil.rmtree(gobin, ignore_errors=True)
    return str(dest)


def _go_env() -> dict[str, str]:
    """Return an environment whose Go module and build caches live under the txchaos cache."""
    root = cache_root() / "go"
    return dict(
        os.environ,
        GOPATH=str(root),
        GOMODCACHE=str(root / "mod"),
        GOCACHE=str(root / "build"),
        CGO_ENABLED="0",
        # Writable module files, so `rm -rf` of the cache works without a chmod first.
        GOFLAGS=" ".join([*os.environ.get("GOFLAGS", "").split(), "-modcacherw"]),
    )


def ensure_dtm() -> str:
    """Return the DTM server binary, built once at the pinned release.

    ``go install module@version`` needs the proxy's version list, which some mirrors refuse; a
    throwaway module that requires the pinned version and builds its main package does not.
    """
    dest = cache_root() / "bin" / f"dtm-{DTM_VERSION}"
    if dest.exists():
        return str(dest)
    go = _need("go", "install Go 1.22+ (https://go.dev/doc/install); the DTM server is built from source")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    env = _go_env()
    _say(f"building the DTM server {DTM_VERSION} once (about 6 minutes on 2 cores)...")
    with tempfile.TemporaryDirectory(prefix="txchaos-dtm-build-") as tmp:
        work = Path(tmp)
        _run([go, "mod", "init", "dtmbuild"], what="preparing the DTM build", env=env, cwd=work)
        _run([go, "get", f"{DTM_MODULE}@{DTM_VERSION}"], what="fetching the DTM sources", env=env, cwd=work)
        # The version stamp the release images carry, so /api/dtmsvr/version names the pin.
        stamp = f"-X main.Version={DTM_VERSION}"
        build = [go, "build", "-ldflags", stamp, "-o", str(partial), DTM_MODULE]
        _run(build, what="building the DTM server", env=env, cwd=work)
    partial.rename(dest)
    return str(dest)


def ensure_allure() -> str | None:
    """Return the Allure command line, or None (with a warning) when npm is missing."""
    sys.path.insert(0, str(REPO))
    try:
        from harness.reporting.allure_cli import ensure_allure as install
    except ImportError:  # reporting not present in this checkout
        return None
    finally:
        sys.path.pop(0)
    if not shutil.which("npm"):
        print("txchaos bootstrap: npm missing, HTML reports off (Debian: `apt-get install -y npm`)", file=sys.stderr)
        return None
    return str(install(cache_root()))


def ensure_venv(repo: Path) -> Path:
    """Return ``<repo>/.venv``, creating it and installing the project when pyproject.toml changed."""
    venv = repo / ".venv"
    stamp = venv / ".txchaos-stamp"
    want = _digest(repo / "pyproject.toml") + ":" + str(repo)
    if stamp.exists() and stamp.read_text() == want and (venv / "bin" / "txchaos").exists():
        return venv
    if not (venv / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(venv)], what="creating the virtualenv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _say(f"installing the project and its dependencies into {venv} (pyspark is large: a few minutes once)...")
    _run([*pip, "-e", f"{repo}[dev]"], what="installing the project into .venv")
    stamp.write_text(want)
    return venv


def ensure_spark_archive(venv: Path) -> str | None:
    """Return the Spark driver's class-data archive, recording it once per virtualenv (~30 s once).

    Without it every verification's JVM loads and verifies Spark's classes from the jars again
    (measured: JVM start 3.7 s -> 2.1 s with it). A failure only costs that speed: warn, go on.
    """
    stamp = venv / ".txchaos-spark-archive"
    if stamp.exists() and Path(stamp.read_text()).is_file():
        return stamp.read_text()
    _say("recording the Spark driver's class-data archive (once, about 30 s)...")
    code = "from harness.verify.spark import build_class_archive as b; print(b() or '')"
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    archive = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not archive:
        print("txchaos bootstrap: no Spark class-data archive (verification starts slower)", file=sys.stderr)
        return None
    stamp.write_text(archive)
    return archive


def ensure_all(repo: Path, *, with_venv: bool = True) -> Tools:
    """Install everything, print one line per component, and record the tool paths."""
    steps: list[tuple[str, object]] = []
    started = time.monotonic()
    if with_venv:
        venv = ensure_venv(repo)
        steps += [("venv", venv), ("spark archive", ensure_spark_archive(venv))]
    tools = Tools(
        java=ensure_java(),
        postgres_bin=ensure_postgres(),
        activemq_lib=ensure_jars("activemq"),
        kafka_lib=ensure_jars("kafka"),
        toxiproxy=ensure_toxiproxy(),
        allure=ensure_allure(),
        dtm=ensure_dtm(),
    )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    (root / "tools.json").write_text(json.dumps(asdict(tools), indent=2))
    for key, value in [*steps, *asdict(tools).items()]:
        if os.environ.get("TXCHAOS_BOOTSTRAP_VERBOSE"):
            print(f"txchaos bootstrap: {key:<13} {value}", file=sys.stderr)
    took = time.monotonic() - started
    if took > 5:
        print(f"txchaos bootstrap: ready in {took:.0f}s (cache {root})", file=sys.stderr)
    return tools


def load_tools() -> Tools:
    """Return the tools recorded by the last bootstrap; raise BootstrapError when there is none."""
    path = cache_root() / "tools.json"
    if not path.exists():
        raise BootstrapError(f"no {path}: run `./txchaos` from the repository once, or `python3 {__file__}`")
    tools = Tools(**json.loads(path.read_text()))
    if not tools.dtm:
        raise BootstrapError(f"{path} predates the DTM server: run `./txchaos` (or this bootstrap) again")
    for value in (tools.java, tools.postgres_bin, tools.activemq_lib, tools.kafka_lib, tools.toxiproxy, tools.dtm):
        if not Path(value).exists():
            raise BootstrapError(f"{value} is gone: run `./txchaos` (or this bootstrap) again to reinstall")
    return tools


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - runs under whatever python3 the machine has
        print(f"txchaos bootstrap: Python {sys.version.split()[0]} is too old: install Python 3.11+", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--no-venv", action="store_true", help="only the services' tools")
    args = parser.parse_args(argv)
    try:
        ensure_all(args.repo.resolve(), with_venv=not args.no_venv)
    except BootstrapError as exc:
        print(f"txchaos bootstrap: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
