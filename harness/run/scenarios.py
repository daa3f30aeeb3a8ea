"""Find scenario scripts: ``scenarios/<name>_scenario.py`` exposing ``variants(seed) -> {variant: spec}``."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from harness.errors import ConfigError
from harness.run.spec import ScenarioSpec

SUFFIX = "_scenario.py"


def scenarios_dir() -> Path:
    here = Path.cwd() / "scenarios"
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "scenarios"


def available(directory: Path | None = None) -> list[str]:
    d = directory or scenarios_dir()
    return sorted(p.name.removesuffix(SUFFIX) for p in d.glob(f"*{SUFFIX}"))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"txchaos_scenario_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import scenario file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def resolve(target: str, seed: int, directory: Path | None = None) -> list[ScenarioSpec]:
    """Return the specs for ``NAME`` (all variants) or ``NAME:VARIANT`` at ``seed``."""
    name, _, variant = target.partition(":")
    d = directory or scenarios_dir()
    path = Path(name) if name.endswith(".py") else d / f"{name}{SUFFIX}"
    if not path.exists():
        raise ConfigError(
            f"no scenario {name!r} (looked for {path})",
            hint=f"available: {', '.join(available(d)) or 'none'}; run from the repository root",
        )
    factory: Callable[[int], dict[str, ScenarioSpec]] | None = getattr(_load(path), "variants", None)
    if factory is None:
        raise ConfigError(
            f"{path} has no variants(seed) function", hint="define variants(seed) -> {name: ScenarioSpec}"
        )
    specs = factory(seed)
    if variant:
        if variant not in specs:
            raise ConfigError(f"scenario {name} has no variant {variant!r}", hint=f"choose one of {', '.join(specs)}")
        return [specs[variant]]
    return list(specs.values())
