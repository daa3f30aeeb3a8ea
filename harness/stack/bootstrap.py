"""Install what the local stack needs, idempotently, into a cache under the user's home.

Standard library only: ``./txchaos`` runs this file before the project's virtualenv exists, and
``txchaos install`` (the installed package, no checkout) calls ``install`` for the same services.

- the project's virtualenv (``<repo>/.venv``), refreshed when pyproject.toml changes;
- Java 17+ (checked), Postgres server binaries (Debian package, installed when root);
- ActiveMQ Classic and Kafka jars resolved by Maven from the pinned POMs in ``fixtures/jars``;
- Toxiproxy's server with the trap toxics (``trapd``, ``harness/traps/relay``) built with ``go build``;
- the DTM server built with ``go build`` at a pinned release (Go caches kept under the cache);
- the Allure command line from the npm registry, for offline HTML reports.

Each missing tool gives one line: what is missing and how to get it. The cache's integrity is
recorded in ``<cache>/manifest.json`` (size and sha256 of every installed file): ``load_tools``
checks presence and sizes before every stack start, ``txchaos install --verify`` the hashes, and
``txchaos install`` reinstalls just the damaged component.

Run as a script, this file's folder is ``sys.path[0]``: no module beside it may share a name
with a standard library module (``tests/unit/test_architecture.py`` checks).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if not __package__:
    # Run as a script from a checkout (developer-only): make the stdlib-only `harness` modules
    # (harness.resources, harness.reporting.allure_cli) importable before the virtualenv exists.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.paths import cache_root  # after the path above, when run as a script

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
TOXIPROXY_VERSION = "v2.12.0"
TRAPD_SOURCE = Path(__file__).resolve().parent.parent / "traps" / "relay"
DTM_VERSION = "v1.19.0"
DTM_MODULE = "github.com/dtm-labs/dtm"
JAVA_MIN = 17


INSTALL = "`txchaos install`"
MANIFEST_VERSION = 1


class BootstrapError(Exception):
    """A tool is missing or failed to install, or the cache is damaged; the message says how to fix it."""


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


_PREFIX = ["txchaos bootstrap"]  # `txchaos install` says "txchaos install"
_SAID = [0]  # progress lines printed: none during an install means everything was in place


def say(text: str) -> None:
    """Print a progress line before a step that does real work (minutes on a fresh machine)."""
    _SAID[0] += 1
    print(f"{_PREFIX[0]}: {text}", file=sys.stderr, flush=True)


def _is_root() -> bool:
    return os.geteuid() == 0


def _apt_install(package: str) -> None:
    if not _is_root():
        raise BootstrapError(
            f"missing Debian package {package}: run `sudo apt-get install -y {package}`, then {INSTALL}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    say(f"installing the Debian package {package}...")
    _run(["apt-get", "update", "-q"], what="apt-get update", env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], what=f"installing {package}", env=env)


def _need(cmd: str, how: str) -> str:
    found = shutil.which(cmd)
    if not found:
        raise BootstrapError(f"missing `{cmd}`: {how}; then run {INSTALL} again")
    return found


def ensure_java() -> str:
    """Return the java executable after checking it is version 17 or newer."""
    java = _need("java", "install a JDK 17+ (Debian: `apt-get install -y openjdk-17-jre-headless`)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < JAVA_MIN:
        found = out.splitlines()[0] if out else "unknown"
        raise BootstrapError(f"java is too old ({found}): install JDK 17+, then run {INSTALL} again")
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
        raise BootstrapError(
            f"postgres server binaries not found under /usr/lib/postgresql after installing the Debian package "
            f"postgresql: install it by hand, then run {INSTALL} again"
        )
    return str(found)


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def ensure_browser() -> str | None:
    """Return a headless-capable Chromium for the report's browser test, installing Debian's when root.

    Only the checkout's test suite needs it (``./txchaos test``: ``--browser``); without root and
    without a browser the test skips, saying so, and nothing else is affected.
    """
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found:
        return found
    if not _is_root():
        print(
            f"{_PREFIX[0]}: no chromium, the report's browser test will skip (run `sudo apt-get install -y chromium`)",
            file=sys.stderr,
        )
        return None
    _apt_install("chromium")
    return shutil.which("chromium")


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


# -- the cache's integrity manifest ---------------------------------------------------------------
# A file gone from the cache (a jar deleted by a cleaner, a truncated binary) used to surface as a
# Java "Transport scheme NOT recognized" in a broker log. The manifest names the damaged file.

# What a stack start needs (Allure only makes reports: `txchaos install` checks it, a start does not).
REQUIRED = ("activemq jars", "kafka jars", "toxiproxy", "dtm")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files_of(target: Path) -> list[Path]:
    if target.is_file():
        return [target]
    return sorted(p for p in target.rglob("*") if p.is_file() and not p.is_symlink())


@contextlib.contextmanager
def _manifest_lock() -> Iterator[None]:
    """Hold the cache's manifest lock: parallel sessions may record components at the same time."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".manifest.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_manifest() -> dict[str, dict[str, object]] | None:
    """Return the manifest's components (name -> {"root", "files"}), or None when there is no manifest."""
    path = cache_root() / "manifest.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        components: dict[str, dict[str, object]] = data["components"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # unreadable: every component counts as unrecorded, so `txchaos install` records it again
    return components


