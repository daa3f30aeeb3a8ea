"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def spark_engine() -> Iterator[Any]:
    """Yield the Spark engine module and a local session (2 cores, 1 GB), stopped after the module's tests."""
    spark = pytest.importorskip("harness.verify.spark")
    session = spark.spark_session("local[2]", driver_memory="1g")
    yield spark, session
    session.stop()
