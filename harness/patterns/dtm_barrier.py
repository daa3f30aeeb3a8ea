"""DTM 2-phase message barrier: the SQL and the decisions, no I/O (seed: DTM 2-phase messages)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.errors import HarnessError

# ON CONFLICT DO NOTHING is Postgres' "insert ignore": rowcount 1 means this caller won the claim.
INSERT_IGNORE = (
    "INSERT INTO dtm_barrier (trans_type, gid, branch_id, op, barrier_id, reason) "
    "VALUES ('msg', :gid, :branch_id, :op, :barrier_id, :reason) ON CONFLICT DO NOTHING"
)
SELECT_REASON = (
    "SELECT reason FROM dtm_barrier "
    "WHERE gid = :gid AND branch_id = :branch_id AND op = :op AND barrier_id = :barrier_id"
)

# The business transaction's own barrier row, as DTM's DoAndSubmitDB writes it.
MSG_BRANCH, MSG_OP, MSG_BARRIER = "00", "msg", "01"
CHECKBACK_SUCCESS, CHECKBACK_FAILURE = "SUCCESS", "FAILURE"


@dataclass(frozen=True)
class BarrierKey:
    """One barrier row's key; ``gid`` is the DTM global transaction id."""

    gid: str
    branch_id: str = MSG_BRANCH
    op: str = MSG_OP
    barrier_id: str = MSG_BARRIER

    def __post_init__(self) -> None:
        if not self.gid:
            raise HarnessError("a barrier key needs a gid", hint="take it from DtmClient.new_gid()")

    def params(self, reason: str) -> dict[str, str]:
        return {
            "gid": self.gid,
            "branch_id": self.branch_id,
            "op": self.op,
            "barrier_id": self.barrier_id,
            "reason": reason,
        }


def checkback_answer(reason: str | None) -> str:
    """Map the barrier reason read after the insert-ignore to DTM's check-back answer.

    The business row ('msg') means the local transaction committed; 'rollback' means the
    check-back's own insert won, so the local transaction can never commit its barrier row.
    """
    if reason == MSG_OP:
        return CHECKBACK_SUCCESS
    if reason == "rollback":
        return CHECKBACK_FAILURE
    raise HarnessError(
        f"barrier reason {reason!r} after an insert-ignore", hint="the row must exist: was the insert rolled back?"
    )


def naive_checkback_answer(found: bool) -> str:
    """The SELECT-only check-back: a missing row is taken as 'rolled back' (the bug it shows)."""
    return CHECKBACK_SUCCESS if found else CHECKBACK_FAILURE


def msg_body(
    gid: str, branch_url: str, payload: dict[str, Any], *, checkback_url: str, interval_s: int = 2
) -> dict[str, Any]:
    """The body of DTM's ``prepare``/``submit`` for a one-branch message.

    ``retry_interval`` and ``timeout_to_fail`` equal and small: check-back in about that many
    seconds instead of the server's 10 s minimum (see fixtures/dtm/dtm.yml).
    """
    if interval_s < 1:
        raise HarnessError(f"interval_s={interval_s}", hint="DTM counts whole seconds; use 1 or more")
    return {
        "gid": gid,
        "trans_type": "msg",
        "steps": [{"action": branch_url}],
        "payloads": [json.dumps(payload)],
        "query_prepared": checkback_url,
        "retry_interval": interval_s,
        "timeout_to_fail": interval_s,
    }
