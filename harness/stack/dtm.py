"""The DTM server's configuration: ``fixtures/dtm/dtm.yml`` checked, plus the ports a stack gives it.

Both providers read the same file; only the local provider appends ports (free loopback ones).
The checks mirror what DTM v1.19.0 itself refuses at start, so a bad edit fails before anything
runs, with a message that names the key, instead of as a dead process with a log line.

DTM v1.19.0 has no setting for its listen address: the install builds it with both listeners on
127.0.0.1 (``go_builds.dtm_loopback_source``), so the stack's DTM is reached only through its proxy.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness import resources
from harness.errors import ConfigError

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
