"""What the bare loops of ``harness.bench.bare`` share: their result, addresses, Postgres, processes.

A bare loop is the machine's limit for one flow: the same broker and database work per message
as the harness's stage, without the harness (no ledger, no supervision, no SQLAlchemy). This
module holds the plumbing both loops need and nothing of the work itself:

- ``BareResult``: what a loop measured;
- ``address`` / ``pg_connect``: an endpoint through its Toxiproxy proxy or direct, and a plain
  psycopg connection to the stack's database;
- ``Crew``: the loop's OS processes (``multiprocessing`` with spawn, so a child starts from a
  fresh interpreter as a real service would), a ready/go barrier so the clock starts only when
  every process is connected, one report queue, and a ``close`` that stops every process.

Processes stamp their events with ``time.monotonic()``: on Linux that is CLOCK_MONOTONIC, one
clock for the whole machine, so a first message in one process and a last output in another
make one interval.
"""

from __future__ import annotations

import multiprocessing
import queue
import secrets
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import psycopg

from harness.errors import HarnessError
from harness.stack.base import Endpoint, Endpoints

JOIN_S = 5.0  # how long a child gets to leave by itself once told to stop, before SIGTERM, then SIGKILL
READY_S = 60.0  # spawning a child re-imports the harness: slow on a loaded 2-core machine


@dataclass(frozen=True)
class BareResult:
    """One bare loop's figure: ``messages`` done in ``seconds``, first submission to last output.

    ``effects`` is the effect rows counted in Postgres after the run (the loop raises unless it
    is ``messages``); ``workers`` the processes doing the stage's work; ``consume_seconds`` the
    span from the first message consumed to the last output (the producer's time left out);
    ``roles`` each process's pid and role, ``workers`` or ``driver`` (the producer and the sink),
    for ``harness.bench.cpu``.
    """

    flow: str
    messages: int
    seconds: float
    workers: int
    via_proxy: bool
    effects: int
    consume_seconds: float
    clients: str = "raw"  # the ActiveMQ loop's clients: "raw", or "libraries" (the stage's own)
    roles: tuple[tuple[int, str], ...] = ()

    @property
    def consume_ops_per_s(self) -> float:
        return self.messages / self.consume_seconds if self.consume_seconds > 0 else 0.0

    @property
    def ops_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def suffix() -> str:
    """Return a random name suffix (lowercase hex: valid in a table, queue and topic name)."""
    return secrets.token_hex(4)


def address(endpoint: Endpoint, via_proxy: bool) -> tuple[str, int]:
    """Return ``endpoint``'s Toxiproxy side (``via_proxy``) or the upstream it forwards to."""
    return (endpoint.host, endpoint.port) if via_proxy else (endpoint.upstream_host, endpoint.upstream_port)


