"""The stack's two Go programs, built from source into the cache: Toxiproxy with the traps (``trapd``) and DTM.

Go's module and build caches live under the txchaos cache too (``go_env``). Standard library
only: the bootstrap runs before the project's virtualenv exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from harness.paths import cache_root
from harness.stack.cache_manifest import intact, record
from harness.stack.install_shell import INSTALL, BootstrapError, need, run, say

TOXIPROXY_VERSION = "v2.12.0"
TRAPD_SOURCE = Path(__file__).resolve().parent.parent / "traps" / "trapd"
DTM_VERSION = "v1.19.0"
DTM_MODULE = "github.com/dtm-labs/dtm"


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

    ``trapd`` is Toxiproxy's server built as a library (the pinned release in ``trapd/go.mod``) with
    the wire-level traps inside it, so a trap costs no second hop (docs/traps.md, "Cost").
    """
    dest = trapd_path()
    if intact("toxiproxy", dest, dest, verify=verify):
        return str(dest)
    go = need("go", "install Go 1.23+ (https://go.dev/doc/install); Toxiproxy with the traps is built with it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / "trapd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs that start at once build it once
        if not dest.exists():
            with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
                for path in trapd_sources():
                    shutil.copy(path, tmp)
                say("building Toxiproxy with the trap relay (trapd) with go build, once per version...")
                env = {**go_env(), "GOTOOLCHAIN": "local"}
                run([go, "build", "-trimpath", "-o", "trapd", "."], what="building trapd", env=env, cwd=Path(tmp))
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
    if intact("dtm", dest, dest, verify=verify):
        return str(dest)
    go = need("go", "install Go 1.22+ (https://go.dev/doc/install); the DTM server is built from source")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    env = go_env()
    say(f"building the DTM server {DTM_VERSION} once (about 6 minutes on 2 cores)...")
    with tempfile.TemporaryDirectory(prefix="txchaos-dtm-build-") as tmp:
        work = Path(tmp)
        run([go, "mod", "init", "dtmbuild"], what="preparing the DTM build", env=env, cwd=work)
        run([go, "get", f"{DTM_MODULE}@{DTM_VERSION}"], what="fetching the DTM sources", env=env, cwd=work)
        source = work / "dtm"
        shutil.copytree(Path(env["GOMODCACHE"]) / f"{DTM_MODULE}@{DTM_VERSION}", source)
        for path in source.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)  # module cache files may be read-only
        svr = source / "dtmsvr" / "svr.go"
        svr.write_text(dtm_loopback_source(svr.read_text()))
        replace = f"-replace={DTM_MODULE}={source}"
        run([go, "mod", "edit", replace], what="pointing the DTM build at the edited copy", env=env, cwd=work)
        # The version stamp the release images carry, so /api/dtmsvr/version names the pin.
        stamp = f"-X main.Version={DTM_VERSION}"
        build = [go, "build", "-ldflags", stamp, "-o", str(partial), DTM_MODULE]
        run(build, what="building the DTM server", env=env, cwd=work)
    partial.rename(dest)
    record("dtm", dest)
    return str(dest)
