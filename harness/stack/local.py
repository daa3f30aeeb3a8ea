"""The local provider: real Postgres, ActiveMQ, Kafka, DTM and Toxiproxy as supervised child processes.

Each stack gets free loopback ports and its own state folder (``reports/stacks/<id>/``), so two
stacks run side by side. Clients get only proxy addresses; Kafka advertises its proxy. How each
server is started is its recipe (``local_recipes.py``); this module runs, waits for, kills,
restarts and stops them.

What a stack leaves on disk: every folder and file it creates is claimed in the process registry
(``procs.claim_paths``) before it is created, and removed by ``stop``, by ``txchaos down``, or by
the next start after a SIGKILL. Only ``logs/`` stays (``local_state.prune_stack_logs`` keeps the
newest ones).

Postgres: the systems under test get ``topology.DB_USER``, a non-superuser owning the run
database, with a password made per stack and written only to the 0600 ``endpoints.json``.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.paths import stacks_root
from harness.protocols import PROTOCOLS
from harness.stack import bootstrap, topology
from harness.stack.base import Endpoint, Endpoints
from harness.stack.local_recipes import FIXTURES, Ports, Recipes, pg_data_dir
from harness.stack.local_state import ServiceRecipe, prune_stack_logs, stop_tagged
from harness.stack.procs import Managed, Owner, claim_paths, reap_orphans, release_paths, spawn, stop
from harness.stack.waits import Wait, port_open, wait_each
from harness.stack.wiring import START_TIMEOUT_S, create_proxies, readiness

DATA_DIRS = ("activemq", "kafka", "dtm", "services")  # under the stack folder; removed at stop (logs/ stays)


class LocalProvider:
    """Start and stop one local stack.

    >>> with LocalProvider() as endpoints:
    ...     print(endpoints.stomp.address)
    """

    name = "local"

    def __init__(self, *, detached: bool = False, activemq_config: str = "activemq.xml") -> None:
        if not (FIXTURES / "activemq" / activemq_config).exists():
            raise ConfigError(
                f"no ActiveMQ config {activemq_config!r} in {FIXTURES / 'activemq'}",
                hint="use activemq.xml, or add the file to fixtures/activemq/",
            )
        self.detached = detached
        self.activemq_config = activemq_config
        self.stack_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        self.state_dir = stacks_root() / self.stack_id
        self.procs: dict[str, Managed] = {}
        self.ports = Ports.pick()
        self._pg_data = pg_data_dir(self.stack_id)
        # Letters and digits only: it goes into a URL and a SQL literal.
        self.db_password = secrets.token_hex(16)
        self._recipes: Recipes | None = None
        self.endpoints: Endpoints | None = None
        self.timings: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Endpoints:
        """Start every service, create the proxies, wait until each answers through its proxy."""
        reap_orphans()  # processes, then folders, of stacks whose owner was killed
        prune_stack_logs()
        try:
            tools = bootstrap.load_tools()
        except bootstrap.BootstrapError as exc:
            raise ConfigError(str(exc), hint="run `txchaos install`: it installs the stack into the cache") from exc
        self._recipes = Recipes(tools, self.ports, self.state_dir, self._pg_data, self.activemq_config)
        started = time.monotonic()
        # Claimed before anything exists: a SIGKILL from here on leaks nothing past the next start.
        owned = [self._pg_data, *(self.state_dir / sub for sub in DATA_DIRS), self._endpoints_path]
        claim_paths(self._tag("files"), owned, detached=self.detached)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._spawn("toxiproxy")
            self._spawn("postgres")
            self._spawn("activemq")
            self._spawn("kafka")
            self._spawn("dtm")
            self.timings["toxiproxy"] = Wait(
                "toxiproxy API", port_open("127.0.0.1", self.ports.toxiproxy_api), timeout=START_TIMEOUT_S
            ).run(self.procs["toxiproxy"])
            self.endpoints = self._endpoints()
            create_proxies(self.endpoints)
            self._wait_all(self.endpoints)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - started
        self.endpoints.save(self._endpoints_path)
        return self.endpoints

    @property
    def _endpoints_path(self) -> Path:
        return self.state_dir / "endpoints.json"

    def stop(self) -> None:
        """Stop every process group (Kafka and ActiveMQ first, Toxiproxy last) and remove what the stack made."""
        for name in ("dtm", "kafka", "activemq", "postgres", "toxiproxy"):
            # Kafka and DTM: their data is thrown away, and DTM lingers 5.5 s after a SIGTERM.
            sig = signal.SIGKILL if name in ("kafka", "dtm") else signal.SIGTERM
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop(proc, timeout=10, sig=sig)
            # A broker fault may have restarted the service from its recipe: find that copy by tag.
            stop_tagged(self._tag(name), sig=sig)
        release_paths(f"stack/{self.stack_id}/")

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- broker faults: kill -9 and restart with data kept --------------------------------------
    def kill(self, service: str) -> None:
        """SIGKILL ``service``'s process group (its data stays on disk)."""
        proc = self.procs.get(service)
        if proc is None:
            raise ConfigError(f"unknown service {service!r}", hint=f"one of {sorted(self.procs)}")
        stop(proc, timeout=0.1, sig=signal.SIGKILL)
        stop_tagged(self._tag(service))  # the copy a broker fault restarted, if any

    def restart(self, service: str) -> float:
        """Start ``service`` again on the same ports and data; returns seconds until it answers."""
        assert self.endpoints is not None
        self._spawn(service, fresh=False)
        return self._wait_one(service, self.endpoints)

    # -- processes -----------------------------------------------------------------------------
    def _spawn(self, service: str, *, fresh: bool = True) -> None:
        assert self._recipes is not None
        log = self.state_dir / "logs" / f"{service}.log"
        tag = self._tag(service)
        cmd = self._recipes.command(service, fresh=fresh)
        argv = [str(a) for a in cmd.argv]
        recipe_cwd = str(cmd.cwd) if cmd.cwd else None
        owner = None if self.detached else Owner.me()
        ServiceRecipe(
            service,
            argv,
            cmd.user,
            str(log),
            tag,
            self.detached,
            recipe_cwd,
            owner_pid=owner.pid if owner else None,
            owner_start=owner.start if owner else None,
        ).save(self.state_dir)
        self.procs[service] = spawn(
            argv, name=service, tag=tag, log_path=log, user=cmd.user, detached=self.detached, cwd=cmd.cwd
        )

    def _tag(self, service: str) -> str:
        return f"stack/{self.stack_id}/{service}"

    # -- wiring --------------------------------------------------------------------------------
    def _endpoints(self) -> Endpoints:
        p = self.ports

        def ep(proxy: str, port: int) -> Endpoint:
            return Endpoint("127.0.0.1", p.proxy[proxy], proxy, "127.0.0.1", port)

        # Ports names each server's port after the protocol's Endpoints field.
        proxied: dict[str, Any] = {pr.endpoint: ep(pr.proxy, getattr(p, pr.endpoint)) for pr in PROTOCOLS}
        return Endpoints(
            provider=self.name,
            stack_id=self.stack_id,
            **proxied,
            toxiproxy_api=f"http://127.0.0.1:{p.toxiproxy_api}",
            db_user=topology.DB_USER,
            db_password=self.db_password,
            db_name=topology.DB_NAME,
            state_dir=str(self.state_dir),
            kafka_direct_port=p.kafka_internal,
        )

    def _wait_one(self, service: str, ep: Endpoints) -> float:
        from harness.clients import db

        if service != "postgres":
            return readiness(service, ep).run(self.procs[service])
        # The role the clients log in as is made over the socket first; then the proxy path is probed.
        assert self._recipes is not None
        admin = self._recipes.admin_socket_url()
        took = Wait(
            "postgres on its Unix socket", lambda: db.ping(admin), timeout=START_TIMEOUT_S, tolerated=(Exception,)
        ).run(self.procs[service])
        db.ensure_owner_role(admin, ep.db_user, ep.db_password, ep.db_name)
        return took + readiness(service, ep).run(self.procs[service])

    def _wait_all(self, ep: Endpoints) -> None:
        def wait(service: str) -> None:
            self.timings[service] = self._wait_one(service, ep)

        wait_each(("postgres", "activemq", "kafka", "dtm"), wait)
