"""Faults: one API for network, process and broker faults, each recorded in the ledger.

>>> from harness.faults import Latency, active
>>> with active(Latency(ms=200).on("activemq_stomp", endpoints), ledger):
...     ...
"""

from __future__ import annotations

from harness.faults.base import Fault, active
from harness.faults.broker import BrokerCrash, KillBroker, is_running, kill_service, restart_service
from harness.faults.network import (
    Bandwidth,
    Latency,
    LimitData,
    Partition,
    PartitionFault,
    ResetPeer,
    Slicer,
    SlowClose,
    Timeout,
    ToxicFault,
    ToxicSpec,
)
from harness.faults.process import Pause

__all__ = [
    "Bandwidth",
    "BrokerCrash",
    "Fault",
    "KillBroker",
    "Latency",
    "LimitData",
    "Partition",
    "PartitionFault",
    "Pause",
    "ResetPeer",
    "Slicer",
    "SlowClose",
    "Timeout",
    "ToxicFault",
    "ToxicSpec",
    "active",
    "is_running",
    "kill_service",
    "restart_service",
]
