"""The per-run ledger: an append-only record of everything that happened in a run."""
