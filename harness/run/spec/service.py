"""A team's own service under test, in any language: ``Service``, and the scenario of one.

A ``Service`` says how to build and start the service (``command``, ``build``), what it is told
(``env``, whose ``{placeholders}`` the run fills with the stack's proxied endpoints and the run's
destinations), when it is ready (a line in its output), how many instances run, and where the
harness submits operations (``body``, a template carrying the op id). Where outputs land and what
counts as an effect are the scenario's (``effect_table``, ``contract``), as for every flow.

The service's own connections go through trap relays (``harness.traps``): the crash points of a
service scenario are the wire-level trap points of the protocols its ``env`` uses, so a point the
service cannot reach is refused when the spec is built.

>>> svc = Service(
...     "orders",
...     command=("{build}/orders", "--variant", "naive"),
...     build=("bash", "build.sh", "{build}"),
...     source="services/orders",
...     env={"DATABASE_URL": "{postgres_url}", "KAFKA_BOOTSTRAP": "{kafka_bootstrap}",
...          "INPUT": "{input}", "OUTPUT": "{output}", "GROUP": "{group}"},
...     transport="kafka",
... )
"""

from __future__ import annotations

import os
import re
import shutil
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import ConfigError
from harness.protocols import PROTOCOLS
from harness.run.spec.checks import check_int, check_name, check_seconds
from harness.traps.base import POINTS as TRAP_POINTS

# Each placeholder a service's command, build and env may use, and the protocol it makes the
# service speak through a trap relay (None: not a trapped connection). The connections' come from
# the table of protocols: postgres_url is a libpq URI (postgresql://user:password@127.0.0.1:port/db),
# stomp_url and openwire_url are tcp://127.0.0.1:port (as ActiveMQConnectionFactory takes it),
# dtm_url goes through Toxiproxy, not trapped (DTM speaks HTTP).
PLACEHOLDERS: dict[str, str | None] = {
    **{name: p.name if p.trapped else None for p in PROTOCOLS for name in p.placeholders},
    "db_user": None,
    "db_password": None,
    "db_name": None,
    "input": None,  # the queue or topic the harness submits to
    "output": None,  # where the service sends what comes out
    "group": None,  # the Kafka consumer group the harness watches
    "instance": None,  # the instance number, 0-based
    "run_dir": None,
    "python": None,  # the interpreter running txchaos
    "build": None,  # the folder ``build`` wrote into (a cache folder per source hash)
    "source": None,  # the service's source folder
}
TRANSPORTS = ("activemq", "kafka")
# ``{poison}`` is ``true`` for the spec's poison operations, else ``false`` (a JSON literal).
BODY_FIELDS = ("op", "n", "amount", "poison")
_NOT_UNDER_US = ("node_modules", "target", "__pycache__", ".git")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:@-]{0,254}$")


