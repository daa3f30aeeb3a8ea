"""The cache is verified before a stack starts, and `txchaos install` repairs only what is damaged.

Each test writes a tiny fake cache (TXCHAOS_CACHE) with the install's own manifest: no Maven, Go
or npm runs here, and the machine's real cache is never touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.cli import main
from harness.stack import bootstrap, cache_manifest, go_builds, host_tools

TRAPD = go_builds.trapd_path().name  # the stack's Toxiproxy: named by the version of its sources

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Return a fake cache as an install leaves it: jars, binaries, tools.json and manifest.json."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TXCHAOS_CACHE", str(root))
    for name in ("activemq", "kafka"):
        lib = root / "jars" / f"{name}-0123456789ab"
        lib.mkdir(parents=True)
        (lib / f"{name}-client-1.0.jar").write_bytes(b"PK\x03\x04 " + name.encode() * 100)
        (lib / f"{name}-core-1.0.jar").write_bytes(b"PK\x03\x04 core " + name.encode() * 50)
        (lib / ".complete").write_text("2026-01-01T00:00:00")
        cache_manifest.record(f"{name} jars", lib)
    for component, binary in (("toxiproxy", TRAPD), ("dtm", go_builds.DTM_BINARY)):
        path = root / "bin" / binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF" + component.encode() * 200)
        path.chmod(0o755)
        cache_manifest.record(component, path)
    tools = bootstrap.Tools(
        java=sys.executable,
        postgres_bin=str(tmp_path),
        activemq_lib=str(root / "jars" / "activemq-0123456789ab"),
        kafka_lib=str(root / "jars" / "kafka-0123456789ab"),
        toxiproxy=str(root / "bin" / TRAPD),
        allure=None,
        dtm=str(root / "bin" / go_builds.DTM_BINARY),
    )
    (root / "tools.json").write_text(json.dumps(asdict(tools)))
    return root


def test_an_intact_cache_loads(cache: Path) -> None:
    assert bootstrap.load_tools().dtm == str(cache / "bin" / go_builds.DTM_BINARY)
    cache_manifest.verify_cache(full=True)


def test_a_missing_jar_is_named_with_the_remedy(cache: Path) -> None:
    # Before: the broker died with "Transport scheme NOT recognized" and a hint to read its log.
    (cache / "jars" / "activemq-0123456789ab" / "activemq-client-1.0.jar").unlink()
    with pytest.raises(bootstrap.BootstrapError) as info:
        bootstrap.load_tools()
    message = str(info.value)
    assert message == (
        f"the txchaos cache at {cache} is damaged "
        "(jars/activemq-0123456789ab/activemq-client-1.0.jar missing): run `txchaos install` to reinstall"
    )


def test_a_truncated_binary_is_caught_by_the_cheap_check(cache: Path) -> None:
    binary = cache / "bin" / TRAPD
    binary.write_bytes(binary.read_bytes()[:10])
    with pytest.raises(bootstrap.BootstrapError, match=rf"{TRAPD} changed\): run `txchaos install`"):
        bootstrap.load_tools()


def test_same_size_corruption_needs_the_full_check(cache: Path) -> None:
    jar = cache / "jars" / "kafka-0123456789ab" / "kafka-core-1.0.jar"
    data = bytearray(jar.read_bytes())
    data[-1] ^= 0xFF
    jar.write_bytes(bytes(data))
    cache_manifest.verify_cache()  # sizes agree: the check before every start does not hash
    with pytest.raises(bootstrap.BootstrapError, match=r"kafka-core-1\.0\.jar changed"):
        cache_manifest.verify_cache(full=True)


def test_a_cache_without_manifest_asks_for_an_install(cache: Path) -> None:
    (cache / "manifest.json").unlink()
    with pytest.raises(bootstrap.BootstrapError, match=r"has no manifest\.json .*run `txchaos install`"):
        bootstrap.load_tools()


def test_no_cache_at_all_names_txchaos_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path / "empty"))
    with pytest.raises(bootstrap.BootstrapError, match="run `txchaos install`"):
        bootstrap.load_tools()


def test_the_local_provider_refuses_a_damaged_cache_before_starting(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.errors import ConfigError
    from harness.stack.local import LocalProvider

    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path / "reports"))
    (cache / "bin" / go_builds.DTM_BINARY).unlink()
    with pytest.raises(ConfigError) as info:
        LocalProvider().start()
    assert go_builds.DTM_BINARY in str(info.value)
    assert "txchaos install" in (info.value.hint or "")
    assert not list((tmp_path / "reports").glob("stacks/*/logs/*.log"))  # nothing was spawned


def test_install_repairs_only_the_damaged_component(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = cache / "jars" / "activemq-0123456789ab"
    (lib / "activemq-core-1.0.jar").unlink()
    kafka_before = (cache / "jars" / "kafka-0123456789ab" / "kafka-core-1.0.jar").stat().st_ino
    assert cache_manifest.intact("activemq jars", lib, lib / ".complete", verify=False) is False
    assert not lib.exists()  # removed, so the install resolves it again
    assert cache_manifest.intact("kafka jars", cache / "jars" / "kafka-0123456789ab", cache, verify=True)
    assert (cache / "jars" / "kafka-0123456789ab" / "kafka-core-1.0.jar").stat().st_ino == kafka_before


def test_an_install_that_predates_the_manifest_is_recorded(cache: Path) -> None:
    (cache / "manifest.json").unlink()
    binary = cache / "bin" / go_builds.DTM_BINARY
    assert cache_manifest.intact("dtm", binary, binary, verify=False)
    recorded = cache_manifest.read_manifest()
    assert recorded is not None
    assert recorded["dtm"]["root"] == f"bin/{go_builds.DTM_BINARY}"


def test_txchaos_install_is_idempotent_and_says_so(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Everything is in place: no tool runs, so the fakes below are never called.
    for name in ("ensure_java", "ensure_postgres", "ensure_spark_archive"):
        monkeypatch.setattr(bootstrap, name, lambda *a, **k: "/fake")
    monkeypatch.setattr(bootstrap, "ensure_allure", lambda **k: None)
    for name in ("activemq", "kafka"):
        lib = cache / "jars" / f"{name}-0123456789ab"
        lib.rename(lib.with_name(f"{name}-{host_tools.digest(_pom(name))}"))
    (cache / "manifest.json").unlink()  # recorded again from what is there
    assert main(["install"]) == 0
    assert main(["install", "--verify"]) == 0
    err = capsys.readouterr().err
    assert err.count("recording the checksums") == 4
    assert "txchaos install: everything is in place (every file hashed again" in err


def test_a_missing_tool_names_txchaos_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(bootstrap.BootstrapError) as info:
        go_builds.ensure_toxiproxy()
    assert str(info.value).startswith("missing `go`")
    assert str(info.value).endswith("then run `txchaos install` again")


def test_the_bootstrap_still_runs_as_a_plain_script() -> None:
    # ./txchaos runs it with the machine's python3 before the virtualenv exists: the script and the
    # harness modules it reads (the POM lookup, the Allure installer) import nothing third-party.
    script = REPO / "harness" / "stack" / "bootstrap.py"
    code = f"""
