"""Run a team's own service under test: the ``service_activemq`` and ``service_kafka`` flows.

``ServiceSession`` is what a service adds to the stage flow of its transport (the ActiveMQ or
Kafka session: the same destinations, sink, quiescence and books): instead of txchaos workers it
starts the service's own instances (``ServicePool``), each behind its own trap proxies, one per
protocol the service speaks (``harness.traps``): twins of the stack's Toxiproxy proxies, inside
Toxiproxy, so network faults still apply and no hop is added. A crash of the spec is a trap:
armed on an op id (recognised in the bytes of the service's transaction) or on the nth hit, it
kills, freezes or cuts off the instance whose connection it fired on; each firing is a ``crash``
event in the ledger and a folder step.

An instance that ends with nothing to explain it (no trap, no fault) is the service's failure:
the run still closes its books, then raises ``ServiceFailed`` (exit 5), never an anomaly.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.errors import ConfigError, HarnessError, ServiceFailed
from harness.ledger.schema import Kind
from harness.run.kafka_runner import KafkaRunSession
from harness.run.registry import SERVICE_ACTIONS
from harness.run.runner import StageRunSession
from harness.run.service import Service, fields_of
from harness.run.service_build import build_dir, ensure_built
from harness.run.service_pool import Instance, ServicePool
from harness.run.session import RunResult
from harness.run.sink_session import SinkSession
from harness.run.spec import Crash, FaultWindow, ScenarioSpec
from harness.run.supervisor import WorkerPool
from harness.stack import containers
from harness.stack.base import Endpoint, Endpoints
from harness.traps.base import Drop, Firing, Freeze, Kill, Trap, TrapSet
from harness.traps.proxy import TrapProxy
from harness.worker.crash import CrashArm


def trap_action(name: str, *, group: bool = True) -> Kill | Freeze | Drop:
    """Return the action ``name`` (``SERVICE_ACTIONS``) aimed at the instance's whole process group.

    A process group: an instance started by a wrapper (a shell, npm) is stopped or killed whole. A
    container's init process (``group=False``) takes the container with it when killed.
    """
    if name not in SERVICE_ACTIONS:
        raise ConfigError(f"unknown trap action {name!r}", hint=f"use one of {', '.join(SERVICE_ACTIONS)}")
    return Drop() if name == "drop" else Freeze(group=group) if name == "freeze" else Kill(group=group)


def check_command(service: Service, build: Path | None) -> None:
    """Refuse a command whose program is not there (after the build), naming it and the fix."""
    program = service.render(service.command[0], _static(service, build))
    found = shutil.which(program) if "/" not in program else (program if Path(program).is_file() else None)
    if found is None:
        raise ConfigError(
            f"service {service.name} command {program!r} is not found",
            hint="give the program's path (or a name on PATH); a built program is under {build}/",
        )


def _static(service: Service, build: Path | None) -> dict[str, str]:
    values = {"python": sys.executable, "build": str(build or ""), "source": str(service.source_dir or "")}
    return {name: values.get(name, "") for name in ("python", "build", "source")}


class ServiceSession(SinkSession[Any]):
    """A service's instances and trap proxies on a transport's stage flow (see the module docstring)."""

    service: Service
    group: str

    def _check(self, spec: ScenarioSpec, endpoints: Endpoints) -> None:
        service = spec.service
        if service is None:
            raise ConfigError(f"{spec.label} has no service", hint="build it with ScenarioSpec.for_service(...)")
        service.check_tools()  # before the build and any instance: a cached build still needs its runtime
        if (
            "dtm_url" in {n for v in (*service.env.values(), *service.command) for n in _names(v)}
            and endpoints.dtm is None
        ):
            raise ConfigError(f"service {service.name} uses {{dtm_url}}", hint="start a stack with DTM (`txchaos up`)")
        if "openwire" in service.protocols() and endpoints.openwire is None:
            raise ConfigError(
                f"service {service.name} speaks OpenWire but stack {endpoints.stack_id} has no OpenWire connector",
                hint="stop it with `txchaos down` and start a new one with `txchaos up`",
            )
        built = ensure_built(service)
        if service.image is None:
            check_command(service, built)
        else:
            containers.reap_orphans()  # the containers a run killed mid-way left running
            if not containers.image_present(service.image):
                raise ConfigError(
                    f"service {service.name} image {service.image!r} is not in the local Docker engine",
                    hint=f"build it first (`docker build -t {service.image} .`); txchaos pulls nothing",
                )
        super()._check(spec, endpoints)

    def _setup(self) -> None:
        super()._setup()
        assert self.spec.service is not None
        self.service = self.spec.service
        if not hasattr(self, "group"):
            self.group = f"{self.ns}.group"
        self.output_dest = f"{self.ns}.out"
        self.traps = TrapSet(on_fire=self._fired)
        self._proxies: list[TrapProxy] = []
        self._ports: dict[tuple[str, str], tuple[str, int]] = {}
        self._timers: list[threading.Timer] = []
        self._last_pool: ServicePool | None = None

    # -- hooks ---------------------------------------------------------------------------------
    def _provision(self) -> None:
        super()._provision()
        if self._sink is not None and self.service.output_op is not None:
            self._sink.op_path = tuple(self.service.output_op.split("."))
        upstream: dict[str, Endpoint] = {
            "postgres": self.endpoints.postgres,
            "stomp": self.endpoints.stomp,
            "kafka": self.endpoints.kafka,
        }
        if self.endpoints.openwire is not None:
            upstream["openwire"] = self.endpoints.openwire
        for name in self._names():
            for protocol in sorted(self.service.protocols()):
                ep = upstream[protocol]
                if not self.service.relays:
                    self._ports[(name, protocol)] = (ep.host, ep.port)
                    continue
                proxy = TrapProxy(
                    protocol,
                    (ep.host, ep.port),
                    self.traps,
                    owner=self._pid_of(name),
                    label=name,
                    toxiproxy=self.endpoints.toxiproxy_api,
                ).start()
                self._proxies.append(proxy)
                self._ports[(name, protocol)] = proxy.address
        if self.service.relays:
            self.folder.step(
                f"trap proxies for {', '.join(sorted(self.service.protocols())) or 'no protocol'} "
                f"for each of {len(self._names())} instance(s)"
            )

    def _names(self) -> list[str]:
        return [f"{self.service.name}-{i}" for i in range(self.service.instances)]

    def _pid_of(self, name: str) -> Any:
        # The last pool, stopped or not: a thaw while the run heals signals a process already gone.
        return lambda: self._service_pool(running=False).pid(name)

    def _service_pool(self, *, running: bool = True) -> ServicePool:
        pool = self._pool if running else self._last_pool
        if not isinstance(pool, ServicePool):
            raise HarnessError("a trap fired with no service running", hint="arm traps after open()")
        return pool

    def _make_pool(self) -> WorkerPool:
        pool = ServicePool(
            [self._instance(i, name) for i, name in enumerate(self._names())],
            self.folder.path,
            self.ledger,
            ready=self.service.ready,
            frozen=self.traps.frozen,
        )
        self._last_pool = pool
        return pool

    def _start_timeout_s(self) -> float:
        return self.service.ready_timeout_s

    def _instance(self, number: int, name: str) -> Instance:
        svc, ep = self.service, self.endpoints
        values = {**_static(svc, build_dir(svc)), "run_dir": str(self.folder.path), "instance": str(number)}
        values.update(input=self.input_dest, output=self.output_dest, group=self.group)
        values.update(db_user=ep.db_user, db_password=ep.db_password, db_name=ep.db_name)
        if ep.dtm is not None:
            values["dtm_url"] = ep.dtm_url
        if (pg := self._ports.get((name, "postgres"))) is not None:
            auth = f"{quote(ep.db_user, safe='')}:{quote(ep.db_password, safe='')}"
            values.update(postgres_host=pg[0], postgres_port=str(pg[1]))
            values["postgres_url"] = f"postgresql://{auth}@{pg[0]}:{pg[1]}/{quote(ep.db_name, safe='')}"
        if (stomp := self._ports.get((name, "stomp"))) is not None:
            values.update(stomp_host=stomp[0], stomp_port=str(stomp[1]), stomp_url=f"tcp://{stomp[0]}:{stomp[1]}")
        if (wire := self._ports.get((name, "openwire"))) is not None:
            values.update(openwire_host=wire[0], openwire_port=str(wire[1]), openwire_url=f"tcp://{wire[0]}:{wire[1]}")
        if (kafka := self._ports.get((name, "kafka"))) is not None:
            values["kafka_bootstrap"] = f"{kafka[0]}:{kafka[1]}"
        env = {**_base_env(), **{k: svc.render(v, values) for k, v in svc.env.items()}}
        argv = tuple(svc.render(a, values) for a in svc.command)
        return Instance(name, svc.name, argv, env, svc.source_dir, svc.image, tuple(svc.env))

    def _announce_workers(self) -> None:
        svc = self.service
        self.folder.step(
            f"start {svc.instances} instance(s) of service {svc.name}: {' '.join(svc.command)} "
            f"(input {self.input_dest}, output {self.output_dest})"
        )

    def _body(self, fields: dict[str, object]) -> str:
        op, n, amount = str(fields["op"]), int(str(fields["n"])), int(str(fields["amount"]))
        return self.service.body_of(op, n, amount, poison=bool(fields.get("poison")))

    def _alone(self) -> set[int]:
        return set()

    # -- traps ---------------------------------------------------------------------------------
    arm_via = "trap"  # the verdict words an unfired arm as a trap the service never reached

    def arm(self, crash: Crash, *, op: str | None = None) -> CrashArm:
        """Arm the trap ``crash`` names: on its operation (or ``op``), or on the nth hit of its point."""
        arm = super().arm(crash, op=op)
        action = trap_action(crash.action, group=self.service.image is None)
        self.traps.arm(Trap(crash.point, action, op=arm.op, nth=None if arm.op else crash.nth))
        return arm

    def _fired(self, firing: Firing) -> None:
        """Record a trap's firing (on the relay thread, before its action runs)."""
        self.ledger.emit(
            Kind.CRASH,
            op=firing.op,
            point=firing.point,
            stage=self.service.name,
            worker=firing.where,
            action=firing.action,
        )
        self.folder.step(f"trap {firing.point} fired on op {firing.op} in {firing.where}: {firing.action}")
        pool = self._pool
        if isinstance(pool, ServicePool) and firing.action in ("kill", "drop"):  # a dropped link may end it too
            pool.expect_exit(firing.where)
        if firing.action == "freeze":
            timer = threading.Timer(self.service.freeze_s, self.thaw)
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def thaw(self) -> int:
        """Continue every frozen instance and let its held message go on; return how many."""
        thawed = self.traps.thaw()
        if thawed:
            self.folder.step(f"thaw {thawed} frozen instance(s)")
        return thawed

    def kill_instance(self, number: int = 0) -> None:
        """SIGKILL instance ``number`` now (a state machine's rule); the pool starts it again."""
        pool = self._service_pool()
        name = self._names()[number]
        pool.expect_exit(name)
        Kill(lambda: pool.pid(name), group=self.service.image is None).signal(signal.SIGKILL)
        self.ledger.emit(Kind.CRASH, point="kill", stage=self.service.name, worker=name, action="kill")
        self.folder.step(f"kill instance {name}")

    def hold_fault(self, window: FaultWindow) -> None:
        pool = self._pool
        if isinstance(pool, ServicePool):
            pool.fault_on()
        try:
            super().hold_fault(window)
        finally:
            if isinstance(pool, ServicePool):
                pool.fault_off()

    # -- closing -------------------------------------------------------------------------------
    def _release(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for proxy in self._proxies:
            proxy.stop()  # thaws what is frozen first
        self._proxies = []
        super()._release()

    def close(self) -> RunResult:
        pool = self._pool
        result = super().close()
        own = pool.own_exits if isinstance(pool, ServicePool) else []
        if own:
            first = own[0]
            how = f"signal {first.signal}" if first.signal else f"exit {first.returncode}"
            raise ServiceFailed(
                f"service {self.service.name}: {len(own)} instance exit(s) no trap, rule or fault explains; "
                f"first {first.instance} ({how}); the verdict of {result.run_dir} judges a flow whose "
                "service failed by itself",
                hint=f"read {first.log}: the service must survive what the run did (or exit only on a fault)",
            )
        return result


def _names(template: str) -> list[str]:
    return fields_of(template, "")


def _base_env() -> dict[str, str]:
    """Return the environment every instance starts from: the harness's own, minus its secrets and tags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TXCHAOS_") and k != "PGPASSWORD"}


class ActiveMQServiceSession(ServiceSession, StageRunSession):
    """A service on STOMP queues: the ``service_activemq`` flow."""

    flow = "service_activemq"

    def _setup(self) -> None:
        super()._setup()
        # The service's inner queues are read like stage queues: residue, and their dead letters.
        self.stage_queues.extend(self.service.inner_queues(self.input_queue))


class KafkaServiceSession(ServiceSession, KafkaRunSession):
    """A service in a Kafka consumer group: the ``service_kafka`` flow."""

    flow = "service_kafka"
    late_workers = False  # the service must be ready before anything is submitted
