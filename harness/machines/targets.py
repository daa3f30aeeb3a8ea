"""The state-machine targets: per pattern, its bad and fixed specs, its machine and the anomaly to find.

One registry for every consumer: ``txchaos bench machines`` measures each target, the machine
scenarios run them, and a test enumerates them. A pattern joins by adding one entry:

>>> target = TARGETS["onepc"]()
>>> Machine = target.machine(target.bad, endpoints, **target.attrs)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.machines.cqrs import cqrs_machine
from harness.machines.saga import saga_machine
from harness.machines.stage import stage_machine
from harness.patterns import bank, outbox, send_money
from harness.run.spec.scenario import Helper, ScenarioSpec, Stage
from harness.verify.model import FlowContract, Invariant


@dataclass(frozen=True)
class Target:
    """One pattern: its bad and fixed specs, the machine's extra rules, the anomaly to find."""

    pattern: str
    bad: ScenarioSpec
    fixed: ScenarioSpec
    anomaly: str
    attrs: dict[str, Any] = field(default_factory=dict)
    # Binds a spec to its state machine class: the stage machine, or a pattern's own (the saga's).
    machine: Callable[..., Any] = stage_machine


def _spec(name: str, variant: str, handler: str, schema: str, effect_table: str, **fields: Any) -> ScenarioSpec:
    """Return machine spec ``name``/``variant`` running ``handler`` ("module:function" in harness.patterns)."""
    return ScenarioSpec(
        name=name,
        variant=variant,
        handler=f"harness.patterns.{handler}",
        schema=schema,
        effect_table=effect_table,
        **fields,
    )


def _onepc(variant: str, handler: str) -> ScenarioSpec:
    return _spec(
        "onepc_machine", variant, f"onepc:{handler}", "onepc", "onepc_effects", options={"table": "onepc_effects"}
    )


def _poison(variant: str, handler: str) -> ScenarioSpec:
    # A poison example ends when the worker has crash-looped more than max_deliveries times: 5
    # keeps an example ~2 s (the fixed stage diverts after 3 deliveries, well inside it).
    contract = FlowContract(max_deliveries=5)
    return _spec(
        "poison_machine", variant, f"poison:{handler}", "poison", "poison_effects", timeout_s=20.0, contract=contract
    )


def _send_money(variant: str, handler: str) -> ScenarioSpec:
    bank_helper = Helper("bank", "harness.patterns.bank:main", port=True)
    points = (*send_money.POINTS, *bank.POINTS)
    contract = FlowContract(min_external_calls=1)
    return _spec(
        "send_money_machine",
        variant,
        f"send_money:{handler}",
        "bank",
        "payments",
        helpers=(bank_helper,),
        points=points,
        contract=contract,
    )


def _deposit(variant: str, handler: str) -> ScenarioSpec:
    # A double-apply that adds no row: only the declared effect and the balance invariant see it.
    balance = Invariant("balance", bank.BALANCE_SQL, label=bank.BALANCE_LABEL)
    contract = FlowContract(effect_sql=bank.DEPOSIT_EFFECT_SQL, invariants=(balance,))
    return _spec("deposit_machine", variant, f"bank:{handler}", "deposits", "deposits", contract=contract)


def _outbox(variant: str, consumer: str) -> ScenarioSpec:
    # After a relay crash an example waits for the sweeper (rows unsent 0.3 s) and the restart.
    relay = Helper("relay", "harness.patterns.outbox:relay", options={"sweeper": True})
    chain = (Stage("consumer", f"harness.patterns.outbox:{consumer}"),)
    return _spec(
        "outbox_machine",
        variant,
        "outbox:place_order",
        "outbox",
        "outbox_effects",
        outbox_table="outbox",
        chain=chain,
        helpers=(relay,),
        points=outbox.POINTS,
        timeout_s=30.0,
        settle_s=0.3,
    )


def _kafka(variant: str, handler: str, module: str = "kafka_consumer", **options: object) -> ScenarioSpec:
    # Static membership: a restarted consumer takes its partition back at once instead of after
    # the dead member's session timeout (6 s), so a crash costs an example ~1 s, not 7.
    options = {"batch_size": 5, "partitions": 1, "static_membership": True, **options}
    return _spec(
        "kafka_machine",
        variant,
        f"{module}:{handler}",
        "kafka_consumer",
        "kafka_effects",
        flow="kafka",
        options=options,
        timeout_s=30.0,
    )


