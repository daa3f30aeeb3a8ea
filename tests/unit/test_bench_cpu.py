"""The benchmark's CPU meter (``harness.bench.cpu``): /proc parsing, roles, and a real busy child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.bench.cpu import TICK_S, CpuMeter, machine_times, stack_role


def _stat(pid: int, name: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{pid} ({name}) S 1 1 1 0 -1 4194560 10 0 0 0 {utime} {stime} 0 0 20 0 1 0 100 1000 50\n"


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_proc(proc, {}, busy=0)
    meter = CpuMeter(interval=3600, proc=proc)
    with meter:  # born in the window: all its CPU counts
        (proc / "42").mkdir()
        (proc / "42" / "stat").write_text(_stat(42, "odd ) name (x", 300, 200))
        meter.sample()
    (p,) = meter.usage().procs
    assert (p.name, p.cpu_s) == ("odd ) name (x", 500 * TICK_S)


def test_the_machines_busy_time_leaves_out_idle_iowait_and_what_the_host_stole() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    assert machine_times("cpu  100 5 50 1000 30 2 3 40 7 0\ncpu0 1 2 3\n") == (160 * TICK_S, 40 * TICK_S)


def test_stack_processes_get_their_role_from_name_and_command_line() -> None:
    assert stack_role("java", "java -cp /c/activemq/lib/x.jar org.apache.activemq.console.Main start") == "ActiveMQ"
    assert stack_role("java", "java -cp /c/kafka/libs/* kafka.Kafka server.properties") == "Kafka"
    assert stack_role("java", "java -cp /venv/pyspark/jars/* org.apache.spark.deploy.SparkSubmit") == "Spark"
    assert stack_role("postgres", "postgres: txchaos txchaos 127.0.0.1(5000) idle") == "Postgres"
    assert stack_role("toxiproxy-serve", "/c/toxiproxy-server -port 8474") == "Toxiproxy"
    assert stack_role("trapd", "/c/trapd") == "Toxiproxy"
    assert stack_role("bash", "bash") == "other"


def _fake_proc(root: Path, procs: dict[int, tuple[str, int, str]], busy: int) -> None:
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 1000 0 0 0 {busy // 10} 0 0\n")
    for pid, (name, ticks, cmdline) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(_stat(pid, name, ticks, 0))
        (root / str(pid) / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode())


def test_the_meter_counts_growth_in_the_window_and_a_newcomer_from_zero(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_proc(proc, {10: ("postgres", 1000, "postgres"), 11: ("python", 50, "python w")}, busy=500)
    meter = CpuMeter(interval=3600, proc=proc)  # no sample from the thread: the test takes them
    with meter:
        _fake_proc(proc, {10: ("postgres", 1400, "postgres"), 11: ("python", 250, "python w")}, busy=900)
        _fake_proc(proc, {12: ("java", 70, "java org.apache.activemq.console.Main")}, busy=900)
        meter.sample()
        (proc / "11" / "stat").unlink()  # the worker ended after that sample: its last one counts
    roles = meter.usage().by_role({11: "workers"})
    assert roles == {"Postgres": 400 * TICK_S, "workers": 200 * TICK_S, "ActiveMQ": 70 * TICK_S}
    assert (meter.usage().busy_s, meter.usage().stolen_s) == (400 * TICK_S, 40 * TICK_S)


def test_the_meter_sees_a_real_busy_child_under_the_role_it_is_named() -> None:
    # The child spins for 0.6 s of CPU, says so, and stays until told: the meter's last sample
    # (when the window closes) sees all of it.
    spin = "import sys, time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    spin += "print('spun', flush=True)\nsys.stdin.read()"
    children: list[subprocess.Popen[bytes]] = []
    try:
        with CpuMeter(interval=0.05) as meter:  # born in the window: counted from zero
            child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            children.append(child)
            assert child.stdout is not None
            assert child.stdout.readline() == b"spun\n"
    finally:
        for each in children:
            each.communicate(b"")
    used = meter.usage().by_role({child.pid: "workers"})
    assert 0.6 <= used["workers"] < 1.5, used
