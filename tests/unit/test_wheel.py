"""The wheel carries everything the harness reads at run time, and finds it without a checkout.

Before: a wheel held ``harness/*.py`` and ``py.typed`` only, and the code looked for fixtures,
the compose file and the scenarios as ``Path(__file__).parents[2] / ...``, beside site-packages.
The wheel is built offline from a copy of the sources (the repository gets no build/ folder).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "harness", "fixtures", "scenarios", "docker-compose.yml")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the wheel built from a copy of this checkout (about 5 s, no network)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(path, src / name, symlinks=True, ignore=ignore)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 60
    [built] = work.glob("txchaos-*.whl")
    return built


def _tracked(folder: str) -> list[str]:
    return sorted(
        str(p.relative_to(REPO))
        for p in (REPO / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    )


def test_the_wheel_holds_every_runtime_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    fixtures = _tracked("fixtures")
    assert len(fixtures) >= 15  # SQL, broker configs, log4j, Kafka properties, POMs, proxies, DTM config
    missing = [f for f in fixtures if f"harness/_data/{f}" not in names]
    assert not missing, f"fixtures not in the wheel: {missing}"
    scenarios = [f for f in _tracked("scenarios") if f.endswith("_scenario.py")]
    assert "scenarios/onepc_crash_gap_scenario.py" in scenarios
    assert not [f for f in scenarios if f"harness/_data/{f}" not in names]
    for name in ("harness/_data/docker-compose.yml", "harness/py.typed", "harness/resources.py"):
        assert name in names
    # The stack's Toxiproxy (trapd) is built from these on the user's machine.
    relay = [f for f in _tracked("harness/traps/trapd") if not f.endswith("_test.go")]
    assert "harness/traps/trapd/go.sum" in relay
    assert not [f for f in relay if f not in names], "trapd's build files are not all in the wheel"


def test_the_shipped_files_are_the_checkout_s(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        assert z.read("harness/_data/docker-compose.yml") == (REPO / "docker-compose.yml").read_bytes()
        assert z.read("harness/_data/fixtures/sql/onepc.sql") == (REPO / "fixtures/sql/onepc.sql").read_bytes()


def test_an_unpacked_wheel_finds_its_files_without_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = f"""
import sys
sys.path.insert(0, {str(site)!r})
import harness
assert harness.__file__.startswith({str(site)!r}), harness.__file__
from harness import resources
from harness.clients.db import SQL_DIR
from harness.run.spec.files import resolve
from harness.stack import dtm, local, docker
for path in (resources.fixture("jars", "activemq", "pom.xml"), SQL_DIR / "onepc.sql", dtm.CONFIG,
             local.FIXTURES / "kafka" / "server.properties", docker.COMPOSE_FILE):
    assert str(path).startswith({str(site)!r}) and path.is_file(), path
assert [s.variant for s in resolve("onepc_crash_gap", 7)]
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_nothing_resolves_paths_from_the_source_tree() -> None:
    # Benchmarks write the checkout's docs/ (developer-only); the bootstrap's script mode is the checkout's.
    allowed = {"harness/bench/report.py", "harness/stack/bootstrap.py"}
    users = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "harness").rglob("*.py")
        if "__file__).resolve().parents[" in p.read_text() or "__file__).parents[" in p.read_text()
    )
    assert set(users) <= allowed, users
