"""The JVM examples' builds stop at once, with one line naming the tool, when a JDK or Maven is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILDS = [ROOT / "examples" / "jms-service" / "service", ROOT / "examples" / "spring-kafka-service" / "service"]


def _path_with(tmp_path: Path, tools: list[str]) -> str:
    """Return a PATH holding bash and stand-ins for ``tools`` only."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bash = shutil.which("bash")
    assert bash is not None
    os.symlink(bash, bin_dir / "bash")
    for tool in tools:
        stub = bin_dir / tool
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    return str(bin_dir)


@pytest.mark.parametrize("source", BUILDS, ids=[p.parent.name for p in BUILDS])
@pytest.mark.parametrize(
    ("present", "missing", "install"),
    [([], "java", "a JDK 17"), (["java"], "javac", "a JDK 17"), (["java", "javac"], "mvn", "Maven")],
)
def test_a_missing_tool_stops_the_build_naming_it(
    source: Path, present: list[str], missing: str, install: str, tmp_path: Path
) -> None:
    path = _path_with(tmp_path, present)
    proc = subprocess.run(
        [str(Path(path) / "bash"), "build.sh", str(tmp_path / "out")],
        cwd=source,
        env={"PATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"build.sh: {missing} not found: install {install}")
    assert not (tmp_path / "out").exists()


SCENARIOS = [
    ROOT / "examples" / "jms-service" / "jms_scenario.py",
    ROOT / "examples" / "spring-kafka-service" / "spring_kafka_scenario.py",
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.parent.name for p in SCENARIOS])
@pytest.mark.parametrize(
    ("present", "missing", "install"),
    [([], "java", "a JDK 17"), (["java"], "javac", "a JDK 17"), (["java", "javac"], "mvn", "Maven")],
)
def test_a_missing_tool_stops_a_run_before_it_builds_or_starts_anything(
    scenario: Path, present: list[str], missing: str, install: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A build already in the cache skips build.sh and its check: the run itself must refuse.
    from harness import ConfigError, RunSession
    from harness.run.processes.service_build import build_dir
    from harness.run.spec.files import load_file
    from tests.unit.fake_endpoints import fake_endpoints

    module = load_file(scenario)
    spec = module.variants(0)[next(iter(module.variants(0)))]
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path / "cache"))
    built = build_dir(spec.service)
    assert built is not None
    built.mkdir(parents=True)
    (built / ".complete").touch()
    monkeypatch.setenv("PATH", _path_with(tmp_path, present))
    with pytest.raises(ConfigError) as err:
        RunSession(spec, fake_endpoints(), runs_root=tmp_path / "runs")
    line, hint = str(err.value).splitlines()
    assert line.startswith(f"service {spec.service.name} needs {missing}, which is not on PATH: install {install}")
    assert hint.startswith(f"Hint: install {install}")
    assert not (tmp_path / "runs").exists()  # no run folder, no instance


def test_the_jvm_examples_share_one_build_script_that_keys_their_caches() -> None:
    # A link, not a copy: one script to mend, and its content is in each service's source hash.
    from harness.run.spec.service import source_files

    shared = (ROOT / "examples" / "jvm" / "build.sh").resolve()
    for source in BUILDS:
        link = source / "build.sh"
        assert link.is_symlink()
        assert link.resolve() == shared
        assert link in source_files(source)
