"""Choose a stack provider, and remember the stack ``txchaos up`` left running."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.paths import stacks_root
from harness.stack.base import Endpoints, StackProvider

PROVIDERS = ("auto", "local", "docker")


@dataclass(frozen=True)
class Choice:
    """The provider a session will use and why, said in one line before anything starts."""

    provider: str
    why: str
    auto: bool

    def line(self) -> str:
        return f"txchaos: {self.provider} provider ({self.why})"


def choose(name: str | None = None) -> Choice:
    """Return the provider ``name`` (default ``$TXCHAOS_PROVIDER``, else auto) and the reason for it.

    ``auto`` takes docker only when it can really run the stack (``docker.docker_unusable``),
    otherwise local. Example: ``choose("auto").line()`` ->
    ``"txchaos: local provider (auto: docker cannot run the stack here: no Docker daemon answers)"``.
    """
    env = os.environ.get("TXCHAOS_PROVIDER")
    choice = (name or env or "auto").lower()
    if choice not in PROVIDERS:
        what = f"unknown stack provider {choice!r}" + ("" if name else " (from $TXCHAOS_PROVIDER)")
        raise ConfigError(what, hint=f"use one of {', '.join(PROVIDERS)}")
    if choice != "auto":
        return Choice(choice, "asked for" if name else "TXCHAOS_PROVIDER", auto=False)
    from harness.stack.docker_project import docker_unusable

    problem = docker_unusable()
    if problem is None:
        return Choice("docker", "auto: a Docker daemon with Compose v2 and every image answers", auto=True)
    return Choice("local", f"auto: docker cannot run the stack here: {problem}", auto=True)


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def make_provider(
    name: str | None = None, *, detached: bool = False, announce: Callable[[str], None] | None = _to_stderr
) -> StackProvider:
    """Return the provider ``name`` (see ``choose``); ``announce`` gets auto's one-line choice and reason."""
    choice = choose(name)
    if choice.auto and announce is not None:
        announce(choice.line())
    if choice.provider == "docker":
        from harness.stack.docker import DockerProvider
        from harness.stack.docker_project import docker_unusable

        problem = None if choice.auto else docker_unusable()
        if problem is not None:
            raise ConfigError(
                f"provider 'docker' asked for, but it cannot run the stack here: {problem}",
                hint="`txchaos install --docker` sets up the engine, Compose v2 and the images (docs/docker.md); "
                "or use --provider local (real binaries, no containers; `txchaos install` sets them up)",
            )
        return DockerProvider(detached=detached)
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
