"""The run lifecycle written once: the session, the run folder, the entry point (signals: ``harness/signals.py``)."""
