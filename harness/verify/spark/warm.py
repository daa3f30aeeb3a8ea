"""Warm a fresh Spark Connect server: ``python -m harness.verify.spark.warm`` (``txchaos up`` runs it).

A server's first verification compiles the job's generated code and its hot loops (at 1M events the
first job took 12.5 s, the next 3.0 s); the compiled code is kept for every later job of the same
shape. So ``txchaos up`` has this process verify a small synthetic ledger through the server twice,
in the background, and a user's first ``txchaos verify`` finds the server warm.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from harness.ledger.synth import synth_run
from harness.stack import spark_connect
from harness.verify.cli import contract_of
from harness.verify.spark import check_run, remote_session

WARM_EVENTS = 200_000
WARM_JOBS = 2


def main() -> int:
    """Verify a small synthetic ledger ``WARM_JOBS`` times on the server ``$TXCHAOS_SPARK_CONNECT`` names."""
    url = os.environ.get(spark_connect.ENV, "")
    if not url.startswith("sc://"):
        sys.stderr.write(f"set {spark_connect.ENV}=sc://HOST:PORT to the server to warm\n")
        return 2
    # under the working folder: ``txchaos up`` starts this in the server's scratch folder, which
    # ``txchaos down`` removes even when it stops this process half-way
    with tempfile.TemporaryDirectory(prefix="warm-", dir=Path.cwd()) as tmp:
        run = synth_run(Path(tmp) / "run", WARM_EVENTS, seed=1)
        session = remote_session(url)
        try:
            for _ in range(WARM_JOBS):
                verdict = check_run(run, contract_of(run), spark=session)
                sys.stdout.write(f"warm-up job {verdict.timing['job_s']} s\n")
        finally:
            session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
