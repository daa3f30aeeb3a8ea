"""The local stack provider: real Postgres, ActiveMQ, Kafka, DTM and Toxiproxy as child processes.

Each stack gets free loopback ports and its own state folder (``reports/stacks/<id>/``), so two
stacks run side by side. Clients get only proxy addresses; Kafka advertises its proxy.

What a stack leaves on disk: every folder and file it creates is claimed in the process registry
(``procs.claim_paths``) before it is created, and removed by ``stop``, by ``txchaos down``, or by
the next start after a SIGKILL. Only ``logs/`` stays (``local_state.prune_stack_logs`` keeps the
newest ones).

Postgres: TCP needs a password (scram-sha-256). The systems under test get ``topology.DB_USER``,
a non-superuser owning the run database, with a password made per stack and written only to the
0600 ``endpoints.json``. The superuser is reached over the server's Unix socket, which lives in
the 0700 data folder of the server's own account. The server runs with that account's uid and
gid and no other group.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from harness import resources
from harness.errors import ConfigError, StackError
from harness.paths import cache_root, stacks_root
from harness.stack import bootstrap, dtm, topology
from harness.stack.base import Endpoint, Endpoints
from harness.stack.local_state import ServiceRecipe, prune_stack_logs, stop_tagged
from harness.stack.procs import (
    Managed,
    account,
    claim_paths,
    free_ports,
    reap_orphans,
    release_paths,
    spawn,
    stop,
)
from harness.stack.waits import Wait, openwire_answers, port_open, stomp_connected, wait_each

FIXTURES = resources.fixtures_dir()
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-XX:ActiveProcessorCount=2"]
START_TIMEOUT_S = float(os.environ.get("TXCHAOS_START_TIMEOUT", "90"))
DATA_DIRS = ("activemq", "kafka", "dtm", "services")  # under the stack folder; removed at stop (logs/ stays)


def readiness(service: str, ep: Endpoints) -> Wait:
    """Return the wait that passes once ``service`` answers through its Toxiproxy proxy."""
    from harness.clients import db, kafka
    from harness.clients.dtm import DtmClient

    waits = {
        "postgres": Wait(
            "postgres through its proxy",
            lambda: db.ping(ep.postgres_url),
            timeout=START_TIMEOUT_S,
            tolerated=(Exception,),
        ),
        "activemq": Wait(
            "activemq STOMP and OpenWire through their proxies",
            _both(stomp_connected(ep.stomp.host, ep.stomp.port), _openwire(ep)),
            timeout=START_TIMEOUT_S,
        ),
        "kafka": Wait(
            "kafka metadata through its proxy",
            lambda: kafka.broker_ready(ep.kafka.address, 1.0),
            timeout=START_TIMEOUT_S,
            interval=0.2,
        ),
    }
    if ep.dtm is not None:
        waits["dtm"] = Wait(
            "dtm HTTP API through its proxy",
            DtmClient(ep.dtm.host, ep.dtm.port, timeout=1.0).answers,
            timeout=START_TIMEOUT_S,
            interval=0.05,
        )
    if service not in waits:
        raise ConfigError(f"no readiness probe for {service!r}", hint=f"one of {', '.join(sorted(waits))}")
    return waits[service]


def _openwire(ep: Endpoints) -> Callable[[], bool]:
    if ep.openwire is None:  # an endpoints.json from before the connector: STOMP alone
        return lambda: True
    return openwire_answers(ep.openwire.host, ep.openwire.port)


def _both(first: Callable[[], bool], second: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: first() and second()


@dataclass
class Ports:
    postgres: int
    stomp: int
    kafka: int
    kafka_internal: int
    kafka_controller: int
    toxiproxy_api: int
    dtm: int
    dtm_grpc: int
    openwire: int
    proxy: dict[str, int] = field(default_factory=dict)

    @classmethod
    def pick(cls) -> Ports:
        p = free_ports(14)
        proxies = {"postgres": p[9], "activemq_stomp": p[10], "kafka": p[11], "dtm": p[12], "activemq_openwire": p[13]}
        return cls(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], proxies)


def _pg_user() -> str | None:
    """Return the account Postgres runs as: ``postgres`` when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise ConfigError(
            "running as root but there is no `postgres` user for the server",
            hint="install the Debian postgresql package, or run as a normal user",
        ) from exc
    return "postgres"


