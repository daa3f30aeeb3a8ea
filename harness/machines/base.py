"""The state-machine base every pattern's machine builds on: one run per example, judged in teardown.

What every machine shares lives here once: the step log and the counters a benchmark reads
(``examples``, ``found_at``, ``last_steps``, ``last_result``), the one way network faults are
applied (a ``harness.faults`` fault through ``active``: kept until ``heal_network`` or held for
a while), the "no duplicate effect" watch, and the teardown template: heal, close the run,
``judge`` it, and fail with the run folder, the seed and the step list. A machine keeps only its
own rules, its ``open_session`` and its ``judge``; every machine has the ``submit(n)`` rule (``n``
operations, or sagas, or transfers, with nothing armed); ``NetworkMachine`` adds the two network rules
(``slow_network``, ``heal_network``) a machine without rules of its own for faults uses:

>>> class MyMachine(MachineBase[RunSession]):
...     def open_session(self, spec): return RunSession(spec, type(self).endpoints).open()
...     def judge(self, result): return None if result.verdict.anomaly_free else result.verdict.headline()
>>> Machine = bind(MyMachine, spec, endpoints, "MyNaiveMachine")
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.errors import ConfigError
from harness.faults import Latency
from harness.ledger.writer import LedgerWriter
from harness.run.core.folder import RunFolder
from harness.run.core.outcome import RunResult
from harness.run.spec.scenario import ScenarioSpec
from harness.run.spec.steps import Heal, Open, Step, Submit
from harness.stack.base import Endpoints
from harness.verify.fired import fired_count
from harness.verify.verdict import Verdict


class MachineRun(Protocol):
    """What the base needs of a machine's run session (each machine's rules need more of theirs)."""

    def apply(self, step: Step) -> None: ...

    @property
    def ledger(self) -> LedgerWriter: ...

    @property
    def folder(self) -> RunFolder: ...

    def close(self) -> RunResult: ...

    def duplicate_effects(self) -> list[str]: ...

    def submit(self, count: int, /) -> Any: ...


S = TypeVar("S", bound=MachineRun)


class SearchOver(BaseException):
    """End a search whose counterexample Hypothesis dropped; the message is that failure's.

    A BaseException, as KeyboardInterrupt is, so that Hypothesis does not take it for a failure
    of the test and go on; ``search.find_counterexample`` catches it.
    """


def _overran() -> bool:
    """Return whether Hypothesis already concluded the running example (it ran out of choices)."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        data = getattr(current_build_context(), "data", None)
    except InvalidArgument:  # not inside a Hypothesis example
        return False
    return bool(getattr(data, "frozen", False))


