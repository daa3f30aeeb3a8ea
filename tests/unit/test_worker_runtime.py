"""One handler context and one worker runtime base for both transports, checked without services."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from harness.patterns import kafka_consumer, onepc
from harness.worker.__main__ import RUNTIMES
from harness.worker.base import ContextBase, HandlerContext, WorkerRuntime
from harness.worker.kafka_context import KafkaContext
from harness.worker.kafka_stage import KafkaStageWorker
from harness.worker.process import ProcessWorker
from harness.worker.stage import StageContext, StageWorker


@pytest.mark.parametrize("context", [StageContext, KafkaContext])
def test_both_contexts_send_with_the_protocols_one_signature(context: type[ContextBase]) -> None:
    # Before, the ActiveMQ context sent to ``dest`` and the Kafka one to ``topic`` with a ``key``:
    # a handler written for one broke on the other.
    assert inspect.signature(context.send) == inspect.signature(HandlerContext.send)
    assert inspect.signature(context.dead_letter) == inspect.signature(HandlerContext.dead_letter)


@pytest.mark.parametrize("context", [StageContext, KafkaContext])
def test_both_contexts_carry_every_member_of_the_protocol(context: type[ContextBase]) -> None:
    fields = set(context.__dataclass_fields__)
    members = {n for n in dir(HandlerContext) if not n.startswith("_")}
    assert members <= fields | {n for n in dir(context) if not n.startswith("_")}
    assert issubclass(context, ContextBase)


def test_every_worker_kind_runs_on_the_one_runtime_base() -> None:
    assert {"stage": StageWorker, "kafka": KafkaStageWorker, "process": ProcessWorker} == RUNTIMES
    for runtime in RUNTIMES.values():
        assert issubclass(runtime, WorkerRuntime)
        assert "serve" in vars(runtime)  # each keeps only its loop
        assert "side" not in vars(runtime)  # the side connection is the base's


@pytest.mark.parametrize(
    "handler",
    [onepc.naive, onepc.check_then_skip, kafka_consumer.naive, kafka_consumer.inbox_offset],
)
def test_the_one_pc_pieces_are_written_once(handler: Callable[..., Any]) -> None:
    # The Kafka consumer's handlers forward and apply with the 1PC pattern's pieces, not copies.
    source = inspect.getsource(handler)
    assert "ctx.send(" not in source
    assert "INSERT INTO" not in source
