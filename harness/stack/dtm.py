"""The DTM server's configuration: ``fixtures/dtm/dtm.yml`` checked, plus the ports a stack gives it.

Both providers read the same file; only the local provider appends ports (free loopback ones).
The checks mirror what DTM v1.19.0 itself refuses at start, so a bad edit fails before anything
runs, with a message that names the key, instead of as a dead process with a log line.

DTM v1.19.0 has no setting for its listen address: ``dtmsvr/svr.go`` listens on ``":<port>"``,
every interface, for HTTP and gRPC alike, unauthenticated and around Toxiproxy. The local
provider therefore runs a build whose two listen addresses name 127.0.0.1
(``loopback_binary``): the pinned sources from the Go module cache, with that one file replaced
in a copy of the module built in its place (the cache itself is never edited).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import resources
from harness.errors import ConfigError, StackError
from harness.stack import bootstrap

CONFIG = resources.fixture("dtm", "dtm.yml")
STACK_KEYS = ("HttpPort", "GrpcPort")  # the stack owns these
MIN_RETRY_INTERVAL_S = 10  # DTM v1.19.0 exits at start below this
STORE_DRIVER = "boltdb"  # the stack runs no database for DTM

_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z][A-Za-z0-9]*):\s*(?P<value>.*)$")


def read_keys(text: str) -> dict[str, str]:
    """Return the file's scalar keys, nested ones as ``Parent.Key`` (a flat subset of YAML).

    >>> read_keys("Store:\\n  Driver: boltdb  # embedded\\nRetryInterval: 10\\n")
    {'Store': '', 'Store.Driver': 'boltdb', 'RetryInterval': '10'}
    """
    keys: dict[str, str] = {}
    parent = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        match = _LINE.match(line)
        if not match:
            continue
        key, value = match["key"], match["value"].strip().strip("'\"")
        if match["indent"]:
            keys[f"{parent}.{key}"] = value
        else:
            parent = key
            keys[key] = value
    return keys


def config_errors(text: str) -> list[str]:
    """Return what is wrong with a DTM config text for this stack; [] when it is fine."""
    keys = read_keys(text)
    errors = [f"sets {k}: the stack chooses DTM's ports, remove the line" for k in STACK_KEYS if k in keys]
    driver = keys.get("Store.Driver", STORE_DRIVER)
    if driver != STORE_DRIVER:
        errors.append(f"Store.Driver is {driver!r}: the stack runs DTM on its embedded store, use {STORE_DRIVER!r}")
    numbers: dict[str, int] = {}
    for key, default in (("RetryInterval", 10), ("TimeoutToFail", 35), ("TransCronInterval", 3)):
        value = keys.get(key, str(default))
        if not value.isdigit():
            errors.append(f"{key} is {value!r}: give whole seconds")
        numbers[key] = int(value) if value.isdigit() else default
    if numbers["RetryInterval"] < MIN_RETRY_INTERVAL_S:
        errors.append(
            f"RetryInterval is {numbers['RetryInterval']}: DTM refuses less than {MIN_RETRY_INTERVAL_S}; "
            "for a quicker check-back set the per-message options retry_interval and timeout_to_fail"
        )
    if numbers["TimeoutToFail"] < numbers["RetryInterval"]:
        errors.append(
            f"TimeoutToFail ({numbers['TimeoutToFail']}) is below RetryInterval ({numbers['RetryInterval']}): "
            "DTM refuses that"
        )
    return errors


def render(text: str, *, http_port: int, grpc_port: int, source: Path = CONFIG) -> str:
    """Return the config text with this stack's ports; raise ConfigError when the text is wrong."""
    errors = config_errors(text)
    if errors:
        raise ConfigError(f"{source}: " + "; ".join(errors), hint=f"fix {source} (the comments there explain each key)")
    return f"{text.rstrip()}\n\n# Added by the local stack provider.\nHttpPort: {http_port}\nGrpcPort: {grpc_port}\n"


# The two listen calls of DTM v1.19.0's dtmsvr/svr.go, and the address they get instead.
LISTEN_CALLS = ('fmt.Sprintf(":%d", conf.HTTPPort)', 'fmt.Sprintf(":%d", conf.GrpcPort)')
LOOPBACK = "127.0.0.1"


def loopback_source(text: str) -> str:
    """Return svr.go's text with both listeners on 127.0.0.1; raise StackError when a call is not there once.

    >>> loopback_source('a(fmt.Sprintf(":%d", conf.HTTPPort)); b(fmt.Sprintf(":%d", conf.GrpcPort))')
    'a(fmt.Sprintf("127.0.0.1:%d", conf.HTTPPort)); b(fmt.Sprintf("127.0.0.1:%d", conf.GrpcPort))'
    """
    for call in LISTEN_CALLS:
        if text.count(call) != 1:
            raise StackError(
                f"DTM's svr.go has {text.count(call)} copies of `{call}`, expected 1",
                hint=f"the loopback build knows DTM {bootstrap.DTM_VERSION} only: run `txchaos install` at that pin",
            )
        text = text.replace(call, call.replace('":%d"', f'"{LOOPBACK}:%d"'))
    return text


def loopback_binary(release_binary: str) -> str:
    """Return the DTM server built to listen on 127.0.0.1 only, building it beside ``release_binary`` once.

    The build copies the pinned module out of the Go module cache (Go refuses to build edited
    files inside it), edits svr.go there and builds it in place of the module (a ``replace``),
    offline, from the module and build caches the bootstrap filled: about a minute on 2 cores.
    """
    dest = Path(release_binary).with_name(Path(release_binary).name + "-loopback")
    if dest.exists():
        return str(dest)
    go = shutil.which("go")
    env = dict(bootstrap._go_env(), GOPROXY="off", GOSUMDB="off", GOFLAGS="-modcacherw -mod=mod")
    module_dir = Path(env["GOMODCACHE"]) / f"{bootstrap.DTM_MODULE}@{bootstrap.DTM_VERSION}"
    if go is None or not (module_dir / "dtmsvr" / "svr.go").exists():
        raise StackError(
            f"cannot build the loopback DTM server: {'no `go`' if go is None else f'no DTM sources in {module_dir}'}",
            hint="run `txchaos install` once more: it installs Go and the DTM sources",
        )
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")  # two stacks starting at once each build
    with tempfile.TemporaryDirectory(prefix="txchaos-dtm-loopback-") as tmp:
        work = Path(tmp)
        source = work / "dtm"
        shutil.copytree(module_dir, source, ignore=shutil.ignore_patterns("test", "*_test.go"))
        for path in source.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)  # module cache files may be read-only
        svr = source / "dtmsvr" / "svr.go"
        svr.write_text(loopback_source(svr.read_text()))
        stamp = f"-X main.Version={bootstrap.DTM_VERSION}"
        replace = f"-replace={bootstrap.DTM_MODULE}={source}"
        for cmd in (
            [go, "mod", "init", "dtmbuild"],
            [go, "mod", "edit", f"-require={bootstrap.DTM_MODULE}@{bootstrap.DTM_VERSION}", replace],
            [go, "build", "-ldflags", stamp, "-o", str(partial), bootstrap.DTM_MODULE],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, check=False)
            if proc.returncode != 0:
                raise StackError(
                    f"building the loopback DTM server failed: {' '.join(cmd[:3])}",
                    hint="run `txchaos install` once more (it refills the Go caches), then start again",
                    log_tail=proc.stdout + proc.stderr,
                )
    partial.rename(dest)
    return str(dest)
