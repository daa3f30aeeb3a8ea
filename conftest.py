"""Repository-wide pytest setup for txchaos's own suite (users get the fixtures from the plugin).

The fixtures, options and markers come from the ``pytest11`` plugin ``harness.pytest_plugin``,
installed with the package, exactly as another repository gets them: this file adds only what
the harness's own suite needs on top.
"""

from __future__ import annotations

import os


def pytest_configure() -> None:
    # CI runs the state machines with the `ci` Hypothesis profile unless a profile was chosen.
    if os.environ.get("CI") and not os.environ.get("TXCHAOS_PROFILE"):
        os.environ["TXCHAOS_PROFILE"] = "ci"
