"""The CQRS replica's state machine: the Kafka stage machine with entity events and a per-key verdict.

Operations are entity events (``harness.patterns.kafka_cqrs.entity_event``: each entity created,
updated, deleted), so the rules that submit are the stage machine's. One rule is added:
``crash_at_delete`` arms a crash point on the next delete and submits the events up to it in one
flush, so the delete and the earlier events of its entity are polled in one batch: the window
where a redelivery replays an update after its tombstone. The invariant "no duplicate effect" is
dropped: the replica's apply journal records every re-apply on purpose, and re-applying the same
version is harmless; what matters is the verdict after quiescence, checked in ``teardown``.

A spec with ``expect`` hunts those classes: an example fails only when its verdict names one of
them. The naive replica's bug shows as ``out-of-order`` (an update replayed after a newer one)
in far smaller programs than as ``resurrected`` (replayed after the delete), and Hypothesis,
shrinking to the smallest failure, would report the former. A spec without ``expect`` (the fixed
replica) fails on any anomaly.

>>> Machine = cqrs_machine(spec, endpoints)
>>> run_state_machine_as_test(Machine, settings=profile("ci"))
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import rule

from harness.errors import ConfigError
from harness.machines.stage import (
    KAFKA_CRASH_POINTS,
    KAFKA_PROXIES,
    KAFKA_REDELIVERY_POINTS,
    StageMachine,
)
from harness.patterns.kafka_cqrs import entity_event
from harness.run.cqrs_runner import CqrsRunSession
from harness.run.kafka_runner import KafkaRunSession
from harness.run.runner import RunSession
from harness.run.spec import Crash, ScenarioSpec
from harness.stack.base import Endpoints


class CqrsMachine(StageMachine):
    """Drive a CQRS replica (``broker="kafka_cqrs"``) with the Kafka stage machine's rules."""

    crash_points = KAFKA_CRASH_POINTS
    redelivery_points = KAFKA_REDELIVERY_POINTS
    redelivery_actions = ("disconnect",)
    network_proxies = KAFKA_PROXIES

    def open_session(self, spec: ScenarioSpec) -> RunSession | KafkaRunSession:
        return CqrsRunSession(spec, type(self).endpoints).open()

    @rule(data=st.data())
    def crash_at_delete(self, data: st.DataObject) -> None:
        """Arm a crash point on the next delete and submit the events up to it in one flush."""
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"crash_at_delete({point!r})")
        n = len(self.run.ops)
        delete = next(i for i in range(n, n + 3) if entity_event(i).tombstone)
        self.run.arm(Crash(point), op=self.run.op_id(delete))
        self.run.submit(delete - n + 1)

    def no_duplicate_effect(self) -> None:
        """Not an invariant here: the apply journal repeats every re-apply on purpose."""

    def teardown(self) -> None:
        cls = type(self)
        try:
            self._heal()
        finally:
            result = self.run.close()  # quiescence, residue, verdict; heals the run in any case
        cls.last_result = result
        verdict = result.verdict
        note(f"verdict: {verdict.headline()}")
        found = set(verdict.found())
        if found & cls.spec.expect if cls.spec.expect else found:
            self._violated(
                f"{verdict.headline()}\nrun folder: {result.run_dir}\nseed: {verdict.seed}\n"
                f"steps: {' -> '.join(cls.last_steps)}"
            )


def cqrs_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[CqrsMachine]:
    """Return a ``CqrsMachine`` subclass bound to ``spec`` and ``endpoints``."""
    if spec.broker != "kafka_cqrs":
        raise ConfigError(f"{spec.label} runs on {spec.broker}", hint="the CQRS machine needs broker='kafka_cqrs'")
    if not isinstance(endpoints, Endpoints):
        raise ConfigError(
            f"endpoints must be an Endpoints object, not {type(endpoints).__name__}",
            hint="pass the txchaos_stack fixture's value",
        )
    name = f"Cqrs{spec.variant.title().replace('-', '')}Machine"
    namespace: dict[str, Any] = {
        "spec": spec,
        "endpoints": endpoints,
        "last_steps": [],
        "examples": 0,
        "found_at": None,
        "started_at": None,
        "last_result": None,
        **attrs,
        "__module__": os.environ.get("TXCHAOS_MACHINE_MODULE", __name__),
    }
    return type(name, (CqrsMachine,), namespace)
