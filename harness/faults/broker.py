"""Broker faults: kill -9 of ActiveMQ, Kafka, Postgres or DTM, and a restart on the same data and ports.

Works from ``Endpoints`` alone. On the docker provider a kill is ``docker kill --signal KILL`` of
the service's container and a restart is ``docker start`` of the same container (its data is in
it). On the local provider: the local provider writes each service's spawn recipe to
``<state_dir>/services/<name>.json``; a kill finds the process group by its registry tag, a
restart spawns the recipe again through ``harness.stack.procs.spawn`` (so the reaping and the
PDEATHSIG guarantees still hold) and waits until the service answers through its proxy.

PDEATHSIG fires when the *thread* that spawned a child exits, not the process. Restarts are
therefore spawned by one long-lived daemon thread of this module, never by the caller's thread
(a Hypothesis rule or a runner thread may end long before the stack does).
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError, HarnessError
from harness.faults.base import check_name
from harness.stack import docker_project
from harness.stack.base import Endpoints
from harness.stack.local_state import ServiceRecipe, stop_tagged, tagged_pids
from harness.stack.procs import Managed, spawn
from harness.stack.wiring import readiness

SERVICES = ("activemq", "kafka", "postgres", "dtm")


class _Spawner:
    """Run spawn calls on one daemon thread that lives as long as the process."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Managed], Future[Managed]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, job: Callable[[], Managed]) -> Managed:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="txchaos-respawn", daemon=True)
                self._thread.start()
        done: Future[Managed] = Future()
        self._jobs.put((job, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # handed to the caller, who raises it
                done.set_exception(exc)


_SPAWNER = _Spawner()
_RESPAWNED: dict[str, Managed] = {}  # tag -> the copy this process spawned (so it can be waited on)


def _recipe(stack: Endpoints, service: str) -> ServiceRecipe:
    check_name("service", service, SERVICES)
    if stack.provider != "local":
        raise ConfigError(
            f"broker faults know the local and docker providers, this stack is {stack.provider!r}",
            hint="run with --txchaos-provider local or docker",
        )
    return ServiceRecipe.load(stack.state_dir, service)


def _in_docker(stack: Endpoints, service: str) -> bool:
    check_name("service", service, SERVICES)
    return stack.provider == "docker"


def is_running(stack: Endpoints, service: str) -> bool:
    """Return True when a process of ``service`` is alive (it may not answer yet)."""
    if _in_docker(stack, service):
        return docker_project.service_running(service, stack.stack_id)
    return bool(tagged_pids(_recipe(stack, service).tag))


def kill_service(stack: Endpoints, service: str) -> list[int]:
    """SIGKILL every process group of ``service`` (its data stays on disk); returns the pids killed."""
    if _in_docker(stack, service):
        killed = docker_project.kill_service(service, stack.stack_id)
        if not killed:
            raise HarnessError(
                f"{service} of stack {stack.stack_id} is not running", hint="restart it before killing it"
            )
        return killed
    recipe = _recipe(stack, service)
    killed = stop_tagged(recipe.tag, sig=signal.SIGKILL, timeout=0.1)
    if not killed:
        raise HarnessError(f"{service} of stack {stack.stack_id} is not running", hint="restart it before killing it")
    old = _RESPAWNED.pop(recipe.tag, None)
    if old is not None:
        old.popen.wait(timeout=10)
    return killed


def restart_service(stack: Endpoints, service: str) -> float:
    """Spawn ``service`` again from its recipe; returns seconds until it answers through its proxy."""
    if _in_docker(stack, service):
        if docker_project.service_running(service, stack.stack_id):
            raise HarnessError(f"{service} of stack {stack.stack_id} is still running", hint="kill it first")
        began = time.monotonic()
        docker_project.start_service(service, stack.stack_id)
        readiness(service, stack).run(None)
        return time.monotonic() - began
    recipe = _recipe(stack, service)
    if tagged_pids(recipe.tag):
        raise HarnessError(f"{service} of stack {stack.stack_id} is still running", hint="kill it first")
    started = time.monotonic()
    proc = _SPAWNER.run(
        lambda: spawn(
            recipe.argv,
            name=service,
            tag=recipe.tag,
            log_path=Path(recipe.log_path),
            user=recipe.user,
            detached=recipe.detached,
            cwd=Path(recipe.cwd) if recipe.cwd else None,
            owner=recipe.owner(),
        )
    )
    _RESPAWNED[recipe.tag] = proc
    readiness(service, stack).run(proc)
    return time.monotonic() - started


@dataclass(frozen=True)
class KillBroker:
    """Kill -9 ``service`` for the ``with`` body; healing restarts it on the same data and ports.

    >>> with active(KillBroker("activemq").on(endpoints), ledger) as fault:
    ...     assert not stomp_reachable()
    >>> fault.restart_s                         # seconds until it answered again
    """

    service: str

    def __post_init__(self) -> None:
        check_name("service", self.service, SERVICES)

    def on(self, stack: Endpoints) -> BrokerCrash:
        """Bind to ``stack`` (checks now that the stack can be restarted, before anything is killed)."""
        if not _in_docker(stack, self.service):
            _recipe(stack, self.service)
        return BrokerCrash(self.service, stack)


class BrokerCrash:
    """A killed service: ``apply`` kills it, ``heal`` restarts it unless it already runs."""

    def __init__(self, service: str, stack: Endpoints) -> None:
        self.service = service
        self.stack = stack
        self.restart_s: float | None = None
        self.killed: list[int] = []

    @property
    def name(self) -> str:
        return f"kill9:{self.service}"

    def params(self) -> dict[str, object]:
        return {"service": self.service, "stack": self.stack.stack_id}

    def apply(self) -> None:
        self.killed = kill_service(self.stack, self.service)

    def heal(self) -> None:
        if not is_running(self.stack, self.service):
            self.restart_s = restart_service(self.stack, self.service)
