"""Operation ids held as numbers: the session's OpIds and the sink's OpSet behave as a list and a set."""

from __future__ import annotations

import tracemalloc

import pytest

from harness.errors import HarnessError
from harness.run.spec.ops import OpIds, OpSet, split


def test_ids_are_derived_from_numbers_and_read_back_as_a_list() -> None:
    ops = OpIds("naive-s3-op")
    for _ in range(3):
        ops.append(ops.next_id())
    assert list(ops) == ["naive-s3-op00000", "naive-s3-op00001", "naive-s3-op00002"]
    assert ops[-1] == "naive-s3-op00002"
    assert ops[1:] == ["naive-s3-op00001", "naive-s3-op00002"]
    assert "naive-s3-op00002" in ops
    assert "naive-s3-op00003" not in ops
    assert "other-op00001" not in ops
    with pytest.raises(IndexError):
        ops[3]
    assert ops.id(123456) == "naive-s3-op123456"


def test_an_id_out_of_order_is_refused_since_none_is_stored() -> None:
    ops = OpIds("naive-s0-op")
    with pytest.raises(HarnessError, match="out of order"):
        ops.append("naive-s0-op00001")


def test_split_takes_only_ids_as_op_id_writes_them() -> None:
    assert split("naive-s0-op00012") == ("naive-s0-op", 12)
    assert split("naive-s0-op123456") == ("naive-s0-op", 123456)
    assert split("naive-s0-op012345") is None  # padded beyond five digits: not ours
    assert split("naive-s0-op12") is None
    assert split("order-42") is None
    assert split("x-op99999999999") is None  # a number too large for a byte each


def test_the_set_counts_what_came_out_once_each_numbered_or_not() -> None:
    ops = OpIds("fixed-s0-op")
    for _ in range(5):
        ops.append(ops.next_id())
    out = OpSet()
    for op in ("fixed-s0-op00001", "fixed-s0-op00001", "fixed-s0-op00004", "their-own-id", "other-s1-op00001"):
        out.add(op)
    assert len(out) == 4
    assert "fixed-s0-op00001" in out
    assert "their-own-id" in out
    assert "fixed-s0-op00000" not in out
    assert out.count_of(ops) == 2
    assert [op for op in ops if op not in out] == ["fixed-s0-op00000", "fixed-s0-op00002", "fixed-s0-op00003"]


def test_a_million_operations_cost_about_a_byte_each() -> None:
    tracemalloc.start()
    try:
        ops, out = OpIds("check-then-skip-s0-op"), OpSet()
        for _n in range(1_000_000):
            op = ops.next_id()
            ops.append(op)
            out.add(op)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.count_of(ops) == 1_000_000
    # As a list and a Counter of strings the same ids took about 250 MB.
    assert peak < 4_000_000, peak
