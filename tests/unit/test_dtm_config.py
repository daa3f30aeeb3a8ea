"""The DTM server's config fixture, its checks, and the DTM fields of Endpoints, tools.json and recipes.

No services: the checks are run on the real fixture and on broken copies of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.stack import bootstrap, dtm, go_builds
from harness.stack import topology as topo
from harness.stack.base import Endpoints
from harness.stack.local_state import ServiceRecipe
from tests.unit.fake_endpoints import fake_endpoints

FIXTURE = dtm.CONFIG.read_text()


def test_the_fixture_passes_its_checks() -> None:
    assert dtm.config_errors(FIXTURE) == []
    keys = dtm.read_keys(FIXTURE)
    assert keys["Store.Driver"] == "boltdb"
    assert int(keys["TimeoutToFail"]) < 35, "check-back must come sooner than DTM's 35 s default"


def test_render_appends_the_stack_ports() -> None:
    text = dtm.render(FIXTURE, http_port=41001, grpc_port=41002)
    keys = dtm.read_keys(text)
    assert (keys["HttpPort"], keys["GrpcPort"]) == ("41001", "41002")
    assert text.startswith(FIXTURE.rstrip())


def test_read_keys_nests_and_drops_comments() -> None:
    text = "# head\nStore:\n  Driver: 'boltdb'  # embedded\nRetryInterval: 10 # s\n  # indented comment\n"
    assert dtm.read_keys(text) == {"Store": "", "Store.Driver": "boltdb", "RetryInterval": "10"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("HttpPort: 36789", "sets HttpPort"),
        ("GrpcPort: 36790", "sets GrpcPort"),
        ("RetryInterval: 2", "DTM refuses less than 10"),
        ("RetryInterval: ten", "give whole seconds"),
        ("TimeoutToFail: 5", "below RetryInterval"),
    ],
)
def test_bad_values_are_named(extra: str, expected: str) -> None:
    key = extra.split(":", 1)[0]
    text = "\n".join(line for line in FIXTURE.splitlines() if not line.startswith(f"{key}:")) + f"\n{extra}\n"
    errors = dtm.config_errors(text)
    assert any(expected in e for e in errors), errors


def test_another_store_is_refused() -> None:
    text = FIXTURE.replace("Driver: boltdb", "Driver: mysql")
    assert any("Store.Driver is 'mysql'" in e for e in dtm.config_errors(text))


def test_render_refuses_a_bad_file_with_a_hint(tmp_path: Path) -> None:
    source = tmp_path / "dtm.yml"
    with pytest.raises(ConfigError, match="sets HttpPort") as info:
        dtm.render(FIXTURE + "HttpPort: 1\n", http_port=2, grpc_port=3, source=source)
    assert str(source) in str(info.value)
    assert info.value.hint


def test_bootstrap_builds_the_pinned_release() -> None:
    assert go_builds.DTM_VERSION.removeprefix("v") == topo.DTM.version
    assert go_builds.DTM_VERSION.startswith("v")
    assert topo.DTM.image == f"yedf/dtm:{topo.DTM.version}"
    assert topo.proxy_for("dtm").name == "dtm"


def _endpoints() -> Endpoints:
    return fake_endpoints(dtm=True)


def test_endpoints_round_trip_with_dtm() -> None:
    ep = _endpoints()
    assert Endpoints.from_json(ep.to_json()) == ep
    assert ep.dtm_url == "http://127.0.0.1:20004/api/dtmsvr"


def test_endpoints_json_without_dtm_still_loads() -> None:
    raw = json.loads(_endpoints().to_json())
    del raw["dtm"]
    old = Endpoints.from_json(json.dumps(raw))
    assert old.dtm is None
    assert old.postgres == _endpoints().postgres
    with pytest.raises(ConfigError, match="no DTM server") as info:
        _ = old.dtm_url
    assert "txchaos up" in (info.value.hint or "")


def test_tools_json_without_dtm_asks_for_a_bootstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path))
    tools = asdict(bootstrap.Tools("j", "pg", "amq", "kafka", "toxi", None, dtm=str(tmp_path)))
    del tools["dtm"]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    with pytest.raises(bootstrap.BootstrapError, match="predates the DTM server"):
        bootstrap.load_tools()


def test_missing_go_is_one_line_saying_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXCHAOS_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(bootstrap.BootstrapError) as info:
        go_builds.ensure_dtm()
    message = str(info.value)
    assert message.startswith("missing `go`")
    assert "install Go" in message
    assert "\n" not in message


def test_a_recipe_written_before_cwd_still_loads(tmp_path: Path) -> None:
    recipe = ServiceRecipe("dtm", ["dtm", "-c", "x.yml"], None, "dtm.log", "stack/s/dtm", False, str(tmp_path))
    recipe.save(tmp_path)
    assert ServiceRecipe.load(tmp_path, "dtm") == recipe
    raw = json.loads(ServiceRecipe.path(tmp_path, "dtm").read_text())
    del raw["cwd"]
    ServiceRecipe.path(tmp_path, "dtm").write_text(json.dumps(raw))
    assert ServiceRecipe.load(tmp_path, "dtm").cwd is None
