"""SIGTERM and SIGHUP interrupt like Ctrl-C: `finally` heals, children are stopped, one line, exit 3.

Each test runs a real process and signals it (no services needed): the `txchaos` main path, a
pytest session with the plugin, and `txchaos test` handing the signal on to its pytest child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended (code {proc.returncode}) before {path.name}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path.name} not written in {timeout}s")
        time.sleep(0.02)


def _start(args: list[str], cwd: Path, marker: Path) -> subprocess.Popen[str]:
    """Start ``args`` with its output captured and wait until it writes ``marker``."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(marker, proc)
    return proc


def _start_cli(tmp_path: Path, command: str, marker: str) -> subprocess.Popen[str]:
    """Start ``txchaos status`` in a child Python whose command runs ``command`` (``out`` is ``tmp_path``)."""
    body = textwrap.indent(textwrap.dedent(command), " " * 4)
    script = CLI_SCRIPT.format(out=str(tmp_path), body=body)
    return _start([sys.executable, "-c", script], REPO, tmp_path / marker)


def _terminate(proc: subprocess.Popen[str], child: int) -> tuple[str, str, bool]:
    """SIGTERM ``proc`` and collect its output; return it and whether ``child`` outlived it (then killed)."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        alive = _alive(child)
        _reap(child)
    return out, err, alive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    """Kill a process the old code would leave behind, so a failing test leaks nothing."""
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


# `txchaos status` with its command replaced by a long one ({body}): what the signal interrupts.
CLI_SCRIPT = """
import subprocess, sys, time
from pathlib import Path
import harness.cli as cli

out = Path({out!r})

def long_command(args):
{body}
    return 0

cli.cmd_status = long_command
sys.exit(cli.main(["status"]))
"""

# A pytest file whose session fixture stands for the stack: its teardown is the healing.
SESSION_TEST = """
import os, time
from pathlib import Path
import pytest

OUT = Path({out!r})

@pytest.fixture(scope="session")
def stack():
    (OUT / "pid").write_text(str(os.getpid()))
    yield
    (OUT / "stack-stopped").write_text("yes")

def test_long_run(stack):
    try:
        (OUT / "started").write_text("yes")
        time.sleep(60)
    finally:
        (OUT / "run-healed").write_text("yes")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_cli_main_heals_and_exits_3_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    command = """
        try:
            (out / "started").write_text("yes")
            time.sleep(60)
        finally:
            (out / "healed").write_text("yes")
    """
    proc = _start_cli(tmp_path, command, "started")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, (out, err)
    assert (tmp_path / "healed").exists()
    lines = [line for line in out.splitlines() if line.strip()]
    stopped = "every process the harness started has been stopped and every fault healed"
    assert lines == [f"terminated by {sig.name}; {stopped}"]


def test_an_error_raised_after_the_signal_is_kept_on_stderr(tmp_path: Path) -> None:
    """Healing that fails after a SIGTERM: the run still says it was terminated, and the error is not lost."""
    command = """
        from harness.errors import HarnessError
        try:
            (out / "started").write_text("yes")
            time.sleep(60)
        finally:
            raise HarnessError("the proxy would not heal")
    """
    proc = _start_cli(tmp_path, command, "started")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, (out, err)
    assert "terminated by SIGTERM" in out
    assert "txchaos: after the signal: HarnessError: the proxy would not heal" in err


def test_pytest_session_tears_down_and_exits_3_on_sigterm(tmp_path: Path) -> None:
    test_file = tmp_path / "test_long.py"
    test_file.write_text(SESSION_TEST.format(out=str(tmp_path)))
    pytest_args = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    proc = _start(pytest_args, tmp_path, tmp_path / "started")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (tmp_path / "run-healed").exists(), out + err
    assert (tmp_path / "stack-stopped").exists(), out + err
    assert proc.returncode == 3, out + err
    assert "txchaos: terminated by SIGTERM; every process the harness started has been stopped" in out


def test_txchaos_test_passes_sigterm_on_to_its_pytest_child(tmp_path: Path) -> None:
    test_file = tmp_path / "test_long.py"
    test_file.write_text(SESSION_TEST.format(out=str(tmp_path)))
    txchaos_args = [sys.executable, "-m", "harness.cli", "test", str(test_file), "-q", "-p", "no:cacheprovider"]
    proc = _start(txchaos_args, REPO, tmp_path / "started")
    out, err, alive = _terminate(proc, int((tmp_path / "pid").read_text()))
    assert not alive, "the pytest child outlived `txchaos test`"
    assert (tmp_path / "stack-stopped").exists(), out + err
    assert proc.returncode == 3, out + err
    assert "terminated by SIGTERM" in out


def test_cli_stops_a_child_no_healing_tracks(tmp_path: Path) -> None:
    # A JVM pyspark was still launching when the signal came is such a child: nothing tracks it.
    command = """
        child = subprocess.Popen(["sleep", "60"])
        (out / "child").write_text(str(child.pid))
        time.sleep(60)
    """
    proc = _start_cli(tmp_path, command, "child")
    out, err, alive = _terminate(proc, int((tmp_path / "child").read_text()))
    assert proc.returncode == 3, (out, err)
    assert not alive, "an untracked child outlived the terminated command"


