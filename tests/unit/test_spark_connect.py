"""The stack's Spark Connect server: loopback only, found through the stack, and running the same job."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.stack import spark_connect
from harness.stack.procs import start_time
from tests.unit.fake_endpoints import fake_endpoints


@pytest.fixture
def listener() -> Iterator[int]:
    """Yield the port of a loopback socket that accepts connections (a stand-in for a server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``tmp_path/stack`` the folder of the stack ``$TXCHAOS_ENDPOINTS`` names; return it."""
    state = tmp_path / "stack"
    monkeypatch.delenv(spark_connect.ENV, raising=False)
    endpoints = replace(fake_endpoints(), stack_id=f"unit-{os.getpid()}", state_dir=str(state))
    monkeypatch.setenv("TXCHAOS_ENDPOINTS", str(endpoints.save(state / "endpoints.json")))
    return state


def test_server_binds_loopback_only(tmp_path: Path) -> None:
    argv = spark_connect.server_argv(Path("/spark"), 15002, tmp_path, tmp_path / "log4j2.properties")
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    assert confs["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert confs["spark.connect.grpc.binding.port"] == "15002"
    assert confs["spark.driver.bindAddress"] == "127.0.0.1"
    assert confs["spark.ui.enabled"] == "false"
    assert argv[argv.index("--class") + 1] == spark_connect.SERVER_CLASS


def test_address_only_when_the_recorded_server_answers(tmp_path: Path, listener: int) -> None:
    assert spark_connect.address(tmp_path) is None  # no record
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        gone = closed.getsockname()[1]
    (tmp_path / spark_connect.RECORD).write_text(json.dumps({"url": f"sc://127.0.0.1:{gone}"}))
    assert spark_connect.address(tmp_path) is None  # recorded, but nothing listens there
    (tmp_path / spark_connect.RECORD).write_text(json.dumps({"url": f"sc://127.0.0.1:{listener}"}))
    assert spark_connect.address(tmp_path) == f"sc://127.0.0.1:{listener}"
    (tmp_path / spark_connect.RECORD).write_text("{not json")
    assert spark_connect.address(tmp_path) is None


def test_current_address_is_the_running_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: int) -> None:
    state = _stack(tmp_path, monkeypatch)
    assert spark_connect.current_address() is None  # the stack runs no server
    (state / spark_connect.RECORD).write_text(json.dumps({"url": f"sc://127.0.0.1:{listener}"}))
    assert spark_connect.current_address() == f"sc://127.0.0.1:{listener}"
    assert "not started (--no-spark)" in spark_connect.up(state, "unit", enabled=False)
    monkeypatch.setenv(spark_connect.ENV, "off")  # the benchmark's cold CLI: a local JVM whatever runs
    assert spark_connect.current_address() is None
    monkeypatch.setenv(spark_connect.ENV, "sc://127.0.0.1:1")
    assert spark_connect.current_address() == "sc://127.0.0.1:1"
    monkeypatch.setenv(spark_connect.ENV, "127.0.0.1:1")
    with pytest.raises(ConfigError, match="neither off nor sc://"):
        spark_connect.current_address()


@pytest.mark.spark
def test_verify_runs_on_the_stacks_server_and_down_stops_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark.sql.connect.session")
    from harness.ledger.synth import synth_run
    from harness.verify import checker
    from harness.verify.cli import contract_of

    state = _stack(tmp_path, monkeypatch)
    stack_id = f"unit-{os.getpid()}"
    # 60 fault windows, as a long run has: a Connect client sends its plan as nested messages, and
    # a mask of 60 windows built of nested Columns was refused by the server as too deep
    run = synth_run(tmp_path / "run", 20_000, seed=5, anomaly_rate=0.02, windows=60)
    try:
        line = spark_connect.up(state, stack_id, warm=[sys.executable, "-m", "harness.verify.spark.warm"])
        assert "spark connect: sc://127.0.0.1:" in line, line
        pid = json.loads((state / spark_connect.RECORD).read_text())["pid"]
        # the warm-up verifies a small ledger through the server in the background, and exits
        warm_log = state / "logs" / "spark-connect-warm.log"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and warm_log.read_text().count("warm-up job") < 2:
            if "Traceback" in warm_log.read_text():
                break
            time.sleep(0.5)
        assert warm_log.read_text().count("warm-up job") == 2, warm_log.read_text()[-2000:]
        # a child process: a Connect client switches its whole process to Connect mode
        code = "import sys; from harness.cli import main; sys.exit(main())"
        proc = subprocess.run(
            [sys.executable, "-c", code, "verify", str(run)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr  # anomalies found
        assert "via the stack's Spark Connect server" in proc.stdout
        spark_verdict = json.loads((run / "verdict-spark.json").read_text())
        assert "connect_s" in spark_verdict["timing"]
        found = {k: v for k, v in spark_verdict["anomalies"].items() if v}
        local = checker.check_run(run, contract_of(run))
        assert found == local.found()
        assert len(local.stats["fault_windows"]) == 60
        assert spark_verdict["stats"]["fault_windows"] == local.stats["fault_windows"]
    finally:
        spark_connect.stop(state, stack_id)
    assert start_time(pid) is None or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert not (state / "spark-connect").exists()  # its scratch folder goes with it
    assert (state / "logs" / spark_connect.LOG).is_file()  # its log stays, like the other servers'
    assert spark_connect.address(state) is None


def test_a_server_not_ready_in_time_is_stopped_with_its_log(tmp_path: Path) -> None:
    from harness.errors import StackError
    from harness.stack.local_state import tagged_pids

    stack_id = f"unit-slow-{os.getpid()}"
    with pytest.raises(StackError, match="spark connect server: not ready") as caught:
        spark_connect.start(tmp_path, stack_id, timeout=0.0)  # no JVM listens within no time at all
    assert f"read {tmp_path / 'logs' / spark_connect.LOG}" in str(caught.value)
    assert tagged_pids(f"stack/{stack_id}/spark-connect") == []  # not left running detached
    assert not (tmp_path / "spark-connect").exists()
    assert spark_connect.address(tmp_path) is None
