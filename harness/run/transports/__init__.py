"""The transports a flow's session can run on (``harness.run.transports.base.Transport``)."""
