"""One safe provider choice: `auto` takes docker only when it can run the stack there, and says why.

The daemon and Compose probes are replaced by fakes: this is about the choice, not a broker.
A provider that cannot start ends a pytest session once, with one message, and the CLI with exit 2.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import ConfigError
from harness.stack import docker_project, selection

pytest_plugins = ["pytester"]


@pytest.fixture
def docker_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake a machine where every docker probe passes: a daemon, Compose v2, every image."""
    monkeypatch.delenv("TXCHAOS_PROVIDER", raising=False)
    monkeypatch.setattr(docker_project, "docker_available", lambda timeout_s=2.0: True)
    monkeypatch.setattr(docker_project, "_missing_images", lambda timeout_s: [])
    monkeypatch.setattr(docker_project.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))


def test_auto_takes_docker_when_every_probe_passes(docker_ready: None) -> None:
    choice = selection.choose()
    assert (choice.provider, choice.auto) == ("docker", True)
    assert choice.line().startswith("txchaos: docker provider (auto: ")


def test_auto_takes_local_when_no_daemon_answers(docker_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_project, "docker_available", lambda timeout_s=2.0: False)
    choice = selection.choose("auto")
    assert choice.provider == "local"
    assert choice.line() == "txchaos: local provider (auto: docker cannot run the stack here: no Docker daemon answers)"


def test_auto_takes_local_without_compose_v2(docker_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: a daemon answering was enough, and every test failed on "`docker compose` is not available".
    def no_compose(*args: object, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        raise subprocess.CalledProcessError(1, ["docker", "compose", "version"])

    monkeypatch.setattr(docker_project.subprocess, "run", no_compose)
    choice = selection.choose()
    assert choice.provider == "local"
    assert "Compose v2" in choice.why


def test_auto_takes_local_without_the_compose_file(
    docker_ready: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Before: a pip install had no compose file and every test failed on "no compose file at ...".
    monkeypatch.setattr(docker_project, "COMPOSE_FILE", tmp_path / "docker-compose.yml")
    choice = selection.choose()
    assert choice.provider == "local"
    assert f"no compose file at {tmp_path / 'docker-compose.yml'}" in choice.why


def test_auto_takes_local_when_an_image_is_missing(docker_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_project, "_missing_images", lambda timeout_s: ["yedf/dtm:1.19.0"])
    choice = selection.choose()
    assert choice.provider == "local"
    assert "yedf/dtm:1.19.0 not on the daemon" in choice.why
    assert "pull" in choice.why


def test_the_compose_file_ships_in_the_package() -> None:
    assert docker_project.COMPOSE_FILE.is_file()
    assert (
        docker_project.COMPOSE_FILE.parent / "fixtures" / "activemq" / "activemq.xml"
    ).is_file()  # its ./fixtures mounts


def test_docker_asked_for_but_unusable_is_a_config_error(docker_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_project, "_missing_images", lambda timeout_s: ["postgres:15"])
    with pytest.raises(ConfigError, match=r"provider 'docker' asked for, but .*postgres:15") as info:
        selection.make_provider("docker")
    assert "--provider local" in (info.value.hint or "")
    assert "`txchaos install --docker` sets up the engine" in (info.value.hint or "")


def test_auto_announces_its_choice_once(docker_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_project, "docker_available", lambda timeout_s=2.0: False)
    lines: list[str] = []
    provider = selection.make_provider(announce=lines.append)
    assert provider.name == "local"
    assert lines == ["txchaos: local provider (auto: docker cannot run the stack here: no Docker daemon answers)"]
    assert selection.make_provider("local", announce=lines.append).name == "local"
    assert len(lines) == 1  # asked for by name: nothing to explain


def test_cli_exits_2_with_one_message_when_docker_cannot_run(
    docker_ready: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path))
    monkeypatch.delenv("TXCHAOS_ENDPOINTS", raising=False)
    monkeypatch.setattr(docker_project, "docker_available", lambda timeout_s=2.0: False)
    assert main(["up", "--provider", "docker"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txchaos: ConfigError: provider 'docker' asked for, but it cannot run the stack here: ")
    assert err.count("\n") == 2  # the message and its hint line
    assert not list(tmp_path.glob("stacks/*"))  # nothing started


def test_a_provider_that_cannot_start_fails_the_session_once(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the session fixture's error was repeated, with a full traceback, for every test.
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_uses_the_stack(txchaos_stack, i):
            pass
        """
    )
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path / "reports"))
    monkeypatch.delenv("TXCHAOS_ENDPOINTS", raising=False)
    result = pytester.runpytest_subprocess("--txchaos-provider=local", "-p", "no:cacheprovider")
    assert result.ret == 2
    out = result.stdout.str()
    assert out.count("txchaos: the stack cannot start: ConfigError: ") == 1
    assert "run `txchaos install`" in out
    assert "Traceback" not in out
    result.assert_outcomes()  # no test passed, failed or errored: the session ended before the first
