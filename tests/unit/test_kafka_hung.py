"""The watch over librdkafka calls that outlive their bound (``harness.clients.kafka.hung``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.clients.kafka.hung import HUNG_EXIT, CallWatch


def test_a_call_past_its_bound_and_grace_is_reported_once() -> None:
    hung: list[str] = []
    watch = CallWatch(0.05, hung.append, grace_s=0.05, every_s=0.01)
    watch.run("send_offsets_to_transaction", lambda: time.sleep(0.4))
    watch.close()
    assert len(hung) == 1
    assert hung[0].startswith("Kafka send_offsets_to_transaction still blocked 0 s into a call bounded at 0 s")
    assert "librdkafka issue 5456" in hung[0]


def test_calls_within_their_bound_are_not_reported_however_many() -> None:
    hung: list[str] = []
    watch = CallWatch(0.2, hung.append, grace_s=0.05, every_s=0.01)
    for _ in range(20):
        watch.run("commit_transaction", lambda: time.sleep(0.01))
    time.sleep(0.4)  # the watch goes on looking between calls: nothing is running
    watch.close()
    assert hung == []


def test_an_error_ends_the_watch_over_its_call() -> None:
    hung: list[str] = []
    watch = CallWatch(0.05, hung.append, grace_s=0.05, every_s=0.01)

    def fails() -> None:
        raise ValueError("broker said no")

    with pytest.raises(ValueError, match="broker said no"):
        watch.run("begin_transaction", fails)
    time.sleep(0.3)
    watch.close()
    assert hung == []


def test_by_default_a_hung_call_ends_the_process_with_its_own_code() -> None:
    code = (
        "import time; from harness.clients.kafka.hung import CallWatch; "
        "CallWatch(0.05, grace_s=0.05, every_s=0.01).run('send_offsets_to_transaction', lambda: time.sleep(30))"
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False)
    assert proc.returncode == HUNG_EXIT
    assert time.monotonic() - started < 10
    assert "ending the process so that its supervisor starts it again" in proc.stderr
