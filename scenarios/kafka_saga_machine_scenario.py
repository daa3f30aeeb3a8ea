"""The Kafka saga's Hypothesis state machine against real Kafka and Postgres.

Rules (``harness.machines.saga``): start sagas, a refused seat (semantic error), a flaky seat
(one transient failure, or one on every attempt: dead-lettered), a crash in the orchestrator,
the payment or the seat participant after the poll, after the DB commit (its output not
produced) or before the offset commit, latency on the Kafka or Postgres proxy. Invariants after
quiescence: every saga final (``completed`` / ``compensated``), no step applied twice.

- ``naive``: inbox-less participants replying after their DB commit -> caught as
  ``duplicate-effect`` on a ``<saga>.pay`` or ``<saga>.seat`` whose participant was killed
  after its DB commit or before its offset commit
- ``naive-unique``: a unique key on the step id, no dead-letter recovery in the orchestrator
  -> caught as ``stuck`` on a saga (its redelivered step refused by the key, dead-lettered)
- ``fixed``: inbox participants replying in a Kafka transaction with the offset, an
  orchestrator that re-sends a crashed record's request and reads the dead-letter topics ->
  holds for the profile's examples (ci: 15)

Run it: ``pytest scenarios/kafka_saga_machine_scenario.py`` (``TXCHAOS_PROFILE=dev|ci|nightly``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness import Endpoints, ScenarioSpec
from harness.machines.saga import saga_machine
from harness.machines.search import check_failure_text, find_counterexample, holds, hunt_settings
from harness.run.spec.files import resolve

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
SEARCH_CAP = 40


def machine_spec(variant: str, hunt: str | None = None, **saga: object) -> ScenarioSpec:
    """Return the saga spec the machine drives: no scripted crash, refusal or flaky seat.

    ``hunt``: the anomaly a bad variant's search hunts (its examples fail on that class only).
    """
    (base,) = resolve("kafka_saga:fixed", 0, Path(__file__).parent)
    options = {k: v for k, v in base.options.items() if k not in ("refuse_seat", "flaky_seat")}
    expect = frozenset({hunt} if hunt else ())
    return replace(base, variant=variant, crashes=(), expect=expect, options={**options, "backoff_ms": 50, **saga})


# variant -> (spec, the anomaly it must be caught with, the step suffixes it may name, the rules
# that can cause it: a participant's redelivery after a crash; for naive-unique also a seat
# dead-lettered after its retries, which nobody reads)
BAD: dict[str, tuple[ScenarioSpec, str, tuple[str, ...], tuple[str, ...]]] = {
    "naive": (
        machine_spec("naive", "duplicate-effect", participant="naive", reply="after_commit"),
        "duplicate-effect",
        (".pay", ".seat"),
        ("arm_crash(",),
    ),
    "naive-unique": (
        machine_spec("naive-unique", "stuck", participant="unique", reply="after_commit", dlt_replies=False),
        "stuck",
        ("",),
        ("arm_crash(", "flaky_seat(9)"),
    ),
}


@pytest.mark.parametrize("variant", list(BAD))
def test_bad_variant_is_caught(txchaos_stack: Endpoints, variant: str) -> None:
    spec, anomaly, suffixes, causes = BAD[variant]
    machine = saga_machine(spec, txchaos_stack)
    # The counterexample is first_failure even when Hypothesis's replay of it met other timing.
    # An error that is not a failed check (a broken stack) is raised as it is, not swallowed.
    found = find_counterexample(machine, hunt_settings(SEARCH_CAP))
    assert machine.first_failure is not None, found or f"no counterexample in {SEARCH_CAP} examples"
    message, result, steps = machine.first_failure
    verdict = result.verdict
    assert anomaly in verdict.found(), verdict.headline()
    flagged = verdict.ops(anomaly)
    assert flagged
    pattern = re.compile(
        r"^" + re.escape(spec.variant) + r"-s\d+-op\d{5}(" + "|".join(map(re.escape, suffixes)) + r")$"
    )
    assert all(pattern.match(op) for op in flagged), flagged
    assert any(s.startswith(causes) for s in steps), steps
    check_failure_text(message, anomaly, flagged, steps, result.run_dir)


def test_fixed_saga_holds(txchaos_stack: Endpoints) -> None:
    machine = saga_machine(machine_spec("fixed"), txchaos_stack)
    holds(machine)
