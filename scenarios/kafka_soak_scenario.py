"""A Kafka soak whose nemesis only restarts the broker: the flow must run between the restarts.

A kill -9 of Kafka is healed by restarting it, and the consumer group then settles for seconds
(6-11 s measured), longer than the nemesis rests between windows. Before the driver waited for
the flow after each restart, the next kill came before the group had settled: a 90 s soak with
``--nemesis broker`` moved 880 operations, all in its first 3 s, and was judged clean on them.

Run one: ``txchaos soak kafka_consumer:inbox-offset --duration 45s --workers 2 --nemesis broker``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.run.spec.files import resolve
from harness.soak import Soak
from harness.soak.driver import PACE_LOG, RECOVER_S

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
HERE = Path(__file__).parent


def test_restarts_named_alone_let_the_consumer_group_recover_between_them(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    (spec,) = resolve("kafka_consumer:inbox-offset", 1, HERE)
    result = txchaos_soak(Soak(spec, duration_s=45.0, workers=2, nemesis=("broker",), seed=1))
    stats = result.stats
    assert result.verdict.clean, result.verdict.headline()
    assert stats.windows >= 2, stats  # at least two restarts, so one came after a recovery
    assert len(stats.recover_s) >= 2, stats
    assert all(wait < RECOVER_S for wait in stats.recover_s), stats.recover_s  # the group came back each time
    # Between one restart and the next, operations came out: the pace log's count of outputs
    # grows while no window is open, after every heal but the last.
    lines = [json.loads(line) for line in (result.run_dir / PACE_LOG).read_text().splitlines()]
    calm_spans: list[list[int]] = [[]]
    for line in lines:
        if line["open"]:
            calm_spans.append([])
        elif line["out"] is not None:
            calm_spans[-1].append(line["out"])
    between = [span for span in calm_spans[1:-1] if span]  # after a restart, before the next
    assert between, calm_spans
    assert all(span[-1] > span[0] for span in between), between
    # The old schedule moved everything before its first restart (880 operations in the first 3 s
    # of 90). Now more comes out after the first restart than before it; a rate bound would measure
    # the host, not the schedule (CI's slower host moved 1,385 in this test, this machine 2,510).
    before_first = calm_spans[0][-1] if calm_spans[0] else 0
    after_first = max(max(span) for span in calm_spans[1:] if span) - before_first
    assert after_first > before_first, calm_spans


def test_a_replica_with_nothing_downstream_is_fed_as_its_group_commits(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    # A CQRS replica writes no output. The closed loop used to wait for an output count that never
    # grew: it submitted one window (200 events) and nothing more for the rest of the soak.
    (spec,) = resolve("kafka_cqrs:versioned", 1, HERE)
    soak = Soak(spec, duration_s=8.0, workers=1, nemesis=(), seed=1)
    result = txchaos_soak(soak)
    assert result.verdict.clean, result.verdict.headline()
    assert result.stats.submitted > 2 * soak.in_flight, (result.stats, soak.in_flight)
    # The count the loop waited on is the group's: what it committed, every event in the end.
    lines = [json.loads(line) for line in (result.run_dir / PACE_LOG).read_text().splitlines()]
    assert max(line["out"] for line in lines) > soak.in_flight, lines[-3:]


def test_a_saga_soak_is_a_closed_loop_on_the_sagas_final_and_plots_its_own_operations(txchaos_soak) -> None:  # type: ignore[no-untyped-def]
    # A saga's soak counted nothing out: it ran paced at 20 sagas/s while its label said "closed
    # loop", and its plot counted each saga's two steps (submitted by the close, after their
    # commits) as submissions at the end.
    from harness.reporting.soak_data import soak_data

    (spec,) = resolve("kafka_saga:fixed", 1, HERE)
    soak = Soak(spec, duration_s=10.0, workers=1, nemesis=(), seed=1)
    assert "closed loop" in soak.label
    result = txchaos_soak(soak)
    assert result.verdict.clean, result.verdict.headline()
    lines = [json.loads(line) for line in (result.run_dir / PACE_LOG).read_text().splitlines()]
    outs = [line["out"] for line in lines]
    assert None not in outs, lines[:3]  # the loop waited on a count: the sagas final
    assert max(outs) == result.stats.submitted, (lines[-3:], result.stats)  # every saga final in the end
    data = soak_data(result.run_dir / "ledger")
    assert data.operations == result.stats.submitted
    assert data.by_flow == 2 * result.stats.submitted  # each saga's payment and seat steps
    assert sum(data.series.submitted) == result.stats.submitted
