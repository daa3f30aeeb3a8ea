"""Run a scenario with the run lifecycle of the broker its spec names: ActiveMQ, Kafka (a stage, a saga,
CQRS entity events) or DTM. This is ``harness.run_scenario``.

Before anything starts, the schema is checked readable and every handler the spec names is
imported here, in the driver, with the import path the workers will get (``WorkerSpec.sys_path``):
a handler that does not import fails now, naming itself, instead of as "worker-0 keeps dying
before it subscribes".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from harness.errors import ConfigError
from harness.run.runner import RunResult, run_scenario
from harness.run.schema import Schema
from harness.run.spec import ScenarioSpec
from harness.stack.base import Endpoints
from harness.worker.spec import driver_path


def _quiet(_: str) -> None:
    return None


def check_handlers(spec: ScenarioSpec) -> None:
    """Import each handler of ``spec`` (its stages' and helpers' too) and check it is a function.

    >>> check_handlers(spec)  # ConfigError: handler 'orders.handlers:naiv': module ... has no 'naiv'
    """
    named = [
        ("handler", spec.handler),
        *((f"stage {s.name} handler", s.handler) for s in spec.chain),
        *((f"helper {h.name} handler", h.handler) for h in spec.helpers),
    ]
    for label, path in named:
        _check_handler(label, path)


def _check_handler(label: str, path: str) -> None:
    module_name, _, func = path.partition(":")
    where = "the test's import path (the pytest rootdir, the `pythonpath` ini setting, installed packages)"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        first = ", ".join(driver_path()[:4])
        if module_name == missing or module_name.startswith(missing + "."):
            hint = (
                f"check the spelling; the module must be importable from {where}: add your project's folder "
                f"to `pythonpath` in [tool.pytest.ini_options] or install it (sys.path starts {first})"
            )
        else:
            hint = f"{module_name} imports {missing!r}, which is not installed: install it in this environment"
        raise ConfigError(f"{label} {path!r} does not import: {exc}", hint=hint) from exc
    except Exception as exc:
        raise ConfigError(
            f"{label} {path!r}: importing {module_name} raised {type(exc).__name__}: {exc}",
            hint=f"fix {module_name} so that `python -c 'import {module_name}'` works",
        ) from exc
    target = getattr(module, func, None)
    if target is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"{label} {path!r}: module {module_name} has no {func!r}",
            hint=f"name one of its functions: {', '.join(public) or '(it defines none)'}",
        )
    if not callable(target):
        raise ConfigError(
            f"{label} {path!r} is a {type(target).__name__}, not a function",
            hint="name a function taking the stage context (or ProcessContext for a helper)",
        )


def run_spec(
    spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Callable[[str], None] = _quiet
) -> RunResult:
    """Run ``spec`` with the run lifecycle of its broker and return the result.

    >>> result = run_scenario(spec, endpoints)  # harness.run_scenario; in pytest use txchaos_run(spec)
    >>> result.verdict.found()
    {'duplicate-effect': 1}
    """
    if not isinstance(spec, ScenarioSpec):
        raise ConfigError(f"{spec!r} is not a ScenarioSpec", hint="build the spec with harness.ScenarioSpec(...)")
    check_handlers(spec)
    Schema.of(spec.schema).check()
    if spec.broker == "kafka":
        from harness.run.kafka_runner import run_kafka_scenario

        return run_kafka_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker == "kafka_saga":
        from harness.run.saga_runner import run_saga_scenario

        return run_saga_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker == "kafka_cqrs":
        from harness.run.cqrs_runner import run_cqrs_scenario

        return run_cqrs_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker == "dtm":
        from harness.run.dtm_runner import run_dtm_scenario

        return run_dtm_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
    if spec.broker != "activemq":
        raise ConfigError(f"no run lifecycle for broker {spec.broker!r}", hint="use a broker ScenarioSpec accepts")
    return run_scenario(spec, endpoints, runs_root=runs_root, progress=progress)