def _kafka_batch(variant: str, handler: str, batch_errors: str) -> ScenarioSpec:
    # The batch listener's whole batch in one DB transaction; 3 attempts, then the dead-letter topic.
    return _kafka(variant, handler, "kafka_batch", db_tx="batch", batch_errors=batch_errors, max_attempts=3)


def _saga(variant: str, expect: frozenset[str] = frozenset(), **saga: object) -> ScenarioSpec:
    # One record per poll and static membership: a crash redelivers one request, and the
    # restarted stage takes its partition back at once.
    options = {"batch_size": 1, "partitions": 1, "static_membership": True, "max_attempts": 3, "backoff_ms": 50}
    contract = FlowContract(expects_downstream=False, max_deliveries=None)
    return _spec(
        "kafka_saga_machine",
        variant,
        "kafka_saga:orchestrator",
        "kafka_saga",
        "saga_payments",
        flow="kafka_saga",
        options={**options, **saga},
        timeout_s=30.0,
        contract=contract,
        expect=expect,
    )


def _cqrs(variant: str, handler: str, expect: frozenset[str] = frozenset()) -> ScenarioSpec:
    # Static membership as for the consumer; a batch of 5 holds an entity's create, update and delete.
    # ``expect``: the class the bad variant's search hunts (harness.machines.cqrs).
    options = {"batch_size": 5, "partitions": 1, "static_membership": True}
    contract = FlowContract(expects_downstream=False, per_key=True)
    return _spec(
        "kafka_cqrs_machine",
        variant,
        f"kafka_cqrs:{handler}",
        "kafka_cqrs",
        "cqrs_journal",
        flow="kafka_cqrs",
        effect_column="event_id",
        options=options,
        timeout_s=30.0,
        contract=contract,
        expect=expect,
    )


TARGETS: dict[str, Callable[[], Target]] = {
    "onepc": lambda: Target(
        "1PC stage", _onepc("naive", "naive"), _onepc("cts", "check_then_skip"), "duplicate-effect"
    ),
    "poison": lambda: Target(
        "poison message",
        _poison("crashing", "crashing"),
        _poison("counter", "attempt_counter"),
        "never-dead-lettered-poison",
        {"poison": True, "crash_points": (), "redelivery_actions": ()},
    ),
    "send_money": lambda: Target(
        "send money",
        _send_money("naive", "naive"),
        _send_money("guarded", "guarded"),
        "duplicate-external-call",
        {"crash_points": ("after_external_call", *send_money.POINTS, "after_db_commit")},
    ),
    "deposit": lambda: Target(
        "deposit whose double-apply adds no row",
        _deposit("upsert", "deposit_upsert"),
        _deposit("once", "deposit_once"),
        "invariant-broken",
    ),
    "outbox": lambda: Target(
        "inbox/outbox relay",
        _outbox("naive-consumer", "consumer_naive"),
        _outbox("inbox", "consumer_inbox"),
        "duplicate-effect",
        {"crash_points": (*outbox.POINTS, "after_db_commit"), "redelivery_actions": ()},
    ),
    "kafka": lambda: Target(
        "Kafka at-least-once consumer", _kafka("naive", "naive"), _kafka("inbox", "inbox_offset"), "duplicate-effect"
    ),
    # The auto offset store's window only: a crash after the poll, before the DB commit. A crash
    # after the DB commit is the naive consumer's other bug (duplicate-effect), hunted above.
    "kafka_auto": lambda: Target(
        "Kafka auto offset store",
        _kafka("auto-store", "naive", offset_store="auto", commit="record"),
        _kafka("inbox-event", "inbox_event"),
        "lost",
        {"crash_points": ("after_poll",), "redelivery_actions": ()},
    ),
    # Poison records among good ones, and latency: the batch listener's fault family.
    "kafka_batch": lambda: Target(
        "Kafka batch listener",
        _kafka_batch("naive-listener", "naive_listener", "retry_batch"),
        _kafka_batch("indexed-listener", "indexed_listener", "index"),
        "dead-lettered",
        {"poison": True, "crash_points": (), "redelivery_actions": (), "batch_crashes": False},
    ),
    "saga": lambda: Target(
        "Kafka saga",
        _saga("naive", frozenset({"duplicate-effect"}), participant="naive", reply="after_commit"),
        _saga("fixed"),
        "duplicate-effect",
        machine=saga_machine,
    ),
    "cqrs": lambda: Target(
        "Kafka CQRS replica",
        _cqrs("naive", "naive_replica", frozenset({"resurrected"})),
        _cqrs("versioned", "versioned_replica"),
        "resurrected",
        machine=cqrs_machine,
    ),
}
