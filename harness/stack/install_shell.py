"""How an install step talks to the machine: its commands, Debian packages, progress lines, and its error.

Standard library only, importing nothing of ours: the bootstrap runs before the project's
virtualenv exists. Every message of ``BootstrapError`` says how to fix what failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

INSTALL = "`txchaos install`"


class BootstrapError(Exception):
    """A tool is missing or failed to install, or the cache is damaged; the message says how to fix it."""


def run(cmd: list[str], *, what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run ``cmd``; a non-zero exit is a BootstrapError carrying ``what`` and the output's tail."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BootstrapError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


PREFIX = ["txchaos bootstrap"]  # `txchaos install` says "txchaos install"
SAID = [0]  # progress lines printed: none during an install means everything was in place


def say(text: str) -> None:
    """Print a progress line before a step that does real work (minutes on a fresh machine)."""
    SAID[0] += 1
    print(f"{PREFIX[0]}: {text}", file=sys.stderr, flush=True)


def warn(text: str) -> None:
    """Print a line that is not a step of real work (a summary, a feature left out): not counted by ``say``."""
    print(f"{PREFIX[0]}: {text}", file=sys.stderr)


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(package: str) -> None:
    """Install a Debian package when root; otherwise raise, saying the sudo command to run."""
    if not is_root():
        raise BootstrapError(
            f"missing Debian package {package}: run `sudo apt-get install -y {package}`, then {INSTALL}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    say(f"installing the Debian package {package}...")
    run(["apt-get", "update", "-q"], what="apt-get update", env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], what=f"installing {package}", env=env)


def need(cmd: str, how: str) -> str:
    """Return the path of ``cmd`` on PATH, or raise saying ``how`` to get it."""
    found = shutil.which(cmd)
    if not found:
        raise BootstrapError(f"missing `{cmd}`: {how}; then run {INSTALL} again")
    return found
