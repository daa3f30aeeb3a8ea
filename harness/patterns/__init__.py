"""Patterns under test: stage handlers written against the public stage API (``StageContext``)."""
