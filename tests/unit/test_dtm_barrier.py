"""The DTM barrier decisions and message body, without services."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.patterns.dtm_barrier import (
    CHECKBACK_FAILURE,
    CHECKBACK_SUCCESS,
    BarrierKey,
    checkback_answer,
    msg_body,
    naive_checkback_answer,
)


def test_checkback_follows_the_row_that_won_the_claim() -> None:
    assert checkback_answer("msg") == CHECKBACK_SUCCESS
    assert checkback_answer("rollback") == CHECKBACK_FAILURE
    with pytest.raises(HarnessError):
        checkback_answer(None)


def test_naive_checkback_says_failure_for_a_transaction_still_in_progress() -> None:
    # The window of variant 3: no row yet, the local transaction commits after the answer.
    assert naive_checkback_answer(False) == CHECKBACK_FAILURE


def test_barrier_key_and_body() -> None:
    with pytest.raises(HarnessError):
        BarrierKey("")
    assert BarrierKey("g1").params("rollback")["reason"] == "rollback"
    body = msg_body("g1", "http://b/credit", {"amount": 30}, checkback_url="http://a/check")
    assert body["retry_interval"] == body["timeout_to_fail"] == 2
    assert body["payloads"] == ['{"amount": 30}']
    with pytest.raises(HarnessError):
        msg_body("g1", "u", {}, checkback_url="c", interval_s=0)
