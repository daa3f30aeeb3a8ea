"""Choose a stack provider, and remember the stack ``txchaos up`` left running."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.errors import ConfigError
from harness.paths import stacks_root
from harness.stack.base import Endpoints, StackProvider

PROVIDERS = ("auto", "local", "docker")


def make_provider(name: str | None = None, *, detached: bool = False) -> StackProvider:
    """Return the provider ``name`` (default ``$TXCHAOS_PROVIDER`` or auto: docker if a daemon answers)."""
    choice = (name or os.environ.get("TXCHAOS_PROVIDER") or "auto").lower()
    if choice not in PROVIDERS:
        raise ConfigError(f"unknown stack provider {choice!r}", hint=f"use one of {', '.join(PROVIDERS)}")
    if choice == "auto":
        from harness.stack.docker import docker_available

        choice = "docker" if docker_available() else "local"
    if choice == "docker":
        from harness.stack.docker import DockerProvider, docker_available

        if not docker_available():
            raise ConfigError(
                "provider 'docker' asked for, but no Docker daemon answers",
                hint="start Docker, or use --provider local (real binaries, no containers)",
            )
        return DockerProvider()
    from harness.stack.local import LocalProvider

    return LocalProvider(detached=detached)


def current_file() -> Path:
    return stacks_root() / "current.json"


def save_current(endpoints: Endpoints) -> Path:
    path = current_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "stack_id": endpoints.stack_id,
                "provider": endpoints.provider,
                "endpoints": str(Path(endpoints.state_dir) / "endpoints.json"),
            }
        )
    )
    return path


def load_current() -> Endpoints | None:
    """Return the endpoints of the stack ``txchaos up`` started, or None when there is none."""
    path = current_file()
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    ep_path = Path(info["endpoints"])
    return Endpoints.load(ep_path) if ep_path.exists() else None


def endpoints_from_env() -> Endpoints | None:
    """Return endpoints named by ``$TXCHAOS_ENDPOINTS`` (a path to endpoints.json), if set."""
    value = os.environ.get("TXCHAOS_ENDPOINTS")
    if not value:
        return None
    path = Path(value)
    if not path.exists():
        raise ConfigError(
            f"TXCHAOS_ENDPOINTS={value} does not exist",
            hint="point it at reports/stacks/<id>/endpoints.json of a running stack, or unset it",
        )
    return Endpoints.load(path)
