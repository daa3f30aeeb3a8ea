"""Three real services under txchaos, each with a naive and a fixed variant, crashed by wire traps.

None of the services imports txchaos: each is a team's own program (Python, Go, Node.js) started
with its command and told the stack's proxied endpoints through its environment. Run one with

    txchaos run examples/services/services_scenario.py:py-naive

- ``py``: a STOMP consumer (stomp.py, psycopg) that commits the DB, then sends, then ACKs. Naive
  has no inbox: killed after its COMMIT is confirmed (``pg_after_commit``) it gets the message
  again and applies the effect twice (``duplicate-effect``). Fixed keeps an inbox.
- ``go``: a Kafka consumer (franz-go, pgx) that commits its offsets after the DB. Naive: the same
  duplicate; fixed: an inbox keyed by (topic, partition, offset).
- ``node``: a STOMP consumer (stompit, pg) whose naive variant ACKs the broker before its DB
  commit: killed before its COMMIT reaches Postgres (``pg_before_commit``), the operation is
  ``lost``. Fixed commits the DB (with an inbox) and then ACKs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import Crash, ScenarioSpec, Schema, Service

HERE = Path(__file__).resolve().parent
DB = {"DATABASE_URL": "{postgres_url}"}
STOMP = {"STOMP_HOST": "{stomp_host}", "STOMP_PORT": "{stomp_port}", "INPUT": "{input}", "OUTPUT": "{output}"}
KAFKA = {
    "KAFKA_BOOTSTRAP": "{kafka_bootstrap}",
    "GROUP": "{group}",
    "INSTANCE_ID": "orders-{instance}",  # static membership: a restart takes its partitions back at once
    "INPUT": "{input}",
    "OUTPUT": "{output}",
}


@dataclass(frozen=True)
class Example:
    """One example service: where it lives, how it runs, and the trap and anomaly its naive variant meets."""

    folder: str
    command: tuple[str, ...]
    env: dict[str, str]
    transport: str
    effect_table: str
    naive_point: str
    naive_anomaly: str
    points: tuple[str, ...]  # every trap its fixed variant must stay clean under

    @property
    def build(self) -> tuple[str, ...]:
        """The build command: the folder's ``build.sh`` into ``{build}``, none where there is no such script."""
        return ("bash", "build.sh", "{build}") if (HERE / self.folder / "build.sh").exists() else ()


EXAMPLES = {
    "py": Example(
        "py-stomp",
        ("{python}", "{source}/service.py"),  # Python needs no build: it runs from its folder
        {**DB, **STOMP},
        "activemq",
        "py_effects",
        "pg_after_commit",
        "duplicate-effect",
        ("pg_before_commit", "pg_after_commit", "stomp_before_ack"),
    ),
    "go": Example(
        "go-kafka",
        ("{build}/orders-go",),
        {**DB, **KAFKA},
        "kafka",
        "go_effects",
        "pg_after_commit",
        "duplicate-effect",
        ("pg_before_commit", "pg_after_commit", "kafka_after_produce"),
    ),
    "node": Example(
        "node-stomp",
        ("node", "{build}/service.js"),
        {**DB, **STOMP},
        "activemq",
        "node_effects",
        "pg_before_commit",
        "lost",
        ("pg_before_commit", "pg_after_commit", "stomp_before_ack"),
    ),
}


def service(name: str, variant: str, **fields: object) -> Service:
    """Return the ``Service`` of example ``name`` (``py``, ``go``, ``node``) in ``variant``."""
    ex = EXAMPLES[name]
    return Service(
        f"{ex.folder}-{variant}",
        command=(*ex.command, "--variant", variant),
        build=ex.build,
        source=HERE / ex.folder,
        env=ex.env,
        transport=ex.transport,
        **fields,  # type: ignore[arg-type]
    )


def scenario(name: str, variant: str, *, seed: int = 0, **fields: object) -> ScenarioSpec:
    """Return the scenario of example ``name`` in ``variant`` (crashes, expect and the rest as given)."""
    ex = EXAMPLES[name]
    return ScenarioSpec.for_service(
        service(name, variant),
        variant=f"{name}-{variant}",
        name="services",
        schema=Schema.file(HERE / ex.folder / "schema.sql"),
        effect_table=ex.effect_table,
        seed=seed,
        **fields,
    )


def variants(seed: int) -> dict[str, ScenarioSpec]:
    """Each example's naive variant under the trap that catches it, and its fixed variant under the same."""
    out = {}
    for name, ex in EXAMPLES.items():
        crash = (Crash(ex.naive_point, op_index=3),)
        out[f"{name}-naive"] = scenario(
            name, "naive", seed=seed, messages=10, crashes=crash, expect=frozenset({ex.naive_anomaly})
        )
        out[f"{name}-fixed"] = scenario(name, "fixed", seed=seed, messages=10, crashes=crash)
    return out
