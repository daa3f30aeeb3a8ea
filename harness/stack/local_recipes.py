"""How the local provider starts each server: its command line, account and working folder.

A recipe reads the stack's ports, its state folder and the installed tools; it prepares what the
server needs on disk first (Postgres's data folder from an initdb'd template, Kafka's formatted
log folder, DTM's config). The provider (``local.py``) runs and supervises what it returns.

Postgres: TCP needs a password (scram-sha-256). The superuser is reached over the server's Unix
socket, which lives in the 0700 data folder of the server's own account. The server runs with
that account's uid and gid and no other group.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from harness import resources
from harness.errors import ConfigError, StackError
from harness.paths import cache_root
from harness.protocols import PROTOCOLS
from harness.stack import bootstrap, dtm, topology
from harness.stack.procs import account, free_ports

FIXTURES = resources.fixtures_dir()
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-XX:ActiveProcessorCount=2"]
SERVICES = ("toxiproxy", "postgres", "activemq", "kafka", "dtm")


@dataclass
class Ports:
    """A stack's free loopback ports: each server's, and each proxy's by its name (``proxy``).

    A proxied server's field is named as its protocol's ``Endpoints`` field (``harness.protocols``).
    """

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
        p = free_ports(9 + len(PROTOCOLS))
        proxies = dict(zip((pr.proxy for pr in PROTOCOLS), p[9:], strict=True))
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


@dataclass(frozen=True)
class Command:
    """What starts one server: its argv, the account it runs as (None: ours) and its working folder."""

    argv: list[str]
    user: str | None = None
    cwd: Path | None = None


class Recipes:
    """Build each server's ``Command`` for one stack (``ports``, ``state_dir``, Postgres's ``pg_data``)."""

    def __init__(
        self, tools: bootstrap.Tools, ports: Ports, state_dir: Path, pg_data: Path, activemq_config: str
    ) -> None:
        self.tools = tools
        self.ports = ports
        self.state_dir = state_dir
        self.pg_data = pg_data
        self.activemq_config = activemq_config
        self._pg_started = False

    def command(self, service: str, *, fresh: bool = True) -> Command:
        """Return how to start ``service``; ``fresh`` throws its data away first (False: a restart keeps it)."""
        if service == "toxiproxy":
            return Command([self.tools.toxiproxy, "-host", "127.0.0.1", "-port", str(self.ports.toxiproxy_api)])
        if service == "postgres":
            argv, user = self.postgres_argv(fresh)
            return Command(argv, user)
        if service == "activemq":
            return Command(self._activemq_argv())
        if service == "kafka":
            return Command(self._kafka_argv(fresh))
        if service == "dtm":
            argv, cwd = self._dtm_argv(fresh)
            return Command(argv, cwd=cwd)
        raise ConfigError(f"unknown service {service!r}", hint=f"one of {', '.join(SERVICES)}")

    def postgres_argv(self, fresh: bool) -> tuple[list[str], str | None]:
        user = _pg_user()
        bin_dir = Path(self.tools.postgres_bin)
        if fresh or not self._pg_started:
            template = self._pg_template(bin_dir, user)
            shutil.rmtree(self.pg_data, ignore_errors=True)
            self.pg_data.mkdir(mode=0o700)
            shutil.copytree(template, self.pg_data, dirs_exist_ok=True)
            (self.pg_data / "pg_hba.conf").write_text(PG_HBA)
            _chown_tree(self.pg_data, user)
            self.pg_data.chmod(0o700)  # also keeps the Unix socket, which lives here, to the server's account
            self._pg_started = True
        argv = [
            str(bin_dir / "postgres"),
            "-D",
            str(self.pg_data),
            "-p",
            str(self.ports.postgres),
            "-k",
            str(self.pg_data),
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

    def admin_socket_url(self) -> str:
        """Return the superuser's URL over the server's private Unix socket (never through TCP)."""
        host = quote(str(self.pg_data), safe="")
        return f"postgresql+psycopg://{topology.DB_ADMIN}@/postgres?host={host}&port={self.ports.postgres}"

    def _java(self, lib: str, heap: str, log_config: Path, props: dict[str, str], main: list[str]) -> list[str]:
        return [
            self.tools.java,
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
            self.tools.activemq_lib,
            "1g",  # a deep queue's cursors in 256 MB ended in back-to-back full GCs (activemq.xml)
            FIXTURES / "activemq" / "log4j2.properties",
            props,
            ["org.apache.activemq.console.Main", "start", f"xbean:file:{FIXTURES / 'activemq' / self.activemq_config}"],
        )

    def _kafka_argv(self, fresh: bool) -> list[str]:
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
            self.tools.kafka_lib,
            "384m",
            FIXTURES / "kafka" / "log4j2.properties",
            {},
            ["kafka.Kafka", str(base / "server.properties")],
        )

    def _kafka_template(self, props: Path) -> Path:
        """Return a KRaft-formatted empty log dir, made once (the format step costs a JVM start)."""
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
            self.tools.kafka_lib,
            "1g",
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
        work = self.state_dir / "dtm"
        if fresh:
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        config = work / "dtm.yml"
        config.write_text(dtm.render(dtm.CONFIG.read_text(), http_port=self.ports.dtm, grpc_port=self.ports.dtm_grpc))
        return [self.tools.dtm, "-c", str(config)], work
