"""One process's ``/proc/<pid>/stat`` (its name, state, parent, CPU time and start time) and arguments.

The command name stands in parentheses and may hold spaces and parentheses itself, so the fields
are counted from the last ``)``. Every module that looks at a process through /proc reads it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``stat`` line that txchaos uses (``proc(5)``)."""

    name: str
    state: str  # R, S, D, T (stopped), Z (zombie), ...
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks
    start_ticks: int  # the start time after boot, in clock ticks: with the pid, names one process


def parse(text: str) -> ProcStat:
    """Return the fields of one ``/proc/<pid>/stat`` line; ValueError when it is not one."""
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    if len(fields) < 20:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    return ProcStat(
        name=head.partition("(")[2],
        state=fields[0],
        ppid=int(fields[1]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        start_ticks=int(fields[19]),
    )


def read(pid: int, proc: Path = PROC) -> ProcStat | None:
    """Return process ``pid``'s stat, or None when it is gone (or ended while being read)."""
    try:
        return parse((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError):
        return None


def state(pid: int, proc: Path = PROC) -> str | None:
    """Return process ``pid``'s state letter (T stopped, Z zombie, ...), or None when it is gone."""
    stat = read(pid, proc)
    return None if stat is None else stat.state


def cmdline(pid: int, proc: Path = PROC) -> tuple[str, ...]:
    """Return process ``pid``'s arguments; none when it is gone (or a kernel thread, which has none)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(arg.decode(errors="replace") for arg in raw.split(b"\0") if arg)
