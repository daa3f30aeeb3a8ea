"""The services benchmark measures every example service, the JVM ones included, from the tests' scenarios."""

from __future__ import annotations

import pytest

from harness.bench.services import targets
from harness.errors import ConfigError


def test_every_example_service_is_a_benchmark_target() -> None:
    found = targets(["py", "go", "node", "jms", "spring-kafka"])
    for name, target in found.items():
        fixed, naive = target.fixed(messages=3), target.naive(messages=1)
        assert (fixed.messages, naive.messages) == (3, 1), name
        assert (fixed.service is None, naive.service is None) == (False, False), name
        assert (fixed.variant.endswith("naive"), naive.variant.endswith("naive")) == (False, True), name
    fixed_variants = [found[n].fixed(messages=1).variant for n in ("py", "jms", "spring-kafka")]
    assert fixed_variants == ["py-fixed", "check", "indexed"]


def test_an_unknown_service_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="choose from py, go, node, jms, spring-kafka"):
        targets(["py", "rabbit"])
