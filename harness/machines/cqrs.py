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

from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import rule

from harness.machines.base import bind
from harness.machines.stage import KAFKA_RULES, StageMachine
from harness.patterns.kafka_cqrs import entity_event
from harness.run.core.outcome import RunResult
from harness.run.core.session import RunSession
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.spec.steps import Arm, Submit
from harness.stack.base import Endpoints


class CqrsMachine(StageMachine):
    """Drive a CQRS replica (``flow="kafka_cqrs"``) with the Kafka stage machine's rules."""

    flows = ("kafka_cqrs",)
    crash_points = KAFKA_RULES["crash_points"]
    redelivery_points = KAFKA_RULES["redelivery_points"]
    redelivery_actions = KAFKA_RULES["redelivery_actions"]
    network_proxies = KAFKA_RULES["network_proxies"]

    def open_session(self, spec: ScenarioSpec) -> RunSession:
        return RunSession(spec, type(self).endpoints).open()

    @rule(data=st.data())
    def crash_at_delete(self, data: st.DataObject) -> None:
        """Arm a crash point on the next delete and submit the events up to it in one flush."""
        point = data.draw(st.sampled_from(type(self).crash_points), label="point")
        self._step(f"crash_at_delete({point!r})")
        n = len(self.run.ops)
        delete = next(i for i in range(n, n + 3) if entity_event(i).tombstone)
        self.do(Arm(Crash(point), at=delete), Submit(delete - n + 1))

    def no_duplicate_effect(self) -> None:
        """Not an invariant here: the apply journal repeats every re-apply on purpose."""

    def judge(self, result: RunResult) -> str | None:
        """Fail when the verdict names a hunted class (``spec.expect``), else on any anomaly."""
        verdict = result.verdict
        note(f"verdict: {verdict.headline()}")
        found = set(verdict.found())
        hunted = type(self).spec.expect
        return verdict.headline() if (found & hunted if hunted else found) else None


def cqrs_machine(spec: ScenarioSpec, endpoints: Endpoints, **attrs: Any) -> type[CqrsMachine]:
    """Return a ``CqrsMachine`` subclass bound to ``spec`` and ``endpoints``."""
    name = f"Cqrs{spec.variant.title().replace('-', '')}Machine"
    return bind(CqrsMachine, spec, endpoints, name, "the CQRS machine needs flow='kafka_cqrs'", **attrs)
