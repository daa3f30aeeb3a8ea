"""``txchaos bench soak --flow``: one flow's runs, printed; refused before any stack when it would write."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from harness.bench import soak


def test_one_flow_that_would_write_is_refused_before_any_stack(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_stack() -> None:
        raise AssertionError("a stack was started for a refused command")

    monkeypatch.setattr(soak, "bench_stack", no_stack)
    with pytest.raises(SystemExit) as exit_:
        soak.main(["--flow", "kafka"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--flow kafka" in err, err
    assert "--no-write" in err, err


def test_one_flow_runs_only_that_flows_pairs_and_soaks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The benchmark's own routing, its measurements stood in for: which flows' pairs and soaks run."""
    pairs: list[str] = []
    soaks: list[str] = []

    @contextmanager
    def stack() -> Iterator[object]:
        yield object()

    def fake_pairs(flow: str, *_: Any) -> list[list[object]]:
        pairs.append(flow)
        return [[f"{flow} pair", *["-"] * 9]]

    def fake_soak(case: int, *_: Any) -> dict[str, Any]:
        soaks.append(soak.CASES[case].size)
        return {}

    monkeypatch.setattr(soak, "bench_stack", stack)
    monkeypatch.setattr(soak, "_pairs", fake_pairs)
    monkeypatch.setattr(soak, "_soak", fake_soak)
    monkeypatch.setattr(soak, "_soak_row", lambda case, s, note="": [case.label, *["-"] * 9])
    monkeypatch.setattr(soak, "write_section", lambda *_: pytest.fail("--no-write wrote docs"))
    assert soak.main(["--flow", "kafka", "--no-write"]) == 0
    assert pairs == ["kafka"]
    assert soaks, "no soak ran"
    assert set(soaks) == {"kafka"}, soaks  # no ActiveMQ soak, no service soak
    assert "kafka pair" in capsys.readouterr().out
