"""Hypothesis settings profiles for state machines against the real stack: dev, ci, nightly.

Every example is a real run (workers, broker, database), so examples are few and long; deadlines
are off and the too-slow health check is suppressed. Choose with ``$TXCHAOS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

from harness.errors import ConfigError

PROFILES = {"dev": 8, "ci": 15, "nightly": 200}
_COMMON = {
    "deadline": None,
    "stateful_step_count": 5,  # each step is real work; short programs shrink in far fewer runs
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    "print_blob": True,
    "derandomize": False,
}

for _name, _examples in PROFILES.items():
    settings.register_profile(f"txchaos-{_name}", max_examples=_examples, **_COMMON)  # type: ignore[arg-type]


def profile(name: str | None = None) -> settings:
    """Return the settings of profile ``name`` (default ``$TXCHAOS_PROFILE`` or ``dev``)."""
    choice = name or os.environ.get("TXCHAOS_PROFILE", "dev")
    if choice not in PROFILES:
        raise ConfigError(f"unknown Hypothesis profile {choice!r}", hint=f"use one of {', '.join(PROFILES)}")
    return settings.get_profile(f"txchaos-{choice}")
