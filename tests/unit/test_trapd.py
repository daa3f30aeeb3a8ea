"""trapd's Go tests (the readers' internals, the trap toxic inside Toxiproxy), vet and gofmt."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from harness.stack.go_builds import TRAPD_SOURCE as SOURCE
from harness.stack.go_builds import go_env


def _go(*args: str) -> subprocess.CompletedProcess[str]:
    go = shutil.which("go")
    assert go is not None, "trapd is built with Go: install Go 1.23+"
    env = {**go_env(), "GOTOOLCHAIN": "local"}
    return subprocess.run([go, *args], cwd=SOURCE, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args", [("vet", "./..."), ("test", "-count=1", "./...")])
def test_go_vet_and_go_test_pass(args: tuple[str, ...]) -> None:
    done = _go(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_go_sources_are_gofmt_clean() -> None:
    gofmt = shutil.which("gofmt")
    assert gofmt is not None, "gofmt comes with Go"
    done = subprocess.run([gofmt, "-l", str(SOURCE)], capture_output=True, text=True, check=True)
    assert done.stdout == "", f"run gofmt -w on: {done.stdout}"
