"""The outbox pattern's pieces that need no service: relay settings, relay message, scenario specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import Crash, Endpoints, Helper, Stage
from harness.patterns.outbox import POINTS, RelayConfig, relay_body
from harness.run.core.session import RunSession
from harness.run.spec.files import resolve
from tests.support import make_spec, refused
from tests.unit.fake_endpoints import fake_endpoints

# The first stage of the outbox pattern and its tables; each test adds the rest of the flow.
OUTBOX = {
    "name": "outbox",
    "variant": "v",
    "handler": "harness.patterns.outbox:place_order",
    "schema": "outbox",
    "effect_table": "outbox_effects",
}

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
QUEUES = {"worker": "txchaos.r.in", "consumer": "txchaos.r.consumer"}


def test_relay_config_defaults_feed_the_consumer_stage() -> None:
    cfg = RelayConfig.from_options({"queues": QUEUES})
    assert cfg == RelayConfig("txchaos.r.consumer", sweeper=True, sweep_age_s=0.3, sweep_every_s=0.1)
    off = RelayConfig.from_options({"queues": QUEUES, "sweeper": False, "target": "worker", "sweep_age_s": 2})
    assert (off.queue, off.sweeper, off.sweep_age_s) == ("txchaos.r.in", False, 2.0)


@pytest.mark.parametrize(
    ("options", "named", "fix"),
    [
        ({"queues": QUEUES, "target": "billing"}, "'billing'", "options['target']"),
        ({}, "stages: none", "add a chain Stage"),
        ({"queues": QUEUES, "sweeper": "no"}, "sweeper='no'", "sweeper=False"),
        ({"queues": QUEUES, "sweep_age_s": 0}, "sweep_age_s=0", "0 < s <= 60"),
        ({"queues": QUEUES, "sweep_every_s": True}, "sweep_every_s=True", "in seconds"),
    ],
)
def test_bad_relay_options_name_value_and_fix(options: dict[str, object], named: str, fix: str) -> None:
    refused(lambda: RelayConfig.from_options(options), named, fix)


def test_relay_body_carries_the_producer_msg_id() -> None:
    # The inbox keys on msg_id: every resend of a row must carry the same one.
    body = json.loads(relay_body({"op": "op-1", "amount": 3}, "m-1"))
    assert body == {"op": "op-1", "amount": 3, "msg_id": "m-1"}


def test_scenario_variants_are_valid_and_hit_distinct_operations() -> None:
    specs = {s.variant: s for s in resolve("outbox_relay", seed=5, directory=SCENARIOS)}
    assert set(specs) == {"sweeper-off", "naive-consumer", "inbox-sweeper"}
    fixed = specs["inbox-sweeper"]
    assert fixed.expect == frozenset()
    assert len({c.op_index for c in fixed.crashes}) == len(fixed.crashes)
    assert {c.point for c in fixed.crashes} >= set(POINTS)
    assert {c.worker for c in fixed.crashes} == {"relay", "worker-0", "consumer-0"}
    assert specs["sweeper-off"].helpers[0].options == {"sweeper": False}


def test_spec_accepts_relay_points_only_when_declared() -> None:
    crashes = (Crash("relay_before_send", op_index=1, worker="relay"),)
    make_spec(OUTBOX, crashes=crashes, points=POINTS)
    refused(lambda: make_spec(OUTBOX, crashes=crashes), "relay_before_send")


def _endpoints() -> Endpoints:
    return fake_endpoints()


def test_helpers_are_told_the_queue_of_every_stage(tmp_path: Path) -> None:
    spec = make_spec(
        OUTBOX,
        chain=(Stage("consumer", "harness.patterns.outbox:consumer_inbox"),),
        helpers=(Helper("relay", "harness.patterns.outbox:relay", options={"sweeper": False}),),
    )
    run = RunSession(spec, _endpoints(), runs_root=tmp_path)
    relay = next(w for w in run.topology.worker_specs() if w.name == "relay")
    ns = f"txchaos.{run.folder.run_id}"
    assert relay.options == {"queues": {"worker": f"{ns}.in", "consumer": f"{ns}.consumer"}, "sweeper": False}
    assert RelayConfig.from_options(relay.options).queue == f"{ns}.consumer"