def pg_data_dir(stack_id: str) -> Path:
    """Return the stack's Postgres data folder: outside the user's home, so the postgres account reaches it."""
    return Path(tempfile.gettempdir()) / f"txchaos-pg-{stack_id}"


# Written into every stack's data folder: the template's own file is not trusted to say this.
PG_HBA = """\
# Written by txchaos. The Unix socket lives in the data folder (mode 0700, the server's account):
# only that account (and root) can reach it, so it is trusted; it is how the harness makes roles.
local   all all                 trust
# TCP (every client, through Toxiproxy): a password, always.
host    all all 127.0.0.1/32    scram-sha-256
host    all all ::1/128         scram-sha-256
"""


def _chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    os.chown(path, entry.pw_uid, entry.pw_gid)


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
        self._pg_started = False
        # Letters and digits only: it goes into a URL and a SQL literal.
        self.db_password = secrets.token_hex(16)
        self._tools: bootstrap.Tools | None = None
        self.endpoints: Endpoints | None = None
        self.timings: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Endpoints:
        """Start every service, create the proxies, wait until each answers through its proxy."""
        reap_orphans()  # processes, then folders, of stacks whose owner was killed
        prune_stack_logs()
        try:
            self._tools = bootstrap.load_tools()
        except bootstrap.BootstrapError as exc:
            raise ConfigError(str(exc), hint="run `txchaos install`: it installs the stack into the cache") from exc
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
            self._create_proxies(self.endpoints)
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

    # -- per-service recipes -------------------------------------------------------------------
    def _spawn(self, service: str, *, fresh: bool = True) -> None:
        assert self._tools is not None
        log = self.state_dir / "logs" / f"{service}.log"
        tag = self._tag(service)
        user: str | None = None
        cwd: Path | None = None
        if service == "toxiproxy":
            argv = [self._tools.toxiproxy, "-host", "127.0.0.1", "-port", str(self.ports.toxiproxy_api)]
        elif service == "postgres":
            argv, user = self._postgres_argv(fresh)
        elif service == "activemq":
            argv = self._activemq_argv()
        elif service == "kafka":
            argv = self._kafka_argv(fresh)
        elif service == "dtm":
            argv, cwd = self._dtm_argv(fresh)
        else:
            raise ConfigError(f"unknown service {service!r}", hint="one of toxiproxy, postgres, activemq, kafka, dtm")
        recipe_cwd = str(cwd) if cwd else None
        argv = [str(a) for a in argv]
        ServiceRecipe(service, argv, user, str(log), tag, self.detached, recipe_cwd).save(self.state_dir)
        self.procs[service] = spawn(
            argv, name=service, tag=tag, log_path=log, user=user, detached=self.detached, cwd=cwd
        )

    def _tag(self, service: str) -> str:
        return f"stack/{self.stack_id}/{service}"

    def _postgres_argv(self, fresh: bool) -> tuple[list[str], str | None]:
        assert self._tools is not None
        user = _pg_user()
        bin_dir = Path(self._tools.postgres_bin)
        if fresh or not self._pg_started:
            template = self._pg_template(bin_dir, user)
            shutil.rmtree(self._pg_data, ignore_errors=True)
            self._pg_data.mkdir(mode=0o700)
            shutil.copytree(template, self._pg_data, dirs_exist_ok=True)
            (self._pg_data / "pg_hba.conf").write_text(PG_HBA)
            _chown_tree(self._pg_data, user)
            self._pg_data.chmod(0o700)  # also keeps the Unix socket, which lives here, to the server's account
            self._pg_started = True
        argv = [
            str(bin_dir / "postgres"),
            "-D",
            str(self._pg_data),
            "-p",
            str(self.ports.postgres),
            "-k",
            str(self._pg_data),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            # on: with fsync off a commit is written, not flushed, before it returns, so a kill -9 of
            # the server never loses an acknowledged commit (off would fake lost effects).
            "synchronous_commit=on",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=64MB",
            "-c",
            "log_min_messages=warning",
        ]
        return argv, user

    def _pg_template(self, bin_dir: Path, user: str | None) -> Path:
        """Return an initdb'd data dir, made once per Postgres version (initdb is the slow part).

        The superuser gets a random password nobody keeps: over TCP it cannot log in at all.
        """
        # "-scram": templates made before passwords were required had a superuser without one.
        template = cache_root() / "templates" / f"postgres-{bin_dir.parent.name}-scram"
        if (template / "PG_VERSION").exists():
            return template
        import subprocess

        with tempfile.TemporaryDirectory(prefix="txchaos-initdb-") as tmp_dir:
            work = Path(tmp_dir)
            pwfile = work / "pw"
            pwfile.write_text(secrets.token_hex(24) + "\n")
            _chown_tree(work, user)
            cmd = [
                str(bin_dir / "initdb"),
                "-D",
                str(work / "data"),
                "-U",
                topology.DB_ADMIN,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-N",
                "-E",
                "UTF8",
                "--locale=C",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **account(user))
            if proc.returncode != 0:
                raise StackError("initdb failed", hint="check the postgres install", log_tail=proc.stdout + proc.stderr)
            template.parent.mkdir(parents=True, exist_ok=True)
            tmp = template.with_name(template.name + f".{uuid.uuid4().hex[:6]}")
            shutil.copytree(work / "data", tmp)
        tmp.rename(template) if not template.exists() else shutil.rmtree(tmp)
        return template

    def _admin_socket_url(self) -> str:
        """Return the superuser's URL over the server's private Unix socket (never through TCP)."""
        host = quote(str(self._pg_data), safe="")
        return f"postgresql+psycopg://{topology.DB_ADMIN}@/postgres?host={host}&port={self.ports.postgres}"

    def _java(self, lib: str, heap: str, log_config: Path, props: dict[str, str], main: list[str]) -> list[str]:
        assert self._tools is not None
        return [
            self._tools.java,
            f"-Xmx{heap}",
            "-Xms64m",
            *JVM_FLAGS,
            "-cp",
            f"{lib}/*",
            f"-Dlog4j2.configurationFile={log_config}",
            *(f"-D{k}={v}" for k, v in props.items()),
            *main,
        ]

    def _activemq_argv(self) -> list[str]:
        assert self._tools is not None
        data = self.state_dir / "activemq"
        data.mkdir(parents=True, exist_ok=True)
        props = {
            "txchaos.data": str(data),
            "txchaos.bind": "127.0.0.1",
            "txchaos.stomp.port": str(self.ports.stomp),
            "txchaos.openwire.port": str(self.ports.openwire),
            "activemq.home": str(data),
            "activemq.base": str(data),
            "activemq.data": str(data),
        }
        return self._java(
            self._tools.activemq_lib,
            "256m",
            FIXTURES / "activemq" / "log4j2.properties",
            props,
            ["org.apache.activemq.console.Main", "start", f"xbean:file:{FIXTURES / 'activemq' / self.activemq_config}"],
        )

    def _kafka_argv(self, fresh: bool) -> list[str]:
        assert self._tools is not None
        base = self.state_dir / "kafka"
        data = base / "data"
        p = self.ports
        props = (FIXTURES / "kafka" / "server.properties").read_text() + "\n".join(
            [
                "",
                f"listeners=EXTERNAL://127.0.0.1:{p.kafka},INTERNAL://127.0.0.1:{p.kafka_internal},"
                f"CONTROLLER://127.0.0.1:{p.kafka_controller}",
                f"advertised.listeners=EXTERNAL://127.0.0.1:{p.proxy['kafka']},INTERNAL://127.0.0.1:{p.kafka_internal}",
                f"controller.quorum.voters=1@127.0.0.1:{p.kafka_controller}",
                f"log.dirs={data}",
                "",
            ]
        )
        base.mkdir(parents=True, exist_ok=True)
        (base / "server.properties").write_text(props)
        if fresh:
            shutil.rmtree(data, ignore_errors=True)
            shutil.copytree(self._kafka_template(base / "server.properties"), data)
        return self._java(
            self._tools.kafka_lib,
            "384m",
            FIXTURES / "kafka" / "log4j2.properties",
            {},
            ["kafka.Kafka", str(base / "server.properties")],
        )

    def _kafka_template(self, props: Path) -> Path:
        """Return a KRaft-formatted empty log dir, made once (the format step costs a JVM start)."""
        assert self._tools is not None
        template = cache_root() / "templates" / f"kafka-{topology.KAFKA.version}"
        if (template / "meta.properties").exists():
            return template
        import base64
        import subprocess

        work = Path(tempfile.mkdtemp(prefix="txchaos-kraft-"))
        fmt_props = work / "format.properties"
        text = props.read_text()
        fmt_props.write_text(text.replace(f"log.dirs={props.parent / 'data'}", f"log.dirs={work / 'data'}"))
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        cmd = self._java(
            self._tools.kafka_lib,
            "256m",
            FIXTURES / "kafka" / "log4j2.properties",
            {},
            ["kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(fmt_props)],
        )
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise StackError(
                    "Kafka storage format failed",
                    hint="check the Kafka jars in the cache",
                    log_tail=proc.stdout + proc.stderr,
                )
            template.parent.mkdir(parents=True, exist_ok=True)
            tmp = template.with_name(template.name + f".{uuid.uuid4().hex[:6]}")
            shutil.copytree(work / "data", tmp)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        tmp.rename(template) if not template.exists() else shutil.rmtree(tmp)
        return template

    def _dtm_argv(self, fresh: bool) -> tuple[list[str], Path]:
        """Return DTM's command and working directory (its embedded store file, dtm.bolt, lands there)."""
        assert self._tools is not None
        work = self.state_dir / "dtm"
        if fresh:
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        config = work / "dtm.yml"
        config.write_text(dtm.render(dtm.CONFIG.read_text(), http_port=self.ports.dtm, grpc_port=self.ports.dtm_grpc))
        return [self._tools.dtm, "-c", str(config)], work

    # -- wiring --------------------------------------------------------------------------------
    def _endpoints(self) -> Endpoints:
        p = self.ports

        def ep(proxy: str, port: int) -> Endpoint:
            return Endpoint("127.0.0.1", p.proxy[proxy], proxy, "127.0.0.1", port)

        return Endpoints(
            provider=self.name,
            stack_id=self.stack_id,
            postgres=ep("postgres", p.postgres),
            stomp=ep("activemq_stomp", p.stomp),
            kafka=ep("kafka", p.kafka),
            dtm=ep("dtm", p.dtm),
            openwire=ep("activemq_openwire", p.openwire),
            toxiproxy_api=f"http://127.0.0.1:{p.toxiproxy_api}",
            db_user=topology.DB_USER,
            db_password=self.db_password,
            db_name=topology.DB_NAME,
            state_dir=str(self.state_dir),
        )

    def _create_proxies(self, ep: Endpoints) -> None:
        from harness.clients.toxiproxy import ToxiproxyAdmin

        admin = ToxiproxyAdmin(ep.toxiproxy_api)
        for e in (ep.postgres, ep.stomp, ep.kafka, ep.dtm, ep.openwire):
            assert e is not None
            admin.create(e.proxy, e.address, f"{e.upstream_host}:{e.upstream_port}")

    def _wait_one(self, service: str, ep: Endpoints) -> float:
        from harness.clients import db

        if service != "postgres":
            return readiness(service, ep).run(self.procs[service])
        # The role the clients log in as is made over the socket first; then the proxy path is probed.
        admin = self._admin_socket_url()
        took = Wait(
            "postgres on its Unix socket", lambda: db.ping(admin), timeout=START_TIMEOUT_S, tolerated=(Exception,)
        ).run(self.procs[service])
        db.ensure_owner_role(admin, ep.db_user, ep.db_password, ep.db_name)
        return took + readiness(service, ep).run(self.procs[service])

    def _wait_all(self, ep: Endpoints) -> None:
        def wait(service: str) -> None:
            self.timings[service] = self._wait_one(service, ep)

        wait_each(("postgres", "activemq", "kafka", "dtm"), wait)
