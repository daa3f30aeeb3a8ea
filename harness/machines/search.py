"""Run a bound machine the two ways a scenario file does: hunt a bad variant, hold a fixed one.

A hunt must end in a counterexample that carries what replays it; a fixed variant must come
through a whole profile of examples with a clean verdict on the last run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import Phase, settings
from hypothesis.errors import FlakyFailure, FlakyStrategyDefinition
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from harness.machines.base import MachineBase, SearchOver
from harness.machines.profiles import profile
from harness.machines.targets import Target
from harness.stack.base import Endpoints

log = logging.getLogger("txchaos.machines")

# What a machine's failure carries so that it can be replayed (``MachineBase`` adds them).
REPLAY = ("seed:", "steps:", "run folder:")


def hunt_settings(cap: int) -> settings:
    """Return the settings of a hunt: at most ``cap`` examples, explicit and generated only.

    No shrinking (each step of a shrink is a real run) and no example database: the first
    counterexample found is reported as it is, and every hunt starts afresh.
    """
    return settings(profile(), max_examples=cap, database=None, phases=[Phase.explicit, Phase.generate])


def find_counterexample(machine: type[RuleBasedStateMachine], search: settings) -> str:
    """Run ``machine`` under ``search``; return the text of the failure it found, or "".

    A failure judged in the teardown of an example that had run out of choices never reaches
    Hypothesis (its StopTest came first). The machine keeps it; a search that does not shrink ends
    at the next example (``SearchOver``), one that shrinks goes on for a failure it can shrink, and
    either returns the kept one when it ends without another.

    Hypothesis runs a failing example once more to report it. Against real services that replay
    may meet other timing (a trap that fired first no longer does) and pass; Hypothesis then raises
    FlakyFailure around the first failure. That first failure is the counterexample, with its run
    folder, seed and steps, so it is returned as if the replay had failed too.
    """
    if issubclass(machine, MachineBase):
        machine.stop_on_dropped = Phase.shrink not in search.phases
    try:
        run_state_machine_as_test(machine, settings=search)
    except (SearchOver, FlakyStrategyDefinition) as stop:
        over = _search_over(stop)
        if over is None:
            raise
        log.info("%s: Hypothesis dropped a failing example that ran out of choices; reporting it", machine.__name__)
        return str(over)
    except AssertionError as failure:
        return str(failure)
    except FlakyFailure as flaky:
        failures, _ = flaky.split(AssertionError)
        if failures is None:
            raise
        first: BaseException = failures
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        log.info("%s: the counterexample passed on Hypothesis's replay; reporting the first failure", machine.__name__)
        return str(first)
    if issubclass(machine, MachineBase) and machine.dropped is not None:
        message, machine.last_steps = machine.dropped  # its steps, as after any failure
        return message
    return ""


def _search_over(error: BaseException) -> SearchOver | None:
    """Return the ``SearchOver`` that ``error`` is or was raised while handling, if any.

    Hypothesis sees the example that raised it stop drawing before the ones it had seen, and
    raises FlakyStrategyDefinition while handling it.
    """
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, SearchOver):
        seen = seen.__cause__ or seen.__context__
    return seen


def hunt(machine: type[MachineBase[Any]], cap: int) -> str:
    """Search ``machine`` in at most ``cap`` examples and return the text of the failure it finds.

    Raise AssertionError when it finds none, or when the failure does not carry what replays it.
    """
    text = find_counterexample(machine, hunt_settings(cap))
    if not text:
        raise AssertionError(f"{machine.__name__} found no counterexample in {cap} examples")
    missing = [part for part in REPLAY if part not in text]
    if missing:
        raise AssertionError(f"the failure does not carry {missing}: {text}")
    return text


def hunt_target(target: Target, endpoints: Endpoints, cap: int) -> tuple[str, tuple[int, float]]:
    """Hunt ``target``'s bad variant on ``endpoints`` in at most ``cap`` examples.

    Return the failure's text and where it was found (example number, seconds since the search
    started: what ``txchaos bench machines`` measures). Raise AssertionError as ``hunt`` does, or
    when the text does not match the target's anomaly (a regular expression).
    """
    machine = target.machine(target.bad, endpoints, **target.attrs)
    text = hunt(machine, cap)
    if not re.search(target.anomaly, text):
        raise AssertionError(f"the failure does not name {target.anomaly!r}: {text}")
    if machine.found_at is None:
        raise AssertionError(f"{machine.__name__} failed but kept no found_at: {text}")
    return text, machine.found_at


def check_failure_text(message: str, anomaly: str, flagged: Iterable[str], steps: Sequence[str], run_dir: Path) -> None:
    """Raise AssertionError unless ``message`` names every ``flagged`` operation and carries what replays it.

    What replays it: a seed, the ``steps`` taken (in order) and the run folder ``run_dir``.
    """
    wanted = {
        "the flagged operations": f"{anomaly}: {', '.join(sorted(flagged))}",
        "the steps": "steps: " + " -> ".join(steps),
        "the run folder": f"run folder: {run_dir}",
    }
    missing = [what for what, part in wanted.items() if part not in message]
    if not re.search(r"seed: \d+", message):
        missing.append("a seed")
    if missing:
        raise AssertionError(f"the failure does not carry {', '.join(missing)}: {message}")


def holds(machine: type[MachineBase[Any]]) -> str:
    """Run ``machine`` for its profile's examples; raise AssertionError unless its last run is clean.

    Return how many requested faults fired over the examples (``MachineBase.fired_summary``): a
    fixed variant that held proves something only where its faults fired.
    """
    run_state_machine_as_test(machine, settings=settings(profile(), database=None))
    if machine.examples < profile().max_examples:
        raise AssertionError(f"{machine.__name__} ran {machine.examples} of {profile().max_examples} examples")
    if machine.last_result is None:
        raise AssertionError(f"{machine.__name__} kept no result")
    if not machine.last_result.verdict.anomaly_free:
        raise AssertionError(machine.last_result.verdict.headline())
    summary = machine.fired_summary()
    log.info("%s: %s", machine.__name__, summary)
    return summary
