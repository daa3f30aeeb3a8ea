"""Benchmarks: scripts that print figures and record them in docs/benchmarks.md."""
