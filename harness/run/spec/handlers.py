"""Check, in the driver and before anything starts, that every handler a spec names imports.

Each is imported with the import path the workers will get (``WorkerSpec.sys_path``): a handler
that does not import fails now, naming itself, instead of as "worker-0 keeps dying before it
subscribes". ``RunSession`` calls it before it makes the run's folder.
"""

from __future__ import annotations

import importlib

from harness.errors import ConfigError
from harness.run.spec.scenario import ScenarioSpec
from harness.worker.spec import driver_path


def check_handlers(spec: ScenarioSpec) -> None:
    """Import each handler of ``spec`` (its stages' and helpers' too) and check it is a function.

    >>> check_handlers(spec)  # ConfigError: handler 'orders.handlers:naiv': module ... has no 'naiv'
    """
    named = [
        *([("handler", spec.handler)] if spec.handler else []),  # a service scenario has none
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
