"""Where a benchmark's CPU went: every process's CPU time over a window, read from ``/proc``.

A throughput figure on this 2-core machine is set by whoever uses the CPU: the broker's JVM,
Postgres's backends, Toxiproxy, the stage's workers, the driver. ``CpuMeter`` samples every
process's ``utime + stime`` (``/proc/<pid>/stat``) and the machine's busy time (``/proc/stat``)
through a window, and sums the growth per role:

- the processes a benchmark names itself (``named``: a bare loop's workers, a soak's driver);
- every other process by what it runs: ``ActiveMQ``, ``Kafka`` and ``Spark`` (JVMs, told apart by
  their command line), ``Postgres``, ``Toxiproxy`` (the proxy and its trap relay), ``other``.

A process seen for the first time after the window opened counts from zero; the CPU a process
uses after its last sample (at most ``interval`` before it ended) is not counted, so the meter
reads low by that much for processes that end inside the window. Linux only (``/proc``).

>>> with CpuMeter() as meter:
...     run_the_loop()
>>> meter.usage().by_role({worker_pid: "workers"})
{'workers': 12.3, 'ActiveMQ': 20.1, ...}
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness import procfs
from harness.procfs import PROC

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# Who uses the CPU besides the processes a benchmark names, by the start of their command line
# (the JVMs) or their name. The JVMs' roles are told apart by the main class's package.
JVM_ROLES = (("activemq", "ActiveMQ"), ("kafka", "Kafka"), ("spark", "Spark"))
NAME_ROLES = (("postgres", "Postgres"), ("toxiproxy", "Toxiproxy"), ("trapd", "Toxiproxy"))
ROLES = ("workers", "driver", "ActiveMQ", "Kafka", "Spark", "Postgres", "Toxiproxy", "other")


@dataclass(frozen=True)
class Proc:
    """One process as the meter saw it: its name, command line and the CPU it used in the window."""

    pid: int
    name: str
    cmdline: str
    cpu_s: float


def stack_role(name: str, cmdline: str) -> str:
    """Return the role of a process the benchmark did not name, from its name and command line."""
    if name == "java":
        lowered = cmdline.lower()
        return next((role for key, role in JVM_ROLES if key in lowered), "other")
    return next((role for key, role in NAME_ROLES if name.startswith(key)), "other")


@dataclass(frozen=True)
class CpuUsage:
    """The CPU every process used in a window, and the machine's busy time over it."""

    seconds: float  # the window's wall time
    busy_s: float  # CPU time the machine spent busy (all cores; ``machine_times``)
    stolen_s: float  # CPU time the hypervisor gave to others while this machine had work
    cores: int
    procs: tuple[Proc, ...] = field(default=())

    def by_role(self, named: Mapping[int, str]) -> dict[str, float]:
        """Return the CPU seconds per role: ``named`` (pid -> role) first, then ``stack_role``."""
        out: dict[str, float] = {}
        for p in self.procs:
            role = named.get(p.pid) or stack_role(p.name, p.cmdline)
            out[role] = out.get(role, 0.0) + p.cpu_s
        return out

    @property
    def busy_share(self) -> float:
        """The machine's busy share of its cores' time over the window (1.0: every core busy)."""
        return self.busy_s / (self.seconds * self.cores) if self.seconds > 0 else 0.0

    @property
    def stolen_share(self) -> float:
        """The share of the cores' time the hypervisor took over the window."""
        return self.stolen_s / (self.seconds * self.cores) if self.seconds > 0 else 0.0


def machine_times(text: str) -> tuple[float, float]:
    """Return (busy, stolen) CPU seconds of all cores from ``/proc/stat``'s first line.

    Busy is user, nice, system, irq and softirq time. Stolen is the time the hypervisor ran
    something else while this machine had work: on a shared host it slows every process at once.
    """
    values = [int(v) for v in text.split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user and nice]
    return (values[0] + values[1] + values[2] + values[5] + values[6]) * TICK_S, values[7] * TICK_S


class CpuMeter:
    """Sample every process's CPU time every ``interval`` seconds while open (a daemon thread)."""

    def __init__(self, interval: float = 0.5, proc: Path = PROC) -> None:
        self.interval = interval
        self.proc = proc
        self._first: dict[int, float] = {}  # CPU at the window's start (0.0 for a process born in it)
        self._last: dict[int, tuple[str, float]] = {}
        self._cmdlines: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = self._ended = 0.0
        self._times_start = self._times_end = (0.0, 0.0)

    def _read(self, pid: int) -> tuple[str, float] | None:
        stat = procfs.read(pid, self.proc)  # None: the process ended between the listing and the read
        return None if stat is None else (stat.name, stat.cpu_ticks * TICK_S)

    def _cmdline(self, pid: int) -> str:
        if pid not in self._cmdlines:
            try:
                raw = (self.proc / str(pid) / "cmdline").read_bytes()
            except OSError:
                raw = b""
            self._cmdlines[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:500]
        return self._cmdlines[pid]

    def sample(self, *, first: bool = False) -> None:
        """Read every process once; ``first``: the window's starting point."""
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            got = self._read(pid)
            if got is None:
                continue
            if pid not in self._first:
                self._first[pid] = got[1] if first else 0.0
                self._cmdline(pid)
            self._last[pid] = got

    def _times(self) -> tuple[float, float]:
        return machine_times((self.proc / "stat").read_text())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> CpuMeter:
        self._started, self._times_start = time.monotonic(), self._times()
        self.sample(first=True)
        self._thread = threading.Thread(target=self._loop, name="txchaos-cpu-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self._ended, self._times_end = time.monotonic(), self._times()

    def usage(self) -> CpuUsage:
        """Return what the closed window measured: every process that used CPU in it."""
        procs = tuple(
            Proc(pid, name, self._cmdlines.get(pid, ""), cpu - self._first[pid])
            for pid, (name, cpu) in self._last.items()
            if cpu - self._first[pid] > 0
        )
        busy, stolen = (end - start for end, start in zip(self._times_end, self._times_start, strict=True))
        return CpuUsage(self._ended - self._started, busy, stolen, os.cpu_count() or 1, procs)