def pg_connect(endpoints: Endpoints, via_proxy: bool, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """Return a psycopg connection to the stack's database (libpq sets TCP_NODELAY on its socket)."""
    host, port = address(endpoints.postgres, via_proxy)
    return psycopg.connect(
        host=host,
        port=port,
        user=endpoints.db_user,
        password=endpoints.db_password,
        dbname=endpoints.db_name,
        autocommit=autocommit,
        connect_timeout=5,
    )


def pg_run(endpoints: Endpoints, via_proxy: bool, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` in one autocommit connection; return the last one's rows (none: [])."""
    rows: list[tuple[Any, ...]] = []
    with pg_connect(endpoints, via_proxy, autocommit=True) as conn:
        for sql in statements:
            cur = conn.execute(sql)
            rows = cur.fetchall() if cur.description else []
    return rows


@contextmanager
def cleaned_up(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run ``cleanup`` after the block; when the block failed, a cleanup error becomes a note on
    the block's error instead of hiding it."""
    try:
        yield
    except BaseException as exc:
        try:
            cleanup()
        except Exception as err:
            exc.add_note(f"and the bare loop's cleanup failed: {err!r}")
        raise
    cleanup()


@dataclass(frozen=True)
class Hand:
    """A child's side of the crew: its name, the shared stop and go events, the report queue."""

    name: str
    stop: Event
    go: Event
    reports: Queue[tuple[str, str, Any]]

    def report(self, kind: str, payload: Any = None) -> None:
        self.reports.put((kind, self.name, payload))

    def ready_then_go(self) -> bool:
        """Say this process is connected, then wait for the start; False when stopped first."""
        self.report("ready")
        while not self.go.wait(0.2):
            if self.stop.is_set():
                return False
        return not self.stop.is_set()


def _child(role: Callable[..., None], hand: Hand, *args: Any) -> None:
    """Run ``role(hand, *args)`` in a child; any error goes to the parent as a report with its traceback."""
    try:
        role(hand, *args)
    except BaseException:
        hand.report("error", traceback.format_exc())
        raise


class Crew:
    """The processes of one bare loop. Use as a context manager: leaving it stops every process.

    >>> with Crew() as crew:
    ...     crew.spawn("w0", role, job)
    ...     crew.start_all(deadline)
    ...     kind, name, payload = crew.next(deadline)
    """

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self.stop = self._ctx.Event()
        self.go = self._ctx.Event()
        self.reports: Queue[tuple[str, str, Any]] = self._ctx.Queue()
        self.procs: dict[str, SpawnProcess] = {}

    def spawn(self, name: str, role: Callable[..., None], *args: Any) -> None:
        """Start process ``name`` running ``role(hand, *args)`` (a module-level function: spawn pickles it)."""
        hand = Hand(name, self.stop, self.go, self.reports)
        proc = self._ctx.Process(target=_child, args=(role, hand, *args), name=f"txchaos-bare-{name}", daemon=True)
        proc.start()
        self.procs[name] = proc

    def next(self, deadline: float) -> tuple[str, str, Any]:
        """Return the next report; raise on a child's error, a child gone silent, or the deadline."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HarnessError("a bare loop did not finish in time", hint="is the stack up and the machine idle?")
            try:
                kind, name, payload = self.reports.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [f"{n} (exit {p.exitcode})" for n, p in self.procs.items() if p.exitcode is not None]
                if dead:
                    raise HarnessError(f"bare loop process(es) ended without a report: {', '.join(dead)}") from None
                continue
            if kind == "error":
                raise HarnessError(f"bare loop process {name} failed:\n{payload}")
            return kind, name, payload

    def start_all(self, deadline: float) -> None:
        """Wait until every process said it is ready, then let them all go at once."""
        waiting = set(self.procs)
        while waiting:
            kind, name, _ = self.next(min(deadline, time.monotonic() + READY_S))
            if kind != "ready":
                raise HarnessError(f"bare loop process {name} reported {kind!r} before the start")
            waiting.discard(name)
        self.go.set()

    def collect(self, kind: str, names: list[str], deadline: float) -> dict[str, Any]:
        """Return each of ``names``'s ``kind`` report's payload (other reports are dropped)."""
        return self.collect_each(dict.fromkeys(names, kind), deadline)

    def collect_each(self, wanted: dict[str, str], deadline: float) -> dict[str, Any]:
        """Return, for each name of ``wanted``, the payload of its report of the kind it maps to
        (other reports are dropped)."""
        found: dict[str, Any] = {}
        while len(found) < len(wanted):
            got, name, payload = self.next(deadline)
            if wanted.get(name) == got:
                found[name] = payload
        return found

    def roles(self, workers: list[str]) -> tuple[tuple[int, str], ...]:
        """Return each process's (pid, role): ``workers`` as ``workers``, the others (the producer
        and the sink, the soak driver's counterparts) as ``driver``."""
        return tuple((p.pid or 0, "workers" if n in workers else "driver") for n, p in self.procs.items())

    def close(self) -> None:
        """Stop every process: ask, then SIGTERM, then SIGKILL; release the report queue."""
        self.stop.set()
        for proc in self.procs.values():
            proc.join(JOIN_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(JOIN_S)
            if proc.is_alive():
                proc.kill()
                proc.join(JOIN_S)
        self.reports.close()
        self.reports.cancel_join_thread()

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
