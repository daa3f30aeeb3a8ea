"""Find scenario scripts: ``scenarios/<name>_scenario.py`` exposing ``variants(seed) -> {variant: spec}``."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from harness import resources
from harness.errors import ConfigError
from harness.run.spec.scenario import ScenarioSpec

SUFFIX = "_scenario.py"


def scenario_dirs() -> list[Path]:
    """Return where ``txchaos run NAME`` looks: ``./scenarios`` (a project's own, a checkout), then the built-ins."""
    here = Path.cwd() / "scenarios"
    builtin = resources.scenarios_dir()
    return [here, builtin] if here.is_dir() and here.resolve() != builtin.resolve() else [builtin]


def available(directory: Path | None = None) -> list[str]:
    dirs = [directory] if directory else scenario_dirs()
    return sorted({p.name.removesuffix(SUFFIX) for d in dirs for p in d.glob(f"*{SUFFIX}")})


def load_file(path: Path) -> ModuleType:
    """Import the scenario file at ``path`` (a module of its own, under a name made from its stem)."""
    spec = importlib.util.spec_from_file_location(f"txchaos_scenario_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import scenario file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file, not the harness: say where in it, as bad input
        del sys.modules[spec.name]
        raise _users_error(path, "failed to load", exc) from exc
    return module


def _users_error(path: Path, what: str, exc: Exception) -> ConfigError:
    """Return the error for an exception a scenario file raised: its type, words and line in the file."""
    if isinstance(exc, ConfigError):  # a spec the file built refused its own bad value: that names it
        return exc
    mine = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    where = f" (line {mine[-1].lineno})" if mine and not isinstance(exc, SyntaxError) else ""  # a SyntaxError says it
    return ConfigError(
        f"scenario file {path} {what}: {type(exc).__name__}: {exc}{where}",
        hint="fix the scenario file where the error says, then run the same command again",
    )


def resolve(target: str, seed: int, directory: Path | None = None) -> list[ScenarioSpec]:
    """Return the specs for ``NAME`` (all variants) or ``NAME:VARIANT`` at ``seed``, each spec's variant
    the key ``variants(seed)`` gives it."""
    name, _, variant = target.partition(":")
    dirs = [directory] if directory else scenario_dirs()
    if not name.endswith(".py") and (Path(name).is_dir() or "/" in name):
        raise ConfigError(
            f"{name!r} is neither a scenario's name nor a scenario file",
            hint=f"pass NAME[:VARIANT] (e.g. onepc_crash_gap:naive) or the path of a *{SUFFIX} file",
        )
    candidates = [Path(name)] if name.endswith(".py") else [d / f"{name}{SUFFIX}" for d in dirs]
    path = next((c for c in candidates if c.exists()), candidates[0])
    if not path.exists():
        raise ConfigError(
            f"no scenario {name!r} (looked for {', '.join(map(str, candidates))})",
            hint=f"available: {', '.join(available(directory)) or 'none'}; or pass a scenario file's path",
        )
    factory: Callable[[int], dict[str, ScenarioSpec]] | None = getattr(load_file(path), "variants", None)
    if factory is None:
        raise ConfigError(
            f"{path} has no variants(seed) function", hint="define variants(seed) -> {name: ScenarioSpec}"
        )
    # The key is what a user names (``NAME:KEY``), and what the replay hint and ``txchaos replay`` of the
    # run folder resolve again; a spec's own variant may say which implementation it runs (the JMS
    # example's "poison" runs its "check" service), so the run takes the key's name.
    try:
        made = factory(seed)
    except Exception as exc:
        raise _users_error(path, f"variants({seed}) raised", exc) from exc
    if not isinstance(made, dict) or not all(isinstance(s, ScenarioSpec) for s in made.values()):
        raise ConfigError(
            f"scenario file {path}: variants({seed}) returned {type(made).__name__}, not {{name: ScenarioSpec}}",
            hint="return a dict of variant name -> ScenarioSpec",
        )
    specs = {key: spec if spec.variant == key else replace(spec, variant=key) for key, spec in made.items()}
    if variant:
        if variant not in specs:
            raise ConfigError(f"scenario {name} has no variant {variant!r}", hint=f"choose one of {', '.join(specs)}")
        return [specs[variant]]
    return list(specs.values())
