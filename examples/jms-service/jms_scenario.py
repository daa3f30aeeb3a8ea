"""A JMS service with best-effort 1PC (activemq-client over OpenWire, Spring JMS, Spring JDBC) under wire traps.

The service (``service/src/main/java/dev/txchaos/jms/JmsService.java``) is a two-stage order flow: each
stage is a transacted ``DefaultMessageListenerContainer`` whose listener commits its Postgres
transaction first and returns, then the container commits the JMS session (the receive and the
send to the next stage) second. Between the two commits a crash redelivers a message whose effect
is already committed. Run one with

    txchaos run examples/jms-service/jms_scenario.py:naive

- ``naive``: applies every delivery. Killed after its COMMIT is confirmed (``pg_after_commit``),
  before its consuming ack (``openwire_before_ack``, sent at the session's commit) or before its
  JMS commit (``openwire_before_commit``), the redelivered order is applied twice:
  ``duplicate-effect`` on the crashed operation. Killed after the JMS commit is confirmed
  (``openwire_after_commit``) nothing is redelivered: clean.
- ``naive-unique``: the same, into a table whose op_id is unique: the second apply fails on every
  redelivery and the client's redelivery policy has the broker dead-letter it, effect applied:
  ``dead-lettered-with-effect``.
- ``check``: looks for the op's effect first and skips it (still forwarding): clean.
- ``poison``: one poison order fails on each delivery; after ``MAX_REDELIVERIES`` redeliveries
  the broker moves it to ``DLQ.<queue>``: ``dead-lettered`` on that order alone.
"""

from __future__ import annotations

from pathlib import Path

from harness import Crash, ScenarioSpec, Schema, Service

HERE = Path(__file__).resolve().parent
MAX_REDELIVERIES = 2
# A JVM's start is most of a service's start: no JIT tiers past C1, a small heap, the CDS archive.
# What the build (build.sh) and the run need: checked before anything is built or started.
JDK = "a JDK 17 (apt-get install openjdk-17-jdk-headless)"
TOOLS = {"java": JDK, "javac": JDK, "mvn": "Maven (apt-get install maven)"}
JVM = ("java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto", "-Xmx128m", "-Xss512k")
EFFECT_TABLES = {"naive": "jms_effects", "check": "jms_effects", "naive-unique": "jms_effects_unique"}


def service(variant: str, **fields: object) -> Service:
    """Return the JMS service in ``variant`` (``naive``, ``check`` or ``naive-unique``)."""
    return Service(
        f"jms-{variant}",
        command=(*JVM, "-cp", "{build}/lib/*", "dev.txchaos.jms.JmsService", "--variant", variant),
        build=("bash", "build.sh", "{build}"),
        source=HERE / "service",  # its files key the build cache: this scenario is not among them
        env={
            "OPENWIRE_URL": "{openwire_url}",
            "JDBC_URL": "jdbc:postgresql://{postgres_host}:{postgres_port}/{db_name}",
            "DB_USER": "{db_user}",
            "DB_PASSWORD": "{db_password}",
            "INPUT": "{input}",
            "OUTPUT": "{output}",
            "MAX_REDELIVERIES": str(MAX_REDELIVERIES),
        },
        transport="activemq",
        body='{{"op": "{op}", "n": {n}, "amount": {amount}, "poison": {poison}}}',
        ready_timeout_s=60,
        queues=("{input}.ship",),  # stage order sends here, stage ship reads it (JmsService.java)
        tools=TOOLS,
        **fields,  # type: ignore[arg-type]
    )


def scenario(variant: str, *, seed: int = 0, name: str = "jms", **fields: object) -> ScenarioSpec:
    """Return the scenario of the JMS service in ``variant`` (crashes, expect and the rest as given)."""
    return ScenarioSpec.for_service(
        service(variant),
        variant=variant,
        name=name,
        schema=Schema.file(HERE / "schema.sql"),
        effect_table=EFFECT_TABLES[variant],
        seed=seed,
        **fields,
    )


def variants(seed: int) -> dict[str, ScenarioSpec]:
    """Each variant under the trap that catches the naive one, and a poison order."""
    crash = (Crash("pg_after_commit", op_index=3),)
    return {
        "naive": scenario("naive", seed=seed, messages=6, crashes=crash, expect=frozenset({"duplicate-effect"})),
        "naive-unique": scenario(
            "naive-unique", seed=seed, messages=6, crashes=crash, expect=frozenset({"dead-lettered-with-effect"})
        ),
        "check": scenario("check", seed=seed, messages=6, crashes=crash),
        "poison": scenario(
            "check",
            seed=seed,
            name="jms-poison",
            messages=6,
            poison=frozenset({2}),
            expect=frozenset({"dead-lettered"}),
        ),
    }
