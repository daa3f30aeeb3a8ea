"""Fixtures the unit tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Unit tests run their Spark work in local sessions, whether or not a developer's `txchaos up`
# stack runs a Spark Connect server: a process that once reached one builds every Column for
# Connect, which would break the local sessions of the tests after it. The Connect tests opt in.
os.environ.setdefault("TXCHAOS_SPARK_CONNECT", "off")


@pytest.fixture(scope="module")
def spark_engine() -> Iterator[Any]:
    """Yield the Spark engine module and a local session (2 cores, 1 GB), stopped after the module's tests."""
    spark = pytest.importorskip("harness.verify.spark")
    session = spark.spark_session("local[2]", driver_memory="1g")
    yield spark, session
    session.stop()
