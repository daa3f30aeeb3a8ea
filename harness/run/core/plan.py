"""A spec as steps: what ``RunSession.drive`` applies, one step at a time.

Start the workers, arm the spec's crashes, submit up to each fault window and hold it, submit the
rest. A window the submissions can pass carries them up to the next window while it is open, so
operations are in flight under it however fast the flow drained the ones before (``Open``,
``Submit``, ``Wait``, ``Heal``): a fault that only slows the network (``slows_only``: latency,
bandwidth, slicing, a slow close), or one on a proxy the submissions do not pass
(``submits_via``: a reset of Postgres under an ActiveMQ flow). One that cuts their way (a reset
or a partition of the broker's proxy, a broker kill) is held, the submissions waiting until it is
healed. Submissions are drawn lazily: each counts what the steps before it sent (``submitted``),
so an operation a flow must submit alone (a saga a crash names) goes alone, idle before and after.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

from harness.run.spec.scenario import NETWORK_TARGETS, FaultWindow, ScenarioSpec
from harness.run.spec.steps import Arm, Heal, Hold, Idle, Open, Start, Step, Submit, Wait


def plan(
    spec: ScenarioSpec,
    *,
    late: bool,
    alone: set[int],
    submitted: Callable[[], int],
    submits_via: Collection[str] = NETWORK_TARGETS,
) -> Iterator[Step]:
    """Yield ``spec`` as steps; ``late``: the workers join after a first backlog (the first window's);
    ``submits_via``: the proxies the flow's submissions pass (by default every one)."""
    windows = sorted(spec.faults, key=lambda w: w.after_ops)
    if not late:
        yield Start()
    for crash in spec.crashes:
        yield Arm(crash)
    if late:
        # A backlog before the group joins: its polled batches are the same on every run of a seed.
        yield from submissions(min([w.after_ops for w in windows] or [spec.messages]), alone, submitted)
        yield Start()
    for i, window in enumerate(windows):
        yield from submissions(window.after_ops, alone, submitted)
        if _carries(window, submits_via):
            following = windows[i + 1].after_ops if i + 1 < len(windows) else spec.messages
            yield Open(window.fault, window.target)
            yield from submissions(following, alone, submitted)
            yield Wait(window.hold_s)
            yield Heal()
        else:
            yield Hold(window.fault, window.target, window.hold_s)
    yield from submissions(spec.messages, alone, submitted)


def _carries(window: FaultWindow, submits_via: Collection[str]) -> bool:
    """Whether submissions go on under ``window``: it only slows, or cuts a proxy they do not pass."""
    return bool(getattr(window.fault, "slows_only", False)) or (
        window.target is not None and window.target not in submits_via
    )


def submissions(count: int, alone: set[int], submitted: Callable[[], int]) -> Iterator[Step]:
    """Yield submissions until ``count`` operations are out; one ``alone`` names goes alone, idle around it."""
    while (n := submitted()) < count:
        if n in alone:
            yield from (Idle(), Submit(1), Idle())
        else:
            yield Submit(min([a for a in alone if n < a < count] or [count]) - n)
