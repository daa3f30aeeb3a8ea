"""Run lifecycle: a scenario spec in, a run folder with ledger, logs and verdict out.

The layers, lowest first (``tests/unit/test_architecture.py`` holds them): ``spec`` (what a run
is: specs, flows' registrations, schemas, services, steps), ``transports`` (the brokers as the
driver sees them, with their sinks) and ``processes`` (workers and service instances kept
running), ``core`` (the lifecycle written once, the parts' protocols and the shared parts, the
run folder, ``run_scenario``), ``flows`` (each flow's own parts and its ``register(Flow(...))``).
Importing this package registers the flows.
"""

from harness.run import flows as flows
