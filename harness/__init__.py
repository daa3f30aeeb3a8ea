"""txchaos: prove that a transactional messaging flow neither loses nor duplicates under chaos.

The public API is what ``__all__`` lists; everything else may change. Names load lazily so
``import harness`` (and the pytest plugin) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Latency": "harness.faults",
    "Bandwidth": "harness.faults",
    "SlowClose": "harness.faults",
    "Timeout": "harness.faults",
    "ResetPeer": "harness.faults",
    "Slicer": "harness.faults",
    "LimitData": "harness.faults",
    "Partition": "harness.faults",
    "Pause": "harness.faults",
    "KillBroker": "harness.faults",
    "active": "harness.faults",
    "RunSession": "harness.run.runner",
    "stage_machine": "harness.machines.stage",
    "StageMachine": "harness.machines.stage",
    "profile": "harness.machines.profiles",
    "ConfigError": "harness.errors",
    "HarnessError": "harness.errors",
    "InvariantViolation": "harness.errors",
    "StackError": "harness.errors",
    "TxChaosError": "harness.errors",
    "Endpoints": "harness.stack.base",
    "Endpoint": "harness.stack.base",
    "LocalProvider": "harness.stack.local",
    "make_provider": "harness.stack.selection",
    "Kind": "harness.ledger.schema",
    "LedgerWriter": "harness.ledger.writer",
    "read_ledger": "harness.ledger.reader",
    "FlowContract": "harness.verify.model",
    "Verdict": "harness.verify.verdict",
    "Witness": "harness.verify.verdict",
    "check_run": "harness.verify.checker",
    "StageContext": "harness.worker.stage",
    "Crash": "harness.run.spec",
    "Stage": "harness.run.spec",
    "Helper": "harness.run.spec",
    "ProcessContext": "harness.worker.process",
    "ScenarioSpec": "harness.run.spec",
    "RunResult": "harness.run.runner",
    "run_scenario": "harness.run.runner",
}

__all__ = [
    "Bandwidth",
    "ConfigError",
    "Crash",
    "Endpoint",
    "Endpoints",
    "FlowContract",
    "HarnessError",
    "Helper",
    "InvariantViolation",
    "KillBroker",
    "Kind",
    "Latency",
    "LedgerWriter",
    "LimitData",
    "LocalProvider",
    "Partition",
    "Pause",
    "ProcessContext",
    "ResetPeer",
    "RunResult",
    "RunSession",
    "ScenarioSpec",
    "Slicer",
    "SlowClose",
    "StackError",
    "Stage",
    "StageContext",
    "StageMachine",
    "Timeout",
    "TxChaosError",
    "Verdict",
    "Witness",
    "active",
    "check_run",
    "make_provider",
    "profile",
    "read_ledger",
    "run_scenario",
    "stage_machine",
]

if TYPE_CHECKING:
    from harness.errors import ConfigError, HarnessError, InvariantViolation, StackError, TxChaosError
    from harness.faults import (
        Bandwidth,
        KillBroker,
        Latency,
        LimitData,
        Partition,
        Pause,
        ResetPeer,
        Slicer,
        SlowClose,
        Timeout,
        active,
    )
    from harness.ledger.reader import read_ledger
    from harness.ledger.schema import Kind
    from harness.ledger.writer import LedgerWriter
    from harness.machines.profiles import profile
    from harness.machines.stage import StageMachine, stage_machine
    from harness.run.runner import RunResult, RunSession, run_scenario
    from harness.run.spec import Crash, Helper, ScenarioSpec, Stage
    from harness.stack.base import Endpoint, Endpoints
    from harness.stack.local import LocalProvider
    from harness.stack.selection import make_provider
    from harness.verify.checker import check_run
    from harness.verify.model import FlowContract
    from harness.verify.verdict import Verdict, Witness
    from harness.worker.process import ProcessContext
    from harness.worker.stage import StageContext


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