class MachineBase(RuleBasedStateMachine, Generic[S]):
    """Drive one run per example of ``spec`` against ``endpoints`` (class attributes, set by ``bind``)."""

    spec: ClassVar[ScenarioSpec]
    endpoints: ClassVar[Endpoints]
    # The names of the flows this machine drives; ``bind`` refuses a spec on any other.
    flows: ClassVar[tuple[str, ...]] = ()
    # An example's run is given at most this long to settle: a stuck program must not stall the search.
    timeout_cap_s: ClassVar[float] = 20.0
    # The steps of the last example, in order: after a failure, the shrunk counterexample.
    last_steps: ClassVar[list[str]] = []
    last_result: ClassVar[RunResult | None] = None
    examples: ClassVar[int] = 0
    # Per example (its number -> (faults fired, faults requested)), from the verdict's accounting:
    # an example whose arms never fired searched nothing, and the report says how many did.
    fired: ClassVar[dict[int, tuple[int, int]]] = {}
    # When the first counterexample appeared (example number, seconds since the first example):
    # the rest of the examples are Hypothesis shrinking it.
    found_at: ClassVar[tuple[int, float] | None] = None
    started_at: ClassVar[float | None] = None
    # A failure Hypothesis dropped, with its steps: one raised in the teardown of an example that
    # had run out of choices (an overrun: its StopTest came first). The run was real; its folder replays it.
    dropped: ClassVar[tuple[str, list[str]] | None] = None
    # Whether the example after a dropped failure ends the search (``SearchOver``): a search that
    # does not shrink has nothing left to find (``search.find_counterexample`` sets it).
    stop_on_dropped: ClassVar[bool] = False
    # A machine's own per-class state and its starting values, e.g. ``{"first_failure": None}``.
    own_state: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        if cls.stop_on_dropped and cls.dropped is not None:
            raise SearchOver(cls.dropped[0])
        cls.examples += 1
        if cls.started_at is None:
            cls.started_at = time.monotonic()
        self.began = time.monotonic()
        cls.last_steps = []
        self.begin_example()
        spec = replace(cls.spec, seed=cls.examples, settle_s=0.2, timeout_s=min(cls.spec.timeout_s, cls.timeout_cap_s))
        self.run: S = self.open_session(spec)
        self.kept_faults: list[str] = []
        self.first_duplicate: tuple[int, list[str]] | None = None
        note(f"run folder: {self.run.folder.path}")

    # -- hooks ---------------------------------------------------------------------------------
    @classmethod
    def fresh_state(cls) -> dict[str, Any]:
        """Return the class attributes a newly bound machine starts from: the counters, then ``own_state``."""
        counters: dict[str, Any] = {
            "last_steps": [],
            "last_result": None,
            "examples": 0,
            "fired": {},
            "found_at": None,
            "started_at": None,
            "dropped": None,
            "stop_on_dropped": False,
        }
        return {**counters, **copy.deepcopy(cls.own_state)}

    def begin_example(self) -> None:
        """Reset what a machine keeps per example, before its run opens."""

    def open_session(self, spec: ScenarioSpec) -> S:
        """Return this example's run, open: the one place a machine names its session class."""
        raise NotImplementedError(f"{type(self).__name__} must define open_session(spec)")

    def judge(self, result: RunResult) -> str | None:
        """Return what is wrong with the closed run (the failure's first lines), or None when it holds."""
        raise NotImplementedError(f"{type(self).__name__} must define judge(result)")

    def any_anomaly(self, result: RunResult) -> str | None:
        """Return the verdict's headline when it has any anomaly or a duplicate effect was seen meanwhile."""
        verdict = result.verdict
        note(f"verdict: {verdict.headline()}")
        seen = ""
        if self.first_duplicate is not None:
            step, ops = self.first_duplicate
            seen = f"\nduplicate-effect on {ops} already after step {step}"
        # an arm the example never reached is the search's business, not a counterexample
        return f"{verdict.headline()}{seen}" if not verdict.anomaly_free or seen else None

    @classmethod
    def fired_summary(cls) -> str:
        """Return how many requested faults fired over the examples so far, and in how many examples none did.

        ``faults fired: 31 of 40 requested in 25 examples (3 examples fired none of theirs)``
        """
        fired = sum(f for f, _ in cls.fired.values())
        asked = sum(a for _, a in cls.fired.values())
        idle = sum(1 for f, a in cls.fired.values() if a and not f)
        examples = len(cls.fired)
        return (
            f"faults fired: {fired} of {asked} requested in {examples} examples ({idle} examples fired none of theirs)"
        )

    def remember(self, message: str, result: RunResult) -> None:
        """Keep the first counterexample, for machines whose replay may meet other timing."""

    # -- the rule every machine has -------------------------------------------------------------
    @rule(n=st.integers(min_value=1, max_value=3))
    def submit(self, n: int) -> None:
        """Submit ``n`` operations with nothing armed."""
        self._step(f"submit({n})")
        self.do(Submit(n))

    # -- the step log and faults ---------------------------------------------------------------
    def _step(self, text: str) -> None:
        """Log the rule as Hypothesis prints it (the counterexample's program, step by step)."""
        type(self).last_steps.append(text)

    def do(self, *steps: Step) -> None:
        """Apply ``steps`` to the example's run: the run folder records them, ``replay`` runs them again."""
        for step in steps:
            self.run.apply(step)
            if isinstance(step, Open):
                self.kept_faults.append(f"{step.fault!r} on {step.target}")
            elif isinstance(step, Heal):
                self.kept_faults.clear()

    def _heal(self) -> None:
        if self.kept_faults:
            self.do(Heal())  # heals in reverse order, each recorded; the stack is reusable after

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def no_duplicate_effect(self) -> None:
        """Note the first duplicate effect after every step; the failure is raised in ``teardown``.

        A real flow's timing varies: the same program may show its duplicate after step 2 on one
        run and after step 3 on the replay. Raising here would make the example stop at a
        different step each time, which Hypothesis rejects as flaky data generation and cannot
        shrink. The step where it was first seen is kept and reported.
        """
        if self.first_duplicate is None:
            duplicated = self.run.duplicate_effects()
            if duplicated:
                self.first_duplicate = (len(type(self).last_steps), duplicated)
                note(f"duplicate-effect on {duplicated} after step {len(type(self).last_steps)}")

    def _violated(self, message: str, result: RunResult) -> None:
        """Fail the example. One raise site on purpose: Hypothesis tells failures apart by where
        they are raised, and every anomaly of a program must shrink as one bug, not as several."""
        cls = type(self)
        if cls.found_at is None and cls.started_at is not None:
            cls.found_at = (cls.examples, time.monotonic() - cls.started_at)
        if cls.dropped is None and _overran():
            cls.dropped = (message, list(cls.last_steps))
        self.remember(message, result)
        raise AssertionError(message)

    def teardown(self) -> None:
        try:
            self._heal()
        finally:
            result = self.run.close()  # quiescence, residue, verdict; heals the run in any case
        cls = type(self)
        cls.last_result = result
        fired, asked = cls.fired[cls.examples] = fired_count(result.verdict.faults)
        note(f"faults fired: {fired} of {asked} requested")
        problem = self.judge(result)
        if problem is not None:
            self._violated(
                f"{problem}\nfaults fired: {fired} of {asked} requested\n"
                f"run folder: {result.run_dir}\nseed: {result.verdict.seed}\n"
                f"steps: {' -> '.join(cls.last_steps)}",
                result,
            )


