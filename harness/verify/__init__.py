"""Verification: one model (``model.py``), two engines (in-process ``checker.py``, Spark ``spark.py``)."""
