"""Adapters: each third-party driver is imported in exactly one module here."""
