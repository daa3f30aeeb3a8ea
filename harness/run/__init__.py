"""Run lifecycle: a scenario spec in, a run folder with ledger, logs and verdict out."""