def record(component: str, target: Path) -> None:
    """Record the size and sha256 of every file of ``target`` (a folder or a file under the cache)."""
    root = cache_root()
    files = {str(p.relative_to(root)): [p.stat().st_size, _sha256(p)] for p in _files_of(target)}
    with _manifest_lock():
        components = read_manifest() or {}
        components[component] = {"root": str(target.relative_to(root)), "files": files}
        path = root / "manifest.json"
        partial = path.with_name(f"manifest.json.{os.getpid()}")
        partial.write_text(json.dumps({"version": MANIFEST_VERSION, "components": components}, indent=1))
        partial.replace(path)


def damage(entry: dict[str, object], *, full: bool) -> str | None:
    """Return what is wrong with a recorded component ("<file> missing" / "<file> changed"), or None.

    Without ``full`` only presence and sizes are checked (a stat per file, about a millisecond);
    ``full`` hashes every file again.
    """
    root = cache_root()
    files = entry.get("files")
    if not isinstance(files, dict) or not files:
        return f"{entry.get('root', '?')} has no recorded files"
    for rel, (size, digest) in files.items():
        path = root / rel
        if not path.is_file():
            return f"{rel} missing"
        if path.stat().st_size != size or (full and _sha256(path) != digest):
            return f"{rel} changed"
    return None


def _damaged(problem: str) -> BootstrapError:
    return BootstrapError(f"the txchaos cache at {cache_root()} is damaged ({problem}): run {INSTALL} to reinstall")


def verify_cache(*, full: bool = False, components: tuple[str, ...] = REQUIRED) -> None:
    """Raise BootstrapError naming the first missing or changed file of ``components``."""
    recorded = read_manifest()
    if recorded is None:
        raise BootstrapError(
            f"the txchaos cache at {cache_root()} has no manifest.json (installed by an older txchaos): "
            f"run {INSTALL} to check and record it"
        )
    for component in components:
        entry = recorded.get(component)
        problem = f"{component} not recorded" if entry is None else damage(entry, full=full)
        if problem:
            raise _damaged(problem)


def _intact(component: str, target: Path, done: Path, *, verify: bool) -> bool:
    """Return True when ``target`` is installed (``done`` exists) and matches the manifest.

    An install that predates the manifest is recorded as it is. A damaged one is removed, so the
    caller installs it again: only that component, the rest of the cache stays.
    """
    if not done.exists():
        return False
    entry = (read_manifest() or {}).get(component)
    if entry is None or entry.get("root") != str(target.relative_to(cache_root())):
        say(f"recording the checksums of the installed {component}...")
        record(component, target)
        return True
    problem = damage(entry, full=verify)
    if problem is None:
        return True
    say(f"{component} damaged in the cache ({problem}): reinstalling only that")
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    return False


