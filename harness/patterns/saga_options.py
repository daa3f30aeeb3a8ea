"""How a Kafka saga run is put together: its processes, steps and options, validated early.

Kept free of client imports so a scenario spec can be checked before any service starts.

A saga run has three worker processes: the ``orchestrator`` and two participants, ``payment``
and ``seat``. Every saga is the operation the driver submits (``<op>``); each request the
orchestrator sends is an operation of its own, ``<op>.pay``, ``<op>.seat`` and, when the seat
is refused, the compensation ``<op>.refund`` (``step_op``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from harness.errors import ConfigError

ORCHESTRATOR, PAYMENT, SEAT = "orchestrator", "payment", "seat"
PROCESSES = (ORCHESTRATOR, PAYMENT, SEAT)
# Step -> the participant that runs it.
STEPS = {"pay": PAYMENT, "seat": SEAT, "refund": PAYMENT}
FINAL_STATES = ("completed", "compensated")
# naive: applies the step on every delivery. unique: a unique key refuses a redelivered step
# (the error is retried, then the request dead-lettered). inbox: claims the step's id in the
# step's transaction; a redelivery skips the effect and replies with the stored decision.
PARTICIPANTS = ("naive", "unique", "inbox")
# after_commit: DB commit, reply produced, offset committed. transaction: the reply and the
# offset in one Kafka transaction (send_offsets_to_transaction), read_committed downstream.
REPLIES = ("after_commit", "transaction")
_KAFKA_COMMIT = {"after_commit": "batch", "transaction": "transaction"}


def step_op(saga: str, step: str) -> str:
    """Return the operation id of ``saga``'s request ``step`` (``pay``, ``seat``, ``refund``)."""
    return f"{saga}.{step}"


def first_step_of(process: str) -> str:
    """Return the forward step a process is armed on by a saga's number (the orchestrator: none)."""
    return {PAYMENT: "pay", SEAT: "seat"}.get(process, "")


@dataclass(frozen=True)
class SagaOptions:
    """The saga's variant (``ScenarioSpec.options`` keys of the same name).

    ``participant``: how both participants guard a step (``PARTICIPANTS``). ``reply``: how
    they reply (``REPLIES``). ``dlt_replies``: the orchestrator also reads the participants'
    dead-letter topics and takes a dead-lettered request as a failed step (the recovery
    callback of the seed), compensating; without it a dead-lettered step leaves its saga waiting.
    ``resend``: the orchestrator keeps each handled record with the request it sent and, when
    the same record comes back (it died after its DB commit, before the request went out),
    sends it again; without it the redelivered record finds its saga moved on and is skipped.
    ``refuse_seat``: saga numbers whose seat the seat participant refuses (a semantic error).
    ``flaky_seat``: saga numbers whose seat request fails ``fail_times`` times with a transient
    error before it succeeds (more than ``max_attempts``: it is dead-lettered).
    ``compensate``: a refused seat is compensated by a refund; False marks the saga compensated
    without it (the bad variant only ``kafka_saga.SAGA_NET_SQL``, a declared invariant, catches).
    """

    participant: str = "inbox"
    reply: str = "transaction"
    dlt_replies: bool = True
    resend: bool = True
    refuse_seat: tuple[int, ...] = ()
    flaky_seat: tuple[int, ...] = ()
    fail_times: int = 99
    compensate: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("participant", PARTICIPANTS), ("reply", REPLIES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"saga option {name}={value!r}", hint=f"use one of {', '.join(allowed)}")
        for name in ("dlt_replies", "resend", "compensate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"saga option {name}={getattr(self, name)!r}", hint="use True or False")
        for name in ("refuse_seat", "flaky_seat"):
            numbers = getattr(self, name)
            if not all(isinstance(n, int) and n >= 0 for n in numbers):
                raise ConfigError(f"saga option {name}={numbers!r}", hint="give saga numbers (0, 1, ...)")
        if isinstance(self.fail_times, bool) or not isinstance(self.fail_times, int) or not 0 <= self.fail_times <= 99:
            raise ConfigError(f"saga option fail_times={self.fail_times!r}", hint="use a whole number from 0 to 99")

    @property
    def commit(self) -> str:
        """Return the Kafka stage ``commit`` mode of the participants."""
        return _KAFKA_COMMIT[self.reply]

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SagaOptions:
        """Pick this class's keys out of a spec's options (lists become tuples)."""
        names = {f.name for f in fields(cls)}
        picked: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items() if k in names}
        return cls(**picked)
