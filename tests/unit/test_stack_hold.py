"""One run at a time on a stack: a second is refused, told who holds it, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.run.spec.files import resolve
from harness.stack.base import Endpoints
from harness.stack.hold import StackHold
from tests.unit.fake_endpoints import fake_endpoints


def _stack(tmp_path: Path) -> Endpoints:
    state = tmp_path / "state"
    state.mkdir()
    return replace(fake_endpoints(), state_dir=str(state))


def test_a_second_holder_is_refused_naming_the_first_and_let_in_once_it_lets_go(tmp_path: Path) -> None:
    ep = _stack(tmp_path)
    first = StackHold(ep, "the run reports/runs/soak-1")
    with pytest.raises(ConfigError) as refused:
        StackHold(ep, "a reset between tests")
    text = str(refused.value)
    assert "stack s1 is in use by the run reports/runs/soak-1 (pid" in text
    assert "empty its tables" in text
    assert "txchaos up" in (refused.value.hint or "")
    first.release()
    first.release()  # harmless
    with StackHold(ep, "a reset between tests") as second:
        assert second.held
    assert not second.held


def test_a_holder_killed_with_sigkill_leaves_the_stack_free(tmp_path: Path) -> None:
    ep = _stack(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from harness.stack.base import Endpoints
            from harness.stack.hold import StackHold
            hold = StackHold(Endpoints.from_json({ep.to_json()!r}), "a soak")
            print("held", flush=True)
            time.sleep(300)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match="in use by a soak"):
        StackHold(ep, "a second soak")
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    StackHold(ep, "a second soak").release()


def test_a_run_on_a_held_stack_is_refused_before_it_touches_the_stack_and_leaves_no_folder(tmp_path: Path) -> None:
    from harness.run.core.session import RunSession

    ep = _stack(tmp_path)
    runs = tmp_path / "runs"
    (spec,) = resolve("onepc_crash_gap:naive", 0)
    with StackHold(ep, "the run reports/runs/soak-1"):
        session = RunSession(spec, ep, runs_root=runs)  # no stack answers: opening would be its first contact
        with pytest.raises(ConfigError, match="in use by the run reports/runs/soak-1"):
            session.open()
    assert list(runs.iterdir()) == []