def test_cli_leaves_multiprocessings_resource_tracker_to_end_by_itself(tmp_path: Path) -> None:
    # A benchmark's process crews start the tracker. Stopped with the other children, it is started
    # again at exit, and each name the crews unregister then prints a KeyError traceback.
    command = """
        import atexit
        from multiprocessing import shared_memory
        block = shared_memory.SharedMemory(create=True, size=64)
        atexit.register(lambda: (block.close(), block.unlink()))
        (out / "block").write_text(block.name)
        time.sleep(60)
    """
    proc = _start_cli(tmp_path, command, "block")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, (out, err)
    assert "Traceback" not in err, err
    assert "resource_tracker" not in err, err
    assert not Path("/dev/shm", (tmp_path / "block").read_text().lstrip("/")).exists()


def _send_five(sent: list[int], *, fail: bool = False) -> None:
    """Send five 'operations' in a deferred block, a SIGTERM arriving at the second; maybe fail after."""
    from harness.signals import deferred

    with deferred():
        for n in range(5):
            if n == 1:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler would have run by now, were it not held back
            sent.append(n)
        if fail:
            raise ValueError("send refused")
    sent.append(-1)  # never reached: the held signal is delivered as the block ends


def test_a_signal_inside_a_deferred_block_waits_for_the_block_then_interrupts() -> None:
    """A submission's sends all go out before the SIGTERM that came meanwhile interrupts the run."""
    from harness.signals import Terminated, terminating

    sent: list[int] = []
    with terminating(), pytest.raises(Terminated) as caught:
        _send_five(sent)
    assert sent == [0, 1, 2, 3, 4]
    assert caught.value.signum == signal.SIGTERM


def test_a_signal_held_while_a_deferred_block_fails_still_interrupts() -> None:
    """Asked to stop wins over the block's own error, which stays as the interrupt's context."""
    from harness.signals import Terminated, terminating

    sent: list[int] = []
    with terminating(), pytest.raises(Terminated) as caught:
        _send_five(sent, fail=True)
    assert sent == [0, 1, 2, 3, 4]
    assert isinstance(caught.value.__context__, ValueError)


def test_a_signal_a_library_turned_into_its_own_error_still_reads_as_terminated() -> None:
    """DuckDB checks for signals inside a query and raises its own error: the run still says it was stopped.

    A real DuckDB query, interrupted by a real SIGTERM: without this, the CLI printed the query's
    error wrapped as a harness failure (exit 3, nothing on stdout) instead of the termination line.
    DuckDB 2 lets the query run to its end after the handler raised (minutes here): the handler
    must stop the engine's connection itself.
    """
    from harness.signals import Terminated

    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    with pytest.raises(Terminated) as caught:
        _a_long_query(timer)
    timer.cancel()
    assert caught.value.signum == signal.SIGTERM
    assert isinstance(caught.value.__cause__, RuntimeError)


def _a_long_query(timer: threading.Timer) -> None:
    """Run a query of minutes on the in-process engine's connection under ``terminating``, its error
    wrapped as ``judge_folder`` wraps the engine's."""
    from harness.signals import terminating
    from harness.verify.checker import connect

    with terminating(), connect() as con:
        timer.start()
        try:
            con.execute("select count(*) from range(100000000000) t(i) where i % 7 = 3").fetchall()
        except Exception as exc:
            raise RuntimeError(f"verifying failed: {exc}") from exc


def _pyspark_like(ran: list[int]) -> Callable[[int, FrameType | None], None]:
    """A SIGINT handler of another program's, as every SparkContext installs: its work, then raise."""

    def handler(signum: int, frame: FrameType | None) -> None:
        ran.append(signum)  # PySpark cancels its jobs here
        raise KeyboardInterrupt

    return handler


@pytest.mark.parametrize("handler", ["python's own", "another program's"])
def test_ctrl_c_stops_a_running_query_at_once_and_reads_as_an_interrupt(handler: str) -> None:
    """Ctrl-C during a verdict's query: DuckDB 2 would run the query to its end, then raise its own
    "Query interrupted" (a RuntimeError the CLI printed as a harness failure). The query stops now
    and the caller sees Ctrl-C's KeyboardInterrupt, not a ``Terminated`` and not the wrapped error,
    whoever handles SIGINT (a Spark session started earlier in the process installs PySpark's)."""
    from harness.signals import Terminated

    ran: list[int] = []
    chosen = signal.default_int_handler if handler == "python's own" else _pyspark_like(ran)
    before = signal.signal(signal.SIGINT, chosen)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            _a_long_query(timer)
        timer.cancel()
        assert signal.getsignal(signal.SIGINT) is chosen  # given back as it was
    finally:
        signal.signal(signal.SIGINT, before)
    assert time.monotonic() - started < 30  # the query alone runs for minutes
    assert not isinstance(caught.value, Terminated)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert ran == ([] if handler == "python's own" else [signal.SIGINT])  # the other's work still done


def _stopped_query(stopped: list[str], name: str, reason: BaseException | None) -> None:
    """A block that registers a stop, is interrupted for ``reason`` (when given), then fails."""
    from harness.interrupts import interrupt_all, interruptible

    with interruptible(lambda: stopped.append(name)):
        if reason is not None:
            interrupt_all(reason)
        raise RuntimeError("Query interrupted")


def test_an_error_of_an_interruptible_block_is_its_own_until_an_interrupt_stopped_it() -> None:
    stopped: list[str] = []
    with pytest.raises(RuntimeError, match="Query interrupted"):
        _stopped_query(stopped, "a", None)
    reason = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as caught:
        _stopped_query(stopped, "b", reason)
    assert caught.value is reason
    assert stopped == ["b"]  # the first block's stop left the registry with its block
