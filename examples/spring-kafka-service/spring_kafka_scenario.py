"""A Spring Kafka batch listener (DefaultErrorHandler, DeadLetterPublishingRecoverer to ``<topic>-dlt``,
exponential backoff) with a Spring JDBC effect in Postgres, under wire traps.

The service (``service/src/main/java/dev/txchaos/kafka/KafkaService.java``) applies each record of
a batch in its own Postgres transaction and produces its output; the container commits the
batch's offsets after the listener returns. Run one with

    txchaos run examples/spring-kafka-service/spring_kafka_scenario.py:naive

- ``naive``: no inbox, a plain exception on a bad record. Killed after a record's DB commit
  (``pg_after_commit``) or before the offset commit (``kafka_before_offset_commit``), the whole
  batch comes back: ``duplicate-effect``. A poison record has the whole batch retried (the records
  before it applied again: ``duplicate-effect``) and then dead-lettered whole.
- ``indexed`` (the seed's): an inbox in the effect's transaction and ``BatchListenerFailedException``
  with the failed record's index: clean under the traps; a poison record alone is retried and then
  dead-lettered (``dead-lettered`` on that record: a service raises no alert).
"""

from __future__ import annotations

from pathlib import Path

from harness import Crash, ScenarioSpec, Schema, Service

HERE = Path(__file__).resolve().parent
# What the build (build.sh) and the run need: checked before anything is built or started.
JDK = "a JDK 17 (apt-get install openjdk-17-jdk-headless)"
TOOLS = {"java": JDK, "javac": JDK, "mvn": "Maven (apt-get install maven)"}
JVM = ("java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto", "-Xmx128m", "-Xss512k")


def service(variant: str, **fields: object) -> Service:
    """Return the Spring Kafka service in ``variant`` (``naive`` or ``indexed``)."""
    return Service(
        f"spring-kafka-{variant}",
        command=(*JVM, "-cp", "{build}/lib/*", "dev.txchaos.kafka.KafkaService", "--variant", variant),
        build=("bash", "build.sh", "{build}"),
        source=HERE / "service",  # its files key the build cache: this scenario is not among them
        env={
            "KAFKA_BOOTSTRAP": "{kafka_bootstrap}",
            "GROUP": "{group}",
            "INSTANCE_ID": "orders-{instance}",  # static membership: a restart takes its partitions back at once
            "INPUT": "{input}",
            "OUTPUT": "{output}",
            "JDBC_URL": "jdbc:postgresql://{postgres_host}:{postgres_port}/{db_name}",
            "DB_USER": "{db_user}",
            "DB_PASSWORD": "{db_password}",
        },
        transport="kafka",
        body='{{"op": "{op}", "n": {n}, "amount": {amount}, "poison": {poison}}}',
        ready_timeout_s=60,
        tools=TOOLS,
        **fields,  # type: ignore[arg-type]
    )


def scenario(variant: str, *, seed: int = 0, name: str = "spring-kafka", **fields: object) -> ScenarioSpec:
    """Return the scenario of the Spring Kafka service in ``variant`` (crashes, expect and the rest as given)."""
    return ScenarioSpec.for_service(
        service(variant),
        variant=variant,
        name=name,
        schema=Schema.file(HERE / "schema.sql"),
        effect_table="sk_effects",
        seed=seed,
        **fields,
    )


def variants(seed: int) -> dict[str, ScenarioSpec]:
    """Each variant under the trap that catches the naive one."""
    crash = (Crash("pg_after_commit", op_index=3),)
    return {
        "naive": scenario("naive", seed=seed, messages=6, crashes=crash, expect=frozenset({"duplicate-effect"})),
        "indexed": scenario("indexed", seed=seed, messages=6, crashes=crash),
    }
