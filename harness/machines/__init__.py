"""Hypothesis state machines that drive a pattern under faults and check its invariants."""
