"""A standalone Spark master and worker from the installed pyspark verify a run like local mode."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.ledger.synth import synth_run
from harness.verify import checker
from harness.verify.assemble import compare_verdicts
from harness.verify.model import FlowContract

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"spark daemon exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    pytest.fail(f"spark daemon did not listen on {port} in {timeout}s:\n{log.read_text()[-2000:]}")


def _daemon(cls: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    import pyspark

    home = Path(pyspark.__file__).parent  # the wheel ships jars/ but no sbin start scripts
    cmd = ["java", "-Xmx512m", "-cp", f"{home / 'jars'}/*", cls, *args]
    # the worker builds its executors' command line from SPARK_HOME; the wheel has no build dirs to guess from
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_SCALA_VERSION="2.13",
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
    )
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start a master and one worker (2 cores, 1 GiB) on free loopback ports; always kill both."""
    logs = tmp_path_factory.mktemp("spark-logs")
    port, ui, wport, wui = (_free_port() for _ in range(4))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master = _daemon(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
            logs / "master.log",
        )
        procs.append(master)
        _wait_port(port, master, logs / "master.log")
        url = f"spark://127.0.0.1:{port}"
        worker = _daemon(
            "org.apache.spark.deploy.worker.Worker",
            [
                "--host",
                "127.0.0.1",
                "--port",
                str(wport),
                "--webui-port",
                str(wui),
                "--cores",
                "2",
                "--memory",
                "1g",
                "--work-dir",
                str(logs / "work"),
                url,
            ],
            logs / "worker.log",
        )
        procs.append(worker)
        _wait_port(wport, worker, logs / "worker.log")
        yield url
    finally:
        for p in reversed(procs):  # worker first; its executors share its process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def test_cluster_verdict_equals_local(spark_master: str, tmp_path: Path) -> None:
    from harness.verify import spark

    run = synth_run(tmp_path / "run", 200_000, seed=9, anomaly_rate=0.005)
    contract = FlowContract()
    local = checker.check_run(run, contract)
    on_cluster = spark.check_run(run, contract, master=spark_master)
    assert on_cluster.engine == "spark"
    assert compare_verdicts(local, on_cluster) == []
    assert not on_cluster.clean  # the synthetic run carries injected anomalies