import runpy, sys
sys.argv = ["bootstrap.py", "--help"]
try:
    runpy.run_path({str(script)!r}, run_name="__main__")
except SystemExit as exc:
    assert exc.code == 0, exc.code
import harness.resources, harness.reporting.allure_cli
assert harness.resources.fixture("jars", "kafka", "pom.xml").is_file()
bad = sorted(m for m in sys.modules if m.split(".")[0] in {{"pytest", "sqlalchemy", "rich", "pyspark", "docker"}})
assert not bad, bad
"""
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--verify" in proc.stdout


def _pom(name: str) -> Path:
    from harness import resources

    return resources.fixture("jars", name, "pom.xml")


def test_the_browser_for_the_report_test_is_found_or_installed_as_root_or_skipped_saying_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert host_tools.ensure_browser() == str(fake)
    fake.unlink()
    installed: list[str] = []
    monkeypatch.setattr(host_tools, "is_root", lambda: False)
    monkeypatch.setattr(host_tools, "apt_install", installed.append)
    assert host_tools.ensure_browser() is None
    assert "apt-get install -y chromium" in capsys.readouterr().err
    monkeypatch.setattr(host_tools, "is_root", lambda: True)
    host_tools.ensure_browser()
    assert installed == ["chromium"]


def test_the_virtualenv_is_made_from_the_named_python_else_the_distributions_else_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(bootstrap.PYTHON_ENV, str(tmp_path / "python9"))
    with pytest.raises(bootstrap.BootstrapError) as info:
        bootstrap.base_python()
    assert str(info.value).startswith(f"TXCHAOS_PYTHON={tmp_path / 'python9'} is not a Python 3.11+")
    assert str(info.value).endswith("or unset TXCHAOS_PYTHON")
    monkeypatch.setenv(bootstrap.PYTHON_ENV, sys.executable)
    assert bootstrap.base_python() == sys.executable
    monkeypatch.delenv(bootstrap.PYTHON_ENV)
    no_venv = tmp_path / "python3"  # a distribution's python3 without its venv package: refused
    no_venv.write_text("#!/bin/sh\nexit 1\n")
    no_venv.chmod(0o755)
    monkeypatch.setattr(bootstrap, "SYSTEM_PYTHON", no_venv)
    assert bootstrap.base_python() == sys.executable
    monkeypatch.setattr(bootstrap, "SYSTEM_PYTHON", tmp_path / "absent")
    assert bootstrap.base_python() == sys.executable
    other = tmp_path / "other" / "python3"  # a working one: chosen over the running interpreter
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    monkeypatch.setattr(bootstrap, "SYSTEM_PYTHON", other)
    assert bootstrap.base_python() == str(other)


def test_a_virtualenv_made_from_another_interpreter_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = repo / ".venv"
    for name in ("python", "txchaos"):
        (venv / "bin" / name).write_text("")
    (venv / "pyvenv.cfg").write_text("home = /opt/slow/bin\nexecutable = /opt/slow/bin/python3.11\n")
    ran: list[list[str]] = []
    monkeypatch.setattr(bootstrap, "run", lambda cmd, **_: ran.append(cmd))
    monkeypatch.setenv(bootstrap.PYTHON_ENV, sys.executable)
    assert bootstrap.ensure_venv(repo) == venv
    assert ran[0] == [sys.executable, "-m", "venv", "--clear", str(venv)]
    assert ran[1][-2:] == ["-e", f"{repo}[dev]"]
    ran.clear()
    bootstrap.ensure_venv(repo)  # stamped: nothing to do
    assert ran == []
    (venv / "pyvenv.cfg").write_text(f"executable = {sys.executable}\n")
    (repo / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    bootstrap.ensure_venv(repo)  # the same interpreter, a new pyproject.toml: installed again, not made again
    assert len(ran) == 1
    assert ran[0][-2:] == ["-e", f"{repo}[dev]"]
