"""Run a team's own service under test: the ``service_activemq`` and ``service_kafka`` flows.

A service flow is the stage flow of its transport (ActiveMQ or Kafka: the same topology, workload,
quiescence and books) with its processes part swapped: ``ServiceInstances`` starts the
service's own instances (``ServicePool``) instead of txchaos workers, each behind its own trap proxies, one per
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from harness.errors import ConfigError, HarnessError, ServiceFailed
from harness.faults.process import Pause
from harness.ledger.schema import Kind
from harness.run.core.parts import ProcessesKind
from harness.run.core.roles import SessionView
from harness.run.flows.activemq import QUEUE_PARTS
from harness.run.flows.kafka import TOPIC_PARTS
from harness.run.processes.service_build import build_dir, ensure_built
from harness.run.processes.service_pool import Instance, ServicePool
from harness.run.processes.supervisor import WorkerPool
from harness.run.spec.flow import Flow, Parts, register
from harness.run.spec.scenario import Crash, ScenarioSpec
from harness.run.spec.service import Service, fields_of
from harness.stack import containers
from harness.stack.base import Endpoints
from harness.traps.base import POINTS as TRAP_POINTS
from harness.traps.base import Drop, Firing, Freeze, Kill, Trap, TrapSet
from harness.traps.proxy import TrapProxy
from harness.worker.crash import TRAP_ACTIONS, CrashArm
from harness.worker.kafka_options import KafkaStageOptions

SERVICE_ACTIONS = TRAP_ACTIONS  # what a trap does to the service instance it fires on


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


class ServiceInstances:
    """The processes part of a service flow: the service's own instances behind trap proxies.

    It takes the place of txchaos's workers in the stage session of the service's transport
    (``harness.run.core.parts.Processes``); the crashes of the spec are its wire traps.
    """

    arm_via: ClassVar[str] = "trap"  # the verdict words an unfired arm as a trap the service never reached
    may_join_late: ClassVar[bool] = False  # the service must be ready before anything is submitted
    ledgers_deliveries: ClassVar[bool] = False  # the service writes no ledger: the broker's redelivery is the evidence

    def __init__(self, session: SessionView) -> None:
        assert session.spec.service is not None  # check() refused a spec without one
        self.session = session
        self.service = session.spec.service
        self.start_timeout_s = self.service.ready_timeout_s
        self.output_dest = f"{session.ns}.out"
        self.traps = TrapSet(on_fire=self._fired)
        self._proxies: list[TrapProxy] = []
        self._ports: dict[tuple[str, str], tuple[str, int]] = {}
        self._timers: list[threading.Timer] = []
        self._pool: ServicePool | None = None  # the last one made, stopped or not

    @classmethod
    def check(cls, spec: ScenarioSpec, endpoints: Endpoints) -> None:
        """Refuse a service the stack cannot serve or that is not there (built first, once per version)."""
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

    def provision(self) -> None:
        """Start a trap proxy per instance and protocol the service speaks (the flow's destinations exist)."""
        session = self.session
        sink = session.topology.sink
        if sink is not None and self.service.output_op is not None:
            sink.op_path = tuple(self.service.output_op.split("."))
        ep = session.endpoints
        upstream = ep.proxied()
        for name in self._names():
            for protocol in sorted(self.service.protocols()):
                up = upstream[protocol]
                if not self.service.relays:
                    self._ports[(name, protocol)] = (up.host, up.port)
                    continue
                proxy = TrapProxy(
                    protocol,
                    (up.host, up.port),
                    self.traps,
                    owner=self._pid_of(name),
                    label=name,
                    toxiproxy=ep.toxiproxy_api,
                ).start()
                self._proxies.append(proxy)
                self._ports[(name, protocol)] = proxy.address
        if self.service.relays:
            session.folder.step(
                f"trap proxies for {', '.join(sorted(self.service.protocols())) or 'no protocol'} "
                f"for each of {len(self._names())} instance(s)"
            )

    def _names(self) -> list[str]:
        return [f"{self.service.name}-{i}" for i in range(self.service.instances)]

    def _pid_of(self, name: str) -> Any:
        # The last pool, stopped or not: a thaw while the run heals signals a process already gone.
        return lambda: self._running(stopped_too=True).pid(name)

    def _running(self, *, stopped_too: bool = False) -> ServicePool:
        pool = self._pool
        if pool is None or (not stopped_too and self.session.pool is not pool):
            raise HarnessError("a trap fired with no service running", hint="arm traps after open()")
        return pool

    def make_pool(self) -> WorkerPool:
        s = self.session
        self._pool = ServicePool(
            [self._instance(i, name) for i, name in enumerate(self._names())],
            s.folder.path,
            s.ledger,
            ready=self.service.ready,
            frozen=self.traps.frozen,
        )
        return self._pool

    def _instance(self, number: int, name: str) -> Instance:
        svc, s, ep = self.service, self.session, self.session.endpoints
        values = {**_static(svc, build_dir(svc)), "run_dir": str(s.folder.path), "instance": str(number)}
        values.update(input=s.topology.input_dest, output=self.output_dest, group=s.topology.group)
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

    def announce(self) -> None:
        svc, s = self.service, self.session
        s.folder.step(
            f"start {svc.instances} instance(s) of service {svc.name}: {' '.join(svc.command)} "
            f"(input {s.topology.input_dest}, output {self.output_dest})"
        )

    def body(self, fields: dict[str, object]) -> str | None:
        op, n, amount = str(fields["op"]), int(str(fields["n"])), int(str(fields["amount"]))
        body: str = self.service.body_of(op, n, amount, poison=bool(fields.get("poison")))
        return body

    # -- traps ---------------------------------------------------------------------------------
    def armed(self, crash: Crash, arm: CrashArm) -> None:
        """Arm the trap ``crash`` names: on the arm's operation, or on the nth hit of its point."""
        action = trap_action(crash.action, group=self.service.image is None)
        self.traps.arm(Trap(crash.point, action, op=arm.op, nth=None if arm.op else crash.nth))

    def _fired(self, firing: Firing) -> None:
        """Record a trap's firing (on the relay thread, before its action runs)."""
        s = self.session
        s.ledger.emit(
            Kind.CRASH,
            op=firing.op,
            point=firing.point,
            stage=self.service.name,
            worker=firing.where,
            action=firing.action,
        )
        s.folder.step(f"trap {firing.point} fired on op {firing.op} in {firing.where}: {firing.action}")
        pool = self._pool
        if pool is not None and s.pool is pool and firing.action in ("kill", "drop"):  # a dropped link may end it
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
            self.session.folder.step(f"thaw {thawed} frozen instance(s)")
        return thawed

    def kill(self, number: int) -> None:
        """SIGKILL instance ``number`` now (a ``Kill`` step); the pool starts it again."""
        pool = self._running()
        name = self._names()[number]
        pool.expect_exit(name)
        Kill(lambda: pool.pid(name), group=self.service.image is None).signal(signal.SIGKILL)
        self.session.ledger.emit(Kind.CRASH, point="kill", stage=self.service.name, worker=name, action="kill")
        self.session.folder.step(f"kill instance {name}")

    def pause(self, number: int) -> Pause:
        """Return the pause of instance ``number`` (its process group, unless it runs as an image)."""
        pool = self._running()
        name = self._names()[number]
        pool.wait_alive(name, self.start_timeout_s)  # an instance a trap just killed: its replacement
        return Pause(pool.pid(name), group=self.service.image is None)

    @contextmanager
    def during_fault(self) -> Iterator[object]:
        """While a fault is applied, an instance that ends is explained by it."""
        pool = self._pool if self._pool is self.session.pool else None
        if pool is not None:
            pool.fault_on()
        try:
            yield None
        finally:
            if pool is not None:
                pool.fault_off()

    # -- closing -------------------------------------------------------------------------------
    def release(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for proxy in self._proxies:
            proxy.stop()  # thaws what is frozen first
        self._proxies = []

    def after_close(self) -> None:
        """Raise ``ServiceFailed`` when an instance ended with nothing to explain it."""
        own = self._pool.own_exits if self._pool is not None else []
        if own:
            first = own[0]
            how = f"signal {first.signal}" if first.signal else f"exit {first.returncode}"
            raise ServiceFailed(
                f"service {self.service.name}: {len(own)} instance exit(s) no trap, rule or fault explains; "
                f"first {first.instance} ({how}); the verdict of {self.session.folder.path} judges a flow whose "
                "service failed by itself",
                hint=f"read {first.log}: the service must survive what the run did (or exit only on a fault)",
            )


SERVICE_INSTANCES: ProcessesKind = ServiceInstances  # mypy holds the part to the protocols


def _names(template: str) -> list[str]:
    return fields_of(template, "")


def _base_env() -> dict[str, str]:
    """Return the environment every instance starts from: the harness's own, minus its secrets and tags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TXCHAOS_") and k != "PGPASSWORD"}


def _check(spec: ScenarioSpec) -> None:
    """Refuse a service scenario's crash the service cannot reach (its protocols) or a worker name."""
    service = spec.service
    if service is None:
        raise ConfigError(f"{spec.label} names no service", hint="build it with ScenarioSpec.for_service(service, ...)")
    reachable = service.points()
    for crash in spec.crashes:
        if not service.relays:
            raise ConfigError(
                f"service {service.name} has relays=False but {spec.label} arms a trap at {crash.point}",
                hint="a trap fires in a relay: leave relays=True (the default) or drop the crashes",
            )
        if crash.point not in reachable:
            speaks = ", ".join(sorted(service.protocols())) or "no trapped protocol"
            raise ConfigError(
                f"trap point {crash.point!r} is not on a connection of service {service.name} (it speaks {speaks})",
                hint=f"use one of {', '.join(reachable)}, or give the service the placeholder of that protocol",
            )
        if crash.worker is not None:
            raise ConfigError(
                f"service crash at {crash.point} names worker {crash.worker!r}",
                hint="leave worker out: a trap fires on whichever instance reaches it",
            )


def _service_flow(transport: str, parts: Parts, **kw: Any) -> Flow:
    return register(
        Flow(
            f"service_{transport}",
            transport,
            f"a team's own service (any language) on {transport}, crashed by wire-level traps",
            # The stage flow of the transport, the service's instances swapped in for its workers.
            parts=replace(parts, processes=SERVICE_INSTANCES),
            points=tuple(TRAP_POINTS),
            actions=SERVICE_ACTIONS,
            # Poison operations reach the service through its body template's {poison}.
            accepts=frozenset({"poison"}),
            refusal="a service scenario runs the service's own instances: leave those out",
            check_spec=_check,
            **kw,
        )
    )


FLOWS = (
    _service_flow("activemq", QUEUE_PARTS),
    _service_flow("kafka", TOPIC_PARTS, parse=KafkaStageOptions.from_options),
)
