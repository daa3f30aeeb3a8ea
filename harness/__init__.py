"""txchaos: prove that a transactional messaging flow neither loses nor duplicates under chaos.

The public API is what ``__all__`` lists; everything else may change. Names load lazily so
``import harness`` (and the pytest plugin) stays cheap.

What a handler takes, by the ``flow`` of its ``ScenarioSpec`` (each has a runnable example in
docs/handlers.md):

- ``"activemq"``: ``def stage(ctx: StageContext) -> None`` per message; chain stages alike.
- ``"kafka"``: ``def stage(ctx: KafkaContext) -> None`` per record, or a ``@batch_handler`` taking
  ``list[KafkaContext]`` that raises ``BatchFailed(index, cause)``; ``KafkaStageOptions`` keys go
  in ``ScenarioSpec.options``.
- ``"kafka_saga"``: Kafka stages whose ``options`` hold ``SagaOptions`` keys.
- ``"dtm"`` and helpers: ``def main(ctx: ProcessContext) -> None``, calling ``ctx.ready()`` once it
  serves; ``DtmClient`` talks to the DTM server at ``ctx.endpoints``.

``run_scenario(spec, endpoints)`` runs any of them (in pytest, the ``txchaos_run`` fixture);
``Schema`` brings your own tables; ``FaultWindow`` holds a fault while the flow runs;
``run_soak(Soak(spec, duration_s=600), endpoints)`` drives one for long under a fault schedule
(in pytest, ``txchaos_soak``).
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
    "RunSession": "harness.run.core.session",
    "Flow": "harness.run.spec.flow",
    "stage_machine": "harness.machines.stage",
    "StageMachine": "harness.machines.stage",
    "profile": "harness.machines.profiles",
    "ConfigError": "harness.errors",
    "HarnessError": "harness.errors",
    "InvariantViolation": "harness.errors",
    "StackError": "harness.errors",
    "TxChaosError": "harness.errors",
    "IncompleteEvidence": "harness.errors",
    "ServiceFailed": "harness.errors",
    "Service": "harness.run.spec.service",
    "Endpoints": "harness.stack.base",
    "Endpoint": "harness.stack.base",
    "LocalProvider": "harness.stack.local",
    "make_provider": "harness.stack.selection",
    "Kind": "harness.ledger.schema",
    "LedgerWriter": "harness.ledger.writer",
    "read_ledger": "harness.ledger.reader",
    "FlowContract": "harness.verify.model",
    "Invariant": "harness.verify.model",
    "Verdict": "harness.verify.verdict",
    "Witness": "harness.verify.verdict",
    "check_run": "harness.verify.checker",
    "StageContext": "harness.worker.stage",
    "HandlerContext": "harness.worker.base",
    "Crash": "harness.run.spec.scenario",
    "Stage": "harness.run.spec.scenario",
    "Helper": "harness.run.spec.scenario",
    "ProcessContext": "harness.worker.process",
    "ScenarioSpec": "harness.run.spec.scenario",
    "RunResult": "harness.run.core.outcome",
    # Every registered flow (harness.run.spec.flow): a Kafka, saga, CQRS or DTM spec runs as it says.
    "run_scenario": "harness.run.core.session:run_scenario",
    "check_handlers": "harness.run.spec.handlers",
    "FaultWindow": "harness.run.spec.scenario",
    "Schema": "harness.run.spec.schema",
    "KafkaContext": "harness.worker.kafka_context",
    "BatchFailed": "harness.worker.kafka_context",
    "batch_handler": "harness.worker.kafka_context",
    "KafkaStageOptions": "harness.worker.kafka_options",
    "SagaOptions": "harness.patterns.saga_options",
    "DtmClient": "harness.clients.dtm",
    "Soak": "harness.soak.spec",
    "SoakResult": "harness.soak.driver",
    "run_soak": "harness.soak.driver",
}

__all__ = [
    "Bandwidth",
    "BatchFailed",
    "ConfigError",
    "Crash",
    "DtmClient",
    "Endpoint",
    "Endpoints",
    "FaultWindow",
    "Flow",
    "FlowContract",
    "HandlerContext",
    "HarnessError",
    "Helper",
    "IncompleteEvidence",
    "Invariant",
    "InvariantViolation",
    "KafkaContext",
    "KafkaStageOptions",
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
    "SagaOptions",
    "ScenarioSpec",
    "Schema",
    "Service",
    "ServiceFailed",
    "Slicer",
    "SlowClose",
    "Soak",
    "SoakResult",
    "StackError",
    "Stage",
    "StageContext",
    "StageMachine",
    "Timeout",
    "TxChaosError",
    "Verdict",
    "Witness",
    "active",
    "batch_handler",
    "check_handlers",
    "check_run",
    "make_provider",
    "profile",
    "read_ledger",
    "run_scenario",
    "run_soak",
    "stage_machine",
]

if TYPE_CHECKING:
    from harness.clients.dtm import DtmClient
    from harness.errors import (
        ConfigError,
        HarnessError,
        IncompleteEvidence,
        InvariantViolation,
        ServiceFailed,
        StackError,
        TxChaosError,
    )
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
    from harness.patterns.saga_options import SagaOptions
    from harness.run.core.outcome import RunResult
    from harness.run.core.session import RunSession, run_scenario
    from harness.run.spec.flow import Flow
    from harness.run.spec.handlers import check_handlers
    from harness.run.spec.scenario import Crash, FaultWindow, Helper, ScenarioSpec, Stage
    from harness.run.spec.schema import Schema
    from harness.run.spec.service import Service
    from harness.soak.driver import SoakResult, run_soak
    from harness.soak.spec import Soak
    from harness.stack.base import Endpoint, Endpoints
    from harness.stack.local import LocalProvider
    from harness.stack.selection import make_provider
    from harness.verify.checker import check_run
    from harness.verify.model import FlowContract, Invariant
    from harness.verify.verdict import Verdict, Witness
    from harness.worker.base import HandlerContext
    from harness.worker.kafka_context import BatchFailed, KafkaContext, batch_handler
    from harness.worker.kafka_options import KafkaStageOptions
    from harness.worker.process import ProcessContext
    from harness.worker.stage import StageContext


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value
