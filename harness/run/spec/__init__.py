"""What a run is, before anything starts: the spec, its flow's registration, its schema and service, its steps."""

from harness.run.spec.scenario import NETWORK_TARGETS, Crash, FaultWindow, Helper, ScenarioSpec, Stage

__all__ = ["NETWORK_TARGETS", "Crash", "FaultWindow", "Helper", "ScenarioSpec", "Stage"]
