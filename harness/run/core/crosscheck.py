"""Verify finished runs a second time with the Spark engine and hold both engines to one verdict.

A live run's verdict comes from the in-process checker (``RunSession.close``). ``SparkCrossCheck``
keeps one Spark session for a whole pytest session or flagship run (the JVM starts once, ~10 s),
re-verifies each run folder with it, writes ``verdict-spark.json`` beside ``verdict.json`` and
returns the differences (``compare_verdicts``): any difference is a harness failure, since the
run can prove nothing while its two verifiers disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from harness.errors import HarnessError
from harness.run.core.outcome import RunResult
from harness.verify.assemble import compare_verdicts
from harness.verify.verdict import Verdict

SPARK_VERDICT = "verdict-spark.json"


@dataclass(frozen=True)
class CrossCheck:
    """The Spark engine's verdict of one run and its differences from the in-process one."""

    result: RunResult
    spark: Verdict
    diffs: tuple[str, ...]

    @property
    def agree(self) -> bool:
        return not self.diffs

    def line(self) -> str:
        """Return one line for a summary: agreement and the Spark job's time."""
        job = self.spark.timing.get("job_s", 0.0)
        if self.agree:
            return f"spark agrees (job {job:.1f}s)"
        return f"SPARK DISAGREES: {'; '.join(self.diffs[:3])}"


class SparkCrossCheck:
    """One long-lived Spark session that re-verifies run folders.

    >>> with SparkCrossCheck() as spark:
    ...     check = spark.verify(result)
    ...     assert check.agree, check.diffs
    """

    def __init__(self, master: str | None = None) -> None:
        self.master = master
        self._session: Any = None
        self.where = ""  # where the Spark jobs run: "connect sc://..." or the local master
        self.checks: list[CrossCheck] = []

    def __enter__(self) -> SparkCrossCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spark(self) -> Any:
        from harness.verify import spark  # starts a JVM: only when the first run is checked

        # Anything else in the process that stopped the session (getOrCreate shares one) must not
        # turn every later cross-check into a harness failure: start it again.
        if not spark.session_alive(self._session):
            # hook (issue 31): the stack's Spark Connect server when one answers, else a local JVM
            self._session, self.where = spark.session_for(self.master, driver_memory="1g")
        return self._session

    def verify(self, result: RunResult) -> CrossCheck:
        """Verify ``result``'s run folder with Spark; write its verdict; return the comparison."""
        from harness.verify import spark

        spec = result.spec
        try:
            verdict = spark.check_run(
                result.run_dir, spec.contract, scenario=spec.label, seed=spec.seed, spark=self._spark()
            )
        except Exception as exc:
            raise HarnessError(
                f"the Spark engine failed on {result.run_dir}: {exc}",
                hint=f"re-run it alone with `txchaos verify {result.run_dir}`; its ledger is kept",
            ) from exc
        verdict = replace(verdict, steps=result.verdict.steps)
        verdict.write(result.run_dir / SPARK_VERDICT)
        check = CrossCheck(result, verdict, tuple(compare_verdicts(result.verdict, verdict)))
        self.checks.append(check)
        return check

    def close(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None
