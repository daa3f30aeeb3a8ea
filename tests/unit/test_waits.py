"""wait_each: the stack providers' parallel readiness waits."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.errors import StackError
from harness.stack.procs import Managed
from harness.stack.waits import Wait, wait_each


def test_the_waits_overlap_and_each_runs_once() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def wait(service: str) -> None:
        time.sleep(0.2)
        with lock:
            seen.append(service)

    started = time.monotonic()
    wait_each(("postgres", "activemq", "kafka", "dtm"), wait)
    assert sorted(seen) == ["activemq", "dtm", "kafka", "postgres"]
    assert time.monotonic() - started < 0.6  # in parallel: about one wait, not four


def test_an_error_is_raised_once_every_wait_has_ended() -> None:
    ended: list[str] = []

    def wait(service: str) -> None:
        if service == "kafka":
            raise StackError("kafka never answered", hint="read its log")
        time.sleep(0.2)
        ended.append(service)

    with pytest.raises(StackError, match="kafka never answered"):
        wait_each(("postgres", "kafka", "dtm"), wait)
    assert sorted(ended) == ["dtm", "postgres"]  # none left probing behind the caller


def test_a_fatal_log_line_ends_the_wait_at_once_although_the_process_stays_up(tmp_path: Path) -> None:
    log = tmp_path / "dtm.log"
    log.write_text('{"msg":"start server err: listen tcp 127.0.0.1:36789: bind: address already in use"}\n')
    proc = subprocess.Popen(["sleep", "60"])
    try:
        managed = Managed(name="dtm", popen=proc, log_path=log, record=tmp_path / "record", tag="test")
        wait = Wait("dtm HTTP API", lambda: False, timeout=30, fatal=("address already in use",))
        started = time.monotonic()
        with pytest.raises(StackError, match="logged 'address already in use'; it will not answer") as caught:
            wait.run(managed)
        assert time.monotonic() - started < 5
        assert "127.0.0.1:36789" in str(caught.value)  # the log tail names the port
    finally:
        proc.kill()
        proc.wait()