def ensure_jars(name: str, *, verify: bool = False) -> str:
    """Return a directory holding the runtime jars resolved from the shipped ``fixtures/jars/<name>/pom.xml``."""
    from harness import resources

    pom = resources.fixture("jars", name, "pom.xml")
    dest = cache_root() / "jars" / f"{name}-{_digest(pom)}"
    if _intact(f"{name} jars", dest, dest / ".complete", verify=verify):
        return str(dest)
    if not shutil.which("mvn"):
        _apt_install("maven")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    say(f"resolving the {name} jars with Maven (once, about a minute)...")
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
    record(f"{name} jars", dest)
    return str(dest)


def trapd_sources() -> list[Path]:
    """Return the files ``trapd`` is built from: its module files and its Go sources, tests left out."""
    return sorted(
        p
        for p in TRAPD_SOURCE.iterdir()
        if p.name in ("go.mod", "go.sum") or (p.suffix == ".go" and not p.name.endswith("_test.go"))
    )


def trapd_path() -> Path:
    """Return where the build of this package's ``trapd`` sources lives in the cache (one file per version)."""
    digest = hashlib.sha256()
    for path in trapd_sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return cache_root() / "bin" / f"trapd-{digest.hexdigest()[:16]}"


def ensure_toxiproxy(*, verify: bool = False) -> str:
    """Return the stack's Toxiproxy: its server with the trap toxics (``trapd``), built once per source version.

    ``trapd`` is Toxiproxy's server built as a library (the pinned release in ``relay/go.mod``) with
    the wire-level traps inside it, so a trap costs no second hop (docs/traps.md, "Cost").
    """
    dest = trapd_path()
    if _intact("toxiproxy", dest, dest, verify=verify):
        return str(dest)
    go = _need("go", "install Go 1.23+ (https://go.dev/doc/install); Toxiproxy with the traps is built with it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / "trapd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs that start at once build it once
        if not dest.exists():
            with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
                for path in trapd_sources():
                    shutil.copy(path, tmp)
                say("building Toxiproxy with the trap relay (trapd) with go build, once per version...")
                env = {**go_env(), "GOTOOLCHAIN": "local"}
                _run([go, "build", "-trimpath", "-o", "trapd", "."], what="building trapd", env=env, cwd=Path(tmp))
                os.replace(Path(tmp) / "trapd", dest)
    record("toxiproxy", dest)
    return str(dest)


def go_env() -> dict[str, str]:
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


# DTM v1.19.0 has no setting for its listen address: dtmsvr/svr.go listens on ":<port>", every
# interface, for HTTP and gRPC alike, unauthenticated and around Toxiproxy. The install builds it
# with these two calls naming 127.0.0.1 instead (in a copy of the module: the cache is not edited).
DTM_LISTEN_CALLS = ('fmt.Sprintf(":%d", conf.HTTPPort)', 'fmt.Sprintf(":%d", conf.GrpcPort)')
DTM_LOOPBACK = "127.0.0.1"
DTM_BINARY = f"dtm-{DTM_VERSION}-loopback"


def dtm_loopback_source(text: str) -> str:
    """Return svr.go's text with both listeners on 127.0.0.1; raise BootstrapError when a call is not there once.

    >>> dtm_loopback_source('a(fmt.Sprintf(":%d", conf.HTTPPort)); b(fmt.Sprintf(":%d", conf.GrpcPort))')
    'a(fmt.Sprintf("127.0.0.1:%d", conf.HTTPPort)); b(fmt.Sprintf("127.0.0.1:%d", conf.GrpcPort))'
    """
    for call in DTM_LISTEN_CALLS:
        if text.count(call) != 1:
            raise BootstrapError(
                f"DTM's svr.go has {text.count(call)} copies of `{call}`, expected 1: the loopback build "
                f"knows DTM {DTM_VERSION} only (run {INSTALL} at that pin)"
            )
        text = text.replace(call, call.replace('":%d"', f'"{DTM_LOOPBACK}:%d"'))
    return text


def ensure_dtm(*, verify: bool = False) -> str:
    """Return the DTM server binary, built once at the pinned release with its listeners on loopback.

    ``go install module@version`` needs the proxy's version list, which some mirrors refuse; a
    throwaway module that requires the pinned version does not. Go refuses to build edited files
    inside its module cache, so the module is copied, its svr.go edited, and built by a ``replace``.
    """
    dest = cache_root() / "bin" / DTM_BINARY
    if _intact("dtm", dest, dest, verify=verify):
        return str(dest)
    go = _need("go", "install Go 1.22+ (https://go.dev/doc/install); the DTM server is built from source")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    env = go_env()
    say(f"building the DTM server {DTM_VERSION} once (about 6 minutes on 2 cores)...")
    with tempfile.TemporaryDirectory(prefix="txchaos-dtm-build-") as tmp:
        work = Path(tmp)
        _run([go, "mod", "init", "dtmbuild"], what="preparing the DTM build", env=env, cwd=work)
        _run([go, "get", f"{DTM_MODULE}@{DTM_VERSION}"], what="fetching the DTM sources", env=env, cwd=work)
        source = work / "dtm"
        shutil.copytree(Path(env["GOMODCACHE"]) / f"{DTM_MODULE}@{DTM_VERSION}", source)
        for path in source.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)  # module cache files may be read-only
        svr = source / "dtmsvr" / "svr.go"
        svr.write_text(dtm_loopback_source(svr.read_text()))
        replace = f"-replace={DTM_MODULE}={source}"
        _run([go, "mod", "edit", replace], what="pointing the DTM build at the edited copy", env=env, cwd=work)
        # The version stamp the release images carry, so /api/dtmsvr/version names the pin.
        stamp = f"-X main.Version={DTM_VERSION}"
        build = [go, "build", "-ldflags", stamp, "-o", str(partial), DTM_MODULE]
        _run(build, what="building the DTM server", env=env, cwd=work)
    partial.rename(dest)
    record("dtm", dest)
    return str(dest)


