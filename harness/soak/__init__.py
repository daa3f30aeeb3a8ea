"""Soak runs: one scenario driven for minutes or a million operations under a seeded nemesis.

``Soak`` says what to run (``harness.soak.spec``), ``harness.soak.nemesis`` draws the fault
schedule as steps, ``run_soak`` drives it on one run session and judges one ledger
(``harness.soak.driver``). ``txchaos soak`` and the ``txchaos_soak`` fixture call ``run_soak``.
"""

from harness.soak.driver import SoakResult, SoakStats, run_soak
from harness.soak.nemesis import DEFAULT, KINDS, Pace, Schedule, plan
from harness.soak.spec import Soak, parse_duration

__all__ = [
    "DEFAULT",
    "KINDS",
    "Pace",
    "Schedule",
    "Soak",
    "SoakResult",
    "SoakStats",
    "parse_duration",
    "plan",
    "run_soak",
]