class NetworkMachine(MachineBase[S]):
    """A machine with the shared network rules: slow a proxy of ``network_proxies``, heal them all."""

    # The proxies ``slow_network`` may slow (a subclass names at least one).
    network_proxies: ClassVar[tuple[str, ...]] = ()

    @rule(data=st.data(), latency_ms=st.sampled_from([20, 150]))
    def slow_network(self, data: st.DataObject, latency_ms: int) -> None:
        proxy = data.draw(st.sampled_from(type(self).network_proxies), label="proxy")
        self._step(f"slow_network({proxy!r}, {latency_ms})")
        self.do(Open(Latency(latency_ms, jitter_ms=10), proxy))

    @precondition(lambda self: bool(self.kept_faults))
    @rule()
    def heal_network(self) -> None:
        self._step("heal_network()")
        self._heal()


def failure(broken: list[str], verdict: Verdict) -> str | None:
    """Return the failure's first lines: what is ``broken``, then every flagged operation per class."""
    if not broken:
        return None
    flagged = "".join(f"\n{a}: {', '.join(sorted(verdict.ops(a)))}" for a in verdict.found())
    return f"{'; '.join(broken)}{flagged}"


M = TypeVar("M", bound=MachineBase[Any])


def bind(machine: type[M], spec: ScenarioSpec, endpoints: Endpoints, name: str, hint: str, **attrs: Any) -> type[M]:
    """Return a subclass of ``machine`` bound to ``spec`` and ``endpoints``, with fresh counters.

    ``hint`` says which machine to use instead when ``spec`` runs on a flow ``machine`` does not drive.
    """
    if spec.flow.name not in machine.flows:
        raise ConfigError(
            f"{spec.label} runs on {spec.flow.name!r}, which {machine.__name__} does not drive", hint=hint
        )
    if not isinstance(endpoints, Endpoints):
        raise ConfigError(
            f"endpoints must be an Endpoints object, not {type(endpoints).__name__}",
            hint="pass the txchaos_stack fixture's value",
        )
    namespace: dict[str, Any] = {
        **machine.fresh_state(),
        "spec": spec,
        "endpoints": endpoints,
        **attrs,
        # Hypothesis prints a failing program as code that imports the machine from here.
        "__module__": os.environ.get("TXCHAOS_MACHINE_MODULE", machine.__module__),
    }
    return type(name, (machine,), namespace)