def ensure_allure(*, verify: bool = False) -> str | None:
    """Return the Allure command line, or None (with a warning) when npm is missing."""
    from harness.reporting.allure_cli import ALLURE_VERSION, MARKER_NAME
    from harness.reporting.allure_cli import ensure_allure as install

    root = cache_root()
    target = root / f"allure-{ALLURE_VERSION}"
    if _intact("allure", target, target / MARKER_NAME, verify=verify):
        return str(install(root))  # in place: returns at once
    if not shutil.which("npm"):
        hint = f"Debian: `apt-get install -y npm`, then {INSTALL}"
        print(f"{_PREFIX[0]}: npm missing, HTML reports off ({hint})", file=sys.stderr)
        return None
    say(f"installing the Allure command line {ALLURE_VERSION} with npm (once, about a minute)...")
    exe = install(root)
    record("allure", target)
    return str(exe)


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
    say(f"installing the project and its dependencies into {venv} (pyspark is large: a few minutes once)...")
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
    say("recording the Spark driver's class-data archive (once, about 30 s)...")
    code = "from harness.verify.spark import build_class_archive as b; print(b() or '')"
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    archive = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not archive:
        print("txchaos bootstrap: no Spark class-data archive (verification starts slower)", file=sys.stderr)
        return None
    stamp.write_text(archive)
    return archive


def _current_venv() -> Path | None:
    """Return the virtualenv this Python runs in (``txchaos install`` from a pip install), if any."""
    prefix = Path(sys.prefix)
    return prefix if sys.prefix != sys.base_prefix and (prefix / "bin" / "python").exists() else None


