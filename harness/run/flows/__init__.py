"""The built-in flows, each registered by its module (``register(Flow(...))``) when imported here."""

from harness.run.flows import activemq, cqrs, dtm, kafka, saga, service

__all__ = ["activemq", "cqrs", "dtm", "kafka", "saga", "service"]