def fields_of(template: str, label: str) -> list[str]:
    """Return the ``{placeholder}`` names in ``template``; refuse a malformed template."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(
            f"{label} {template!r} is not a template: {exc}", hint="write a literal brace as '{{' or '}}'"
        ) from exc


def _check_placeholders(label: str, template: object, known: tuple[str, ...]) -> list[str]:
    if not isinstance(template, str):
        raise ConfigError(f"{label} {template!r} is not text", hint="write it as a string")
    names = fields_of(template, label)
    for name in names:
        if not name.isidentifier():
            raise ConfigError(
                f"{label} {template!r} has {{{name}}}, which is not a placeholder",
                hint="write a literal brace as '{{' or '}}', e.g. body='{{\"op\": \"{op}\"}}'",
            )
        if name not in known:
            raise ConfigError(
                f"{label} {template!r} uses the unknown placeholder {{{name}}}",
                hint=f"use one of {', '.join('{' + k + '}' for k in known)}",
            )
    return names


@dataclass(frozen=True)
class Service:
    """A service under test: how it is built and started, what it is told, when it is ready.

    ``ready`` is a regular expression searched in the service's output (stdout and stderr) after
    each start; ``freeze_s`` is how long a ``freeze`` trap keeps an instance stopped before it is
    thawed. ``source`` is resolved against the working directory when the spec is built.
    """

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    transport: str = "activemq"
    ready: str = "READY"
    ready_timeout_s: float = 30.0
    instances: int = 1
    build: tuple[str, ...] = ()
    source: str | os.PathLike[str] | None = None
    body: str = '{{"op": "{op}", "n": {n}, "amount": {amount}}}'
    freeze_s: float = 5.0
    # Where an output names its operation, as a dotted path into its JSON body ("order.id"); by
    # default the ``txchaos-op`` header, (Kafka) the record key, or the body's ``op``.
    output_op: str | None = None
    # A local Docker image to run instead of a program: ``command`` is then its arguments. Each
    # instance is a container on the host's network (the relays listen on 127.0.0.1); a trap kills
    # or freezes the container's init process, and every container of the run is removed after it.
    image: str | None = None
    # False: the service talks to the stack's Toxiproxy proxies directly, no trap relay in between
    # (no trap can fire; network faults still apply): the clean path without the traps' cost.
    relays: bool = True
    # The queues the service sends to between its own stages ("{input}.ship"): the run creates
    # them, and reads what is left in them and in their dead-letter queues, so an operation waiting
    # (or dead-lettered) inside the service is ``stuck`` (``dead-lettered``), not ``lost``.
    queues: tuple[str, ...] = ()
    # The programs the service's build and run need on PATH, each with how to install it
    # ({"javac": "a JDK 17 (apt-get install openjdk-17-jdk-headless)"}): checked before a run builds
    # or starts anything, cached build or not.
    tools: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("service name", self.name)
        if self.transport not in TRANSPORTS:
            raise ConfigError(
                f"service {self.name} transport {self.transport!r} is not one of {', '.join(TRANSPORTS)}",
                hint="transport='activemq' (STOMP queues) or transport='kafka' (topics)",
            )
        check_int(f"service {self.name} instances", self.instances, 1, 16)
        check_seconds(f"service {self.name} ready_timeout_s", self.ready_timeout_s, 0, 600, above_low=True)
        check_seconds(f"service {self.name} freeze_s", self.freeze_s, 0, 600, above_low=True)
        if not isinstance(self.relays, bool):
            raise ConfigError(
                f"service {self.name} relays={self.relays!r} is not True/False", hint="write relays=False"
            )
        for label, argv in (("command", self.command), ("build", self.build)):
            if not isinstance(argv, tuple | list) or not all(isinstance(a, str) and a for a in argv):
                raise ConfigError(
                    f"service {self.name} {label} {argv!r} is not a list of arguments",
                    hint=f'write {label}=("program", "arg", ...)',
                )
            object.__setattr__(self, label, tuple(argv))
        if self.image is not None and (not isinstance(self.image, str) or not _IMAGE.match(self.image)):
            raise ConfigError(
                f"service {self.name} image {self.image!r} is not an image reference",
                hint="name a local image, e.g. image='orders:latest' (build it with `docker build -t orders:latest .`)",
            )
        if not self.command and self.image is None:
            raise ConfigError(
                f"service {self.name} has no command", hint='give command=("program", "arg", ...) or image="name:tag"'
            )
        if not isinstance(self.env, Mapping) or not all(isinstance(k, str) and k for k in self.env):
            raise ConfigError(f"service {self.name} env {self.env!r} is not a mapping", hint="env={'NAME': 'value'}")
        known = tuple(PLACEHOLDERS)
        for arg in (*self.command, *self.build):
            _check_placeholders(f"service {self.name} argument", arg, known)
        for key, value in self.env.items():
            _check_placeholders(f"service {self.name} env {key}", value, known)
        object.__setattr__(self, "env", dict(self.env))
        _check_placeholders(f"service {self.name} body", self.body, BODY_FIELDS)
        self._check_queues()
        if not isinstance(self.tools, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in self.tools.items()
        ):
            raise ConfigError(
                f"service {self.name} tools {self.tools!r} is not a mapping of program to how to install it",
                hint="tools={'mvn': 'Maven (apt-get install maven)'}",
            )
        object.__setattr__(self, "tools", dict(self.tools))
        if self.output_op is not None and (not isinstance(self.output_op, str) or not all(self.output_op.split("."))):
            raise ConfigError(
                f"service {self.name} output_op {self.output_op!r} is not a dotted path",
                hint="name the JSON field of an output that holds the op id, e.g. output_op='order.id'",
            )
        try:
            re.compile(self.ready)
        except (re.error, TypeError) as exc:
            raise ConfigError(
                f"service {self.name} ready {self.ready!r} is not a regular expression: {exc}",
                hint="give the text of the line the service prints once it serves, e.g. ready='READY'",
            ) from exc
        if self.build and self.source is None:
            raise ConfigError(
                f"service {self.name} has a build but no source",
                hint="give source= (the folder the build reads): its content keys the build cache",
            )
        if self.source is not None:
            path = Path(self.source).resolve()
            if not path.is_dir():
                raise ConfigError(
                    f"service {self.name} source {str(self.source)!r} is not a folder ({path})",
                    hint="give the service's source folder, absolute or relative to the working directory",
                )
            object.__setattr__(self, "source", str(path))

    def _check_queues(self) -> None:
        queues = self.queues
        if not isinstance(queues, tuple | list) or not all(isinstance(q, str) and q for q in queues):
            raise ConfigError(
                f"service {self.name} queues {queues!r} is not a list of queue names",
                hint="name each inner queue as a template on the run's input, e.g. queues=('{input}.ship',)",
            )
        for queue in queues:
            if "{input}" not in queue:
                raise ConfigError(
                    f"service {self.name} queue {queue!r} does not name {{input}}",
                    hint="derive it from the run's input (queues=('{input}.ship',)): each run has its own queues",
                )
            _check_placeholders(f"service {self.name} queue", queue, ("input",))
        if self.transport != "activemq" and queues:
            raise ConfigError(
                f"service {self.name} declares queues {list(queues)!r} on transport {self.transport!r}",
                hint="inner queues are ActiveMQ queues: use transport='activemq', or drop queues=",
            )
        object.__setattr__(self, "queues", tuple(queues))

    def check_tools(self) -> None:
        """Refuse to run when a program in ``tools`` is not on PATH, naming it and how to install it."""
        for tool, how in self.tools.items():
            if shutil.which(tool) is None:
                raise ConfigError(
                    f"service {self.name} needs {tool}, which is not on PATH: install {how}",
                    hint=f"install {how}, then run again (PATH={os.environ.get('PATH', '')})",
                )

    def inner_queues(self, input_queue: str) -> list[str]:
        """Return the inner queues of the run whose input is ``input_queue``."""
        return [q.format(input=input_queue) for q in self.queues]

    @property
    def source_dir(self) -> Path | None:
        return None if self.source is None else Path(self.source)

    def protocols(self) -> frozenset[str]:
        """Return the trapped protocols the service speaks (from the placeholders it uses)."""
        names = {n for v in (*self.env.values(), *self.command) for n in fields_of(v, "")}
        return frozenset(p for n in names if (p := PLACEHOLDERS.get(n)) is not None)

    def points(self) -> tuple[str, ...]:
        """Return the trap points reachable on the service's connections (none without relays)."""
        protocols = self.protocols() if self.relays else frozenset()
        return tuple(p for p, proto in TRAP_POINTS.items() if proto in protocols)

    def render(self, template: str, values: Mapping[str, str]) -> str:
        """Fill ``template``'s placeholders from ``values``."""
        return template.format_map(dict(values))

    def body_of(self, op: str, n: int, amount: int, *, poison: bool = False) -> str:
        """Return the body of operation ``op``: the ``body`` template filled."""
        return self.body.format(op=op, n=n, amount=amount, poison="true" if poison else "false")


def source_files(root: Path) -> list[Path]:
    """Return the files under ``root`` a build reads (not its dependency or output folders), sorted."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part in _NOT_UNDER_US for part in p.relative_to(root).parts)
    )
