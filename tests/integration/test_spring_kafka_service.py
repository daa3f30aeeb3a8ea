"""A real Spring Kafka batch listener under txchaos (DefaultErrorHandler, DeadLetterPublishingRecoverer,
exponential backoff, a Spring JDBC effect), built once by Maven into the build cache and crashed
by wire traps on its own Postgres and Kafka connections, and fed a poison record.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import Crash
from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.run.core.outcome import RunResult
from harness.run.core.session import run_scenario
from harness.run.processes.service_build import ensure_built
from harness.run.spec.files import load_file
from harness.stack.base import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
ROOT = Path(__file__).resolve().parents[2]
SK = load_file(ROOT / "examples" / "spring-kafka-service" / "spring_kafka_scenario.py")


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    ensure_built(SK.service("naive"))  # once per cache: both variants run this build


def firings(result: RunResult) -> list[tuple[str, str | None]]:
    table = read_ledger(result.run_dir / "ledger").to_pylist()
    return [(e["point"], e["op"]) for e in table if e["kind"] == Kind.CRASH.value]


# Killed after op 2's DB commit, or once the Produce response for its output arrived: its effect is
# done and the batch's offsets are not committed, so the whole batch comes back and is applied
# again (which records are ahead of op 2 depends on partition order: op 2 always is duplicated).
@pytest.mark.parametrize("point", ["pg_after_commit", "kafka_after_produce"])
def test_the_naive_listener_applies_the_batch_again_after_a_kill_past_a_records_commit_or_produce(
    point: str, txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    spec = SK.scenario("naive", messages=5, crashes=(Crash(point, op_index=2),), timeout_s=90)
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    op = "naive-s0-op00002"
    assert firings(result) == [(point, op)]
    assert set(result.verdict.found()) == {"duplicate-effect"}, result.verdict.headline()
    assert op in result.verdict.ops("duplicate-effect")


def test_the_naive_listener_applies_the_batch_again_after_a_kill_before_its_offset_commit(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    # One batch (the consumer waits for what arrives within 0.5 s), so one offset commit: the 1st.
    spec = SK.scenario("naive", messages=5, crashes=(Crash("kafka_before_offset_commit", nth=1),), timeout_s=90)
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    assert [p for p, _ in firings(result)] == ["kafka_before_offset_commit"]
    assert set(result.verdict.found()) == {"duplicate-effect"}, result.verdict.headline()


@pytest.mark.parametrize(
    "crash",
    [
        Crash("pg_after_commit", op_index=2),
        Crash("kafka_before_offset_commit", nth=1),
        Crash("kafka_after_produce", op_index=2),
    ],
)
def test_the_indexed_listener_with_an_inbox_is_clean(crash: Crash, txchaos_stack: Endpoints, tmp_path: Path) -> None:
    spec = SK.scenario("indexed", messages=5, crashes=(crash,), timeout_s=90)
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    assert [p for p, _ in firings(result)] == [crash.point]
    assert result.verdict.clean, result.verdict.headline()


def test_a_poison_record_retries_the_naive_batch_and_only_itself_in_the_indexed_one(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    naive = run_scenario(
        SK.scenario("naive", messages=5, poison=frozenset({2}), timeout_s=90), txchaos_stack, runs_root=tmp_path
    )
    indexed = run_scenario(
        SK.scenario("indexed", messages=5, poison=frozenset({2}), timeout_s=90), txchaos_stack, runs_root=tmp_path
    )
    # Naive: the batch holding the poison record (all five, or those one fetch got) retried whole,
    # then every record of it dead-lettered; those ahead of the poison one applied on every try.
    assert set(naive.verdict.found()) <= {"duplicate-effect", "dead-lettered", "dead-lettered-with-effect"}
    assert "naive-s0-op00002" in naive.verdict.ops("dead-lettered"), naive.verdict.headline()
    assert naive.verdict.ops("duplicate-effect") == naive.verdict.ops("dead-lettered-with-effect")
    assert indexed.verdict.found() == {"dead-lettered": 1}, indexed.verdict.headline()
    assert indexed.verdict.ops("dead-lettered") == {"indexed-s0-op00002"}