def ensure_all(venv: Path | None = None, *, verify: bool = False, announce: bool = False) -> Tools:
    """Install every service's tools into the cache, record their paths, return them.

    ``venv``: also record the Spark class-data archive for that virtualenv. ``verify``: hash every
    installed file again (a damaged component is reinstalled). ``announce``: one line per
    component even when nothing had to be done (``txchaos install``).
    """
    started = time.monotonic()
    worked = _SAID[0]
    steps: list[tuple[str, object]] = []
    if venv is not None:
        steps.append(("spark archive", ensure_spark_archive(venv)))
    tools = Tools(
        java=ensure_java(),
        postgres_bin=ensure_postgres(),
        activemq_lib=ensure_jars("activemq", verify=verify),
        kafka_lib=ensure_jars("kafka", verify=verify),
        toxiproxy=ensure_toxiproxy(verify=verify),
        allure=ensure_allure(verify=verify),
        dtm=ensure_dtm(verify=verify),
    )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    (root / "tools.json").write_text(json.dumps(asdict(tools), indent=2))
    verbose = announce or bool(os.environ.get("TXCHAOS_BOOTSTRAP_VERBOSE"))
    for key, value in [*steps, *asdict(tools).items()]:
        if verbose:
            print(f"{_PREFIX[0]}: {key:<13} {value or '-'}", file=sys.stderr)
    took = time.monotonic() - started
    checked = "every file hashed again, " if verify else ""
    if announce and _SAID[0] == worked:
        print(f"{_PREFIX[0]}: everything is in place ({checked}cache {root}, {took:.1f}s)", file=sys.stderr)
    elif announce or took > 5:
        print(f"{_PREFIX[0]}: ready in {took:.0f}s ({checked}cache {root})", file=sys.stderr)
    return tools


def load_tools() -> Tools:
    """Return the tools recorded by the last install after checking the cache (presence and sizes).

    Raise BootstrapError, whose message says to run ``txchaos install``, when there is none or a
    file is missing or changed.
    """
    path = cache_root() / "tools.json"
    if not path.exists():
        raise BootstrapError(f"no {path}: run {INSTALL} (from a checkout, `./txchaos` runs it too)")
    tools = Tools(**json.loads(path.read_text()))
    if not tools.dtm:
        raise BootstrapError(f"{path} predates the DTM server: run {INSTALL} again")
    if tools.toxiproxy != str(trapd_path()):
        # The stack's Toxiproxy carries the traps, whose control channel this package speaks: the
        # build of this package's sources, not an older one the last install recorded.
        tools = replace(tools, toxiproxy=ensure_toxiproxy())
    for value in (tools.java, tools.postgres_bin, tools.activemq_lib, tools.kafka_lib, tools.toxiproxy, tools.dtm):
        if not Path(value).exists():
            raise BootstrapError(f"{value} is gone: run {INSTALL} to reinstall")
    verify_cache()
    return tools


def install(*, verify: bool = False) -> int:
    """Install the services into the cache for ``txchaos install``; return the exit code (2: a tool is missing)."""
    _PREFIX[0] = "txchaos install"
    try:
        ensure_all(_current_venv(), verify=verify, announce=True)
    except BootstrapError as exc:
        print(f"txchaos install: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the checkout's bootstrap (``./txchaos``): the virtualenv first, then the services."""
    if sys.version_info < (3, 11):  # noqa: UP036 - runs under whatever python3 the machine has
        print(f"txchaos bootstrap: Python {sys.version.split()[0]} is too old: install Python 3.11+", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Developer-only default: the checkout that holds this file (a wheel has no checkout to bootstrap).
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--no-venv", action="store_true", help="only the services' tools")
    parser.add_argument("--verify", action="store_true", help="hash every installed file again")
    parser.add_argument("--browser", action="store_true", help="also Chromium, for the report's browser test")
    args = parser.parse_args(argv)
    try:
        venv = None if args.no_venv else ensure_venv(args.repo.resolve())
        ensure_all(venv, verify=args.verify)
        if args.browser:
            ensure_browser()
    except BootstrapError as exc:
        print(f"txchaos bootstrap: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
