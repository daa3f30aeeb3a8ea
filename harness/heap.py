"""The cyclic garbage collector kept off what a long-running process loaded before its work.

A worker, or a soak's driver, holds a few hundred thousand objects it imported (SQLAlchemy,
pyarrow, the Kafka client, rich) for its whole life. Python's collector walks all of them at every
collection of its oldest generation, and the youngest generation's collections add up. Measured on
a 200,000-operation Kafka soak (``gc.callbacks``): the Kafka worker's collections took 1.5 s of its
8.8 s of CPU; in a 1,000,000-operation soak the driver's 26 collections of the oldest generation
took 85-104 ms each, the whole process paused, its sink included. Frozen (``gc.freeze``), that heap
is left out of every collection; what the work allocates is collected as before.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_loaded", "loaded_frozen"]


def freeze_loaded() -> None:
    """Collect once, then leave every object alive now out of later collections, for good.

    For a fork server: its children never copy the pages a collection would have written to.
    """
    gc.collect()
    gc.freeze()


@contextmanager
def loaded_frozen() -> Iterator[None]:
    """Freeze the objects alive now for the block's length, then give them back to the collector.

    A heap something else froze already is left as it is, before and after.
    """
    if gc.get_freeze_count():
        yield
        return
    freeze_loaded()
    try:
        yield
    finally:
        gc.unfreeze()
