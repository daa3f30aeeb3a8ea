"""The Spark engine: evaluates ``model.py`` on a run's ledger; the only pyspark importer.

``session.py`` makes the session (a local driver, or a client of the stack's Spark Connect
server); ``job.py`` runs the reconciliation through the DataFrame and SQL API on either.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import SparkSession

from harness.ledger.layout import read_layout
from harness.ledger.reader import PARQUET_NAME, segments_bytes
from harness.verify import assemble, model
from harness.verify.evidence import gather
from harness.verify.spark.job import check_events
from harness.verify.spark.session import (
    CDS_DUMP_ENV,
    ONE_SHOT_JVM_OPTIONS,
    Session,
    bare_start,
    build_class_archive,
    check_master,
    class_archive,
    driver_jvm_pid,
    quiet_log_config,
    remote_session,
    session_alive,
    session_for,
    spark_session,
)
from harness.verify.verdict import Verdict

__all__ = [
    "CDS_DUMP_ENV",
    "ONE_SHOT_JVM_OPTIONS",
    "Session",
    "bare_start",
    "build_class_archive",
    "check_events",
    "check_master",
    "check_run",
    "class_archive",
    "driver_jvm_pid",
    "quiet_log_config",
    "remote_session",
    "session_alive",
    "session_for",
    "spark_session",
]


# A one-shot driver skips the optimizing compiler only while the job is short. Cold `txchaos
# verify`, measured: 10M events 14.3 s without C2 against 15.8 s with it; 100M 64.9 s against
# 47.2 s. The two meet near 17M events.
ONE_SHOT_MAX_EVENTS = 15_000_000
SEGMENT_BYTES_PER_EVENT = 320  # a ledger line, measured on real runs: for a ledger not yet compacted


def ledger_events(ledger_dir: Path) -> int:
    """Return how many events ``ledger_dir`` holds: the compacted layout's count, else an estimate
    from its segments' size."""
    layout = read_layout(ledger_dir / PARQUET_NAME)
    if layout is not None and isinstance(layout.get("events"), int):
        return int(layout["events"])
    return segments_bytes(ledger_dir) // SEGMENT_BYTES_PER_EVENT


def _session(spark: Session | None, master: str | None, verbose: bool, events: int) -> tuple[Session, str, bool]:
    """Return the session to run on, where it runs, and whether this call owns (and must stop) it.

    A session this process already runs (a pytest session's cross-check) is borrowed, never
    stopped: getOrCreate would hand it back anyway, and stopping it would break its owner.
    """
    if spark is not None:
        return spark, "given", False
    active = SparkSession.getActiveSession() if master is None else None
    if active is not None and session_alive(active):
        return active, "borrowed", False
    session, where = session_for(master, verbose=verbose, one_shot=events <= ONE_SHOT_MAX_EVENTS)
    return session, where, True


def check_run(
    run_dir: Path,
    contract: model.FlowContract,
    *,
    scenario: str = "",
    seed: int | None = None,
    master: str | None = None,
    spark: Session | None = None,
    verbose: bool = False,
) -> Verdict:
    """Return the Spark engine's verdict for ``run_dir/ledger``.

    With no ``spark`` given it reaches the stack's Connect server when one answers (and no
    ``master`` is named), else starts (and stops) a local session whose JVM logs errors only unless
    ``verbose``. ``verdict.timing`` says which: ``connect_s`` (the client's connect) or
    ``jvm_start_s``. An incomplete or damaged folder gets an ``incomplete`` verdict, as in the
    in-process engine.
    """
    if spark is None and master is not None:
        check_master(master)  # a bad master is the user's input: refuse before touching the folder
    evidence = gather(run_dir)  # before the JVM: a damaged compacted ledger is rebuilt, not read
    t0 = time.perf_counter()
    session, where, own = _session(spark, master, verbose, ledger_events(run_dir / "ledger"))
    t1 = time.perf_counter()
    phases: dict[str, float] = {}
    try:
        agg, witnesses, windows, unmatched, fault_rows = check_events(
            session, run_dir / "ledger", contract, phases, snapshot=evidence.closed, intact=evidence.intact
        )
        t2 = time.perf_counter()
    finally:
        if own:
            session.stop()  # a Connect client's stop closes its own session, never the server
    start_key = "connect_s" if where.startswith("connect ") else "jvm_start_s"
    timing = {start_key: round(t1 - t0, 3) if own else 0.0, "job_s": round(t2 - t1, 3), **phases}
    verdict = assemble.make_verdict(
        agg,
        witnesses,
        windows,
        unmatched,
        engine="spark",
        scenario=scenario,
        seed=seed,
        timing=timing,
        fault_rows=fault_rows,
    )
    return evidence.apply(verdict, contract)
