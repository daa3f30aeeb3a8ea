"""A team's own handlers: checked in the driver before anything starts, imported by workers as the
test imported them, and run by the flow the spec names (issue 13 parts 5 and 7, issue 12 finding 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness import ConfigError, ScenarioSpec, Stage
from harness.run.core.session import run_scenario
from harness.run.spec.handlers import check_handlers
from harness.worker.spec import WorkerSpec
from tests.support import make_spec, refused


def spec(handler: str, **kw: object) -> ScenarioSpec:
    return make_spec(name="orders", handler=handler, **kw)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team's project folder holding package ``t5orders``, on the import path as pytest's ``pythonpath`` puts it."""
    pkg = tmp_path / "project" / "t5orders"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    marker = tmp_path / "imported"
    (pkg / "handlers.py").write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(marker)!r}).joinpath(str(os.getpid())).touch()\n"
        "NOT_A_FUNCTION = 3\n"
        "def naive(ctx):\n    pass\n"
        "def main(ctx):\n    pass\n"
    )
    (pkg / "broken.py").write_text("import t5_no_such_dependency\n")
    (pkg / "bad_syntax.py").write_text("def naive(ctx):\n    return (\n")
    marker.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    for name in [m for m in sys.modules if m.startswith("t5orders")]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


@pytest.mark.parametrize(
    ("handler", "named", "fix"),
    [
        ("t5orderz.handlers:naive", "'t5orderz.handlers:naive' does not import", "pythonpath"),
        ("t5orders.handlers:naiv", "has no 'naiv'", "main, naive"),
        ("t5orders.handlers:NOT_A_FUNCTION", "is a int, not a function", "name a function"),
        ("t5orders.broken:naive", "No module named 't5_no_such_dependency'", "install it"),
        ("t5orders.bad_syntax:naive", "SyntaxError", "python -c 'import t5orders.bad_syntax'"),
    ],
)
def test_a_handler_that_does_not_import_is_named_before_anything_starts(
    project: Path, handler: str, named: str, fix: str
) -> None:
    # Before: the run started its services and workers, then failed "worker-0 keeps dying before it
    # subscribes" (exit 3) without naming the handler. Endpoints are never touched: it fails first.
    refused(lambda: run_scenario(spec(handler), endpoints=None), named, fix)  # type: ignore[arg-type]


def test_chain_stages_and_helpers_are_checked_too(project: Path) -> None:
    check_handlers(spec("t5orders.handlers:naive"))
    with pytest.raises(ConfigError, match=r"stage ship handler .t5orders\.handlers:ship."):
        check_handlers(spec("t5orders.handlers:naive", chain=(Stage("ship", "t5orders.handlers:ship"),)))
    with pytest.raises(ConfigError, match="helper relay handler"):
        check_handlers(spec("t5orders.handlers:naive", helpers=(harness.Helper("relay", "t5orders.nope:main"),)))


def _process_spec(project: Path) -> WorkerSpec:
    run_dir = project / "run"
    (run_dir / "workers").mkdir(parents=True)
    return WorkerSpec(
        name="relay",
        run_dir=str(run_dir),
        endpoints_path=str(run_dir / "endpoints.json"),
        handler="t5orders.handlers:main",
        stage="relay",
        input_queue="in",
        output_queue=None,
        kind="process",
    )


def test_a_worker_imports_the_users_package_with_the_drivers_path(project: Path) -> None:
    # Before: "ModuleNotFoundError: No module named 'orders'" in the worker log unless PYTHONPATH
    # and the working directory were set by hand. The worker starts in / with no PYTHONPATH.
    worker = _process_spec(project)
    assert str(project / "project") in worker.sys_path
    path = worker.write(project / "run" / "workers" / "relay.json")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "harness.worker", str(path)], cwd="/", env=env, capture_output=True, text=True
    )
    # The helper imports, then fails reading the endpoints file this test did not write.
    assert "No module named 't5orders'" not in proc.stderr
    assert list((project / "imported").iterdir()), proc.stderr


def test_a_forked_worker_imports_the_users_package_too(project: Path) -> None:
    from harness.run.processes.standby import STANDBY

    worker = _process_spec(project)
    path = worker.write(project / "run" / "workers" / "relay.json")
    log = project / "run" / "relay.log"
    proc = STANDBY.start_worker(path, log, name="relay", tag="test/user-code")
    proc.popen.wait(30)
    assert "No module named 't5orders'" not in log.read_text()
    assert [p.name for p in (project / "imported").iterdir()] == [str(proc.popen.pid)]


def test_a_spec_written_before_sys_path_existed_still_loads(tmp_path: Path) -> None:
    old = {"name": "w", "run_dir": "r", "endpoints_path": "e", "handler": "m:f", "stage": "s", "input_queue": "q"}
    path = tmp_path / "w.json"
    path.write_text(json.dumps({**old, "output_queue": None}))
    assert WorkerSpec.load(path).sys_path


def test_run_scenario_is_the_dispatcher_that_honours_the_broker() -> None:
    # Before: harness.run_scenario was the ActiveMQ runner: a Kafka spec ran as STOMP workers.
    assert harness.run_scenario is run_scenario


@pytest.mark.parametrize(
    "name",
    [
        "KafkaContext",
        "BatchFailed",
        "batch_handler",
        "FaultWindow",
        "Schema",
        "KafkaStageOptions",
        "SagaOptions",
        "ProcessContext",
        "StageContext",
        "DtmClient",
        "run_scenario",
    ],
)
def test_every_name_a_handler_needs_is_exported(name: str) -> None:
    assert name in harness.__all__
    assert getattr(harness, name) is not None


def test_every_builtin_scenario_passes_the_checks_a_run_makes_first() -> None:
    from harness.run.spec.files import available, resolve

    checked = 0
    for name in available():
        try:
            specs = resolve(name, seed=0)
        except ConfigError as exc:  # a state-machine file has no fixed variants to run
            if "no variants(seed)" not in str(exc):
                raise
            continue
        for s in specs:
            check_handlers(s)
            harness.Schema.of(s.schema).check()
            checked += 1
    assert checked >= 10


def test_a_run_takes_the_name_of_the_key_its_file_gives_it(tmp_path: Path) -> None:
    # The JMS example's "poison" runs its "check" service; named as "poison" on the command line, the
    # run, its replay hint and its folder must say "poison", or a replay would run "check" instead.
    from harness.run.spec.files import resolve

    scenario = tmp_path / "keyed_scenario.py"
    scenario.write_text(
        "from harness import ScenarioSpec\n\n"
        "def variants(seed):\n"
        "    spec = ScenarioSpec(name='keyed', variant='check', handler='harness.patterns.onepc:naive',"
        " schema='onepc', effect_table='onepc_effects',"
        " seed=seed)\n"
        "    return {'check': spec, 'poison': spec}\n"
    )
    (poison,) = resolve(f"{scenario}:poison", seed=3)
    assert (poison.label, poison.seed) == ("keyed:poison", 3)
    assert [s.variant for s in resolve(str(scenario), seed=0)] == ["check", "poison"]
