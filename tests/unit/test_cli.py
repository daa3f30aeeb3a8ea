"""Bad input exits 2 with a message naming the value and the fix, before any service starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from tests.unit.fake_endpoints import fake_endpoints

REPO = Path(__file__).resolve().parents[2]


def test_unknown_scenario_names_what_exists(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["run", "no_such_scenario"]) == 2
    out = capsys.readouterr().err
    assert "no_such_scenario" in out
    assert "onepc_crash_gap" in out  # the hint lists what is available


def test_unknown_variant(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["run", "onepc_crash_gap:bogus"]) == 2
    out = capsys.readouterr().err
    assert "'bogus'" in out
    assert "check-then-skip" in out


def test_bad_seed_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "onepc_crash_gap", "--seed", "x"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 2
    assert "seed 'x' is not an integer" in proc.stderr


def test_bad_provider_env(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TXCHAOS_PROVIDER", "kubernetes")
    monkeypatch.delenv("TXCHAOS_ENDPOINTS", raising=False)
    monkeypatch.setenv("TXCHAOS_REPORTS", str(REPO / "reports" / "unit-cli"))
    assert main(["run", "onepc_crash_gap:naive"]) == 2
    assert "'kubernetes'" in capsys.readouterr().err


def test_missing_endpoints_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TXCHAOS_ENDPOINTS", str(tmp_path / "nope.json"))
    assert main(["run", "onepc_crash_gap:naive"]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_test_command_passes_dash_options_to_pytest() -> None:
    from harness.cli import build_parser

    args, extra = build_parser().parse_known_args(["test", "-p", "no:cacheprovider", "-k", "x"])
    assert args.command == "test"
    assert extra == ["-p", "no:cacheprovider", "-k", "x"]


def test_printed_endpoints_keep_the_database_password_out(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import _print_endpoints

    secret = "s3cret-per-stack"
    _print_endpoints(fake_endpoints(db_user="txchaos", db_password=secret, db_name="txchaos"))
    out = capsys.readouterr().out
    assert secret not in out
    assert "txchaos:***@127.0.0.1:20001/txchaos" in out


def test_report_refuses_a_history_folder_without_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results").mkdir()
    assert main(["report", str(tmp_path / "results"), "--history", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no history/ folder" in err
    assert "Hint: pass the folder of an earlier report" in err


def test_the_flagship_takes_the_newest_earlier_report_with_a_history(tmp_path: Path) -> None:
    from harness.cli.suite import _latest_report

    assert _latest_report(tmp_path / "none") is None
    for run in ("20260101-000000", "20260102-000000", "20260103-000000"):
        (tmp_path / run / "allure-report").mkdir(parents=True)
    for run in ("20260101-000000", "20260102-000000"):  # the newest has no history: it never finished
        (tmp_path / run / "allure-report" / "history").mkdir()
        (tmp_path / run / "allure-report" / "history" / "history-trend.json").write_text("[]")
    assert _latest_report(tmp_path) == tmp_path / "20260102-000000" / "allure-report"


@pytest.mark.parametrize(("codes", "expected"), [([6, 1], 1), ([1, 4, 6], 4), ([6], 6), ([4, 0], 4), ([0, 0], 0)])
def test_run_keeps_the_most_telling_exit_code(codes: list[int], expected: int) -> None:
    # txchaos run over several specs: an incomplete run (4) says the verdict cannot be known, so it
    # outranks anomalies (1), which outrank a fault that never fired (6)
    import functools

    from harness import cli

    assert functools.reduce(cli.most_telling, codes, 0) == expected


@pytest.mark.parametrize(
    ("option", "named", "fix"),
    [
        ("bacth_size=500", "'bacth_size'", "batch_size"),  # a misspelt key would change nothing
        ("batch_size=0", "batch_size=0", "from 1 to 10000"),  # the flow's own check
        ("batch_size", "'batch_size'", "KEY=VALUE"),
    ],
)
def test_a_soak_option_is_refused_naming_it_before_any_service_starts(
    option: str, named: str, fix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TXCHAOS_ENDPOINTS", str(REPO / "no-such-endpoints.json"))  # never reached
    assert main(["soak", "kafka_consumer:inbox-offset-batch", "--option", option]) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert fix in err, err


def test_soak_options_change_the_scenario_and_its_window() -> None:
    import argparse

    from harness.cli.soak import build_soak
    from harness.soak import Soak
    from harness.worker.kafka_options import KafkaStageOptions

    given = ["batch_size=500", "partitions=3", "commit=transaction"]
    args = argparse.Namespace(
        scenario=str(REPO / "scenarios/kafka_consumer_scenario.py:inbox-offset-batch"),
        seed=0,
        nemesis="none",
        duration=None,
        ops=1000,
        workers=1,
        rate=None,
        window=0,
        option=given,
        engine="spark",
        master=None,
    )
    soak = build_soak(args)
    assert isinstance(soak, Soak)
    settings = soak.scenario.settings_as(KafkaStageOptions)
    assert (settings.batch_size, settings.partitions, settings.commit) == (500, 3, "transaction")
    assert soak.in_flight == 4 * 500 * 3  # four full batches a partition
    args.option, args.window = [], 50
    assert build_soak(args).in_flight == 50  # type: ignore[attr-defined]


def test_every_soak_command_in_the_soak_guide_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guide's commands build their soak (scenario, variant, options, nemesis); none runs."""
    import re
    import shlex

    from harness.cli import build_parser
    from harness.cli.soak import build_soak

    monkeypatch.chdir(REPO)
    commands = re.findall(r"^\$? ?txchaos (soak .+)$", (REPO / "docs/soak.md").read_text(), re.M)
    assert len(commands) >= 4, commands
    for command in commands:
        build_soak(build_parser().parse_args(shlex.split(command)))


def test_replaying_a_soak_folder_is_refused_with_the_soak_that_runs_it_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import json
    import shlex

    from harness.soak.driver import SUMMARY

    folder = tmp_path / "20261130-002151-kafka_consumer-inbox-offset-s0-9fc6"
    folder.mkdir()
    (folder / "steps.jsonl").write_text('{"step": "submit", "count": 200, "poison": false, "extra": {}}\n')
    ran = {"scenario": "kafka_consumer:inbox-offset", "ops": None, "duration_s": 30.0, "workers": 3, "rate": 5.0}
    options = {"batch_size": 500, "offset_store": "manual", "tag": "500"}
    (folder / SUMMARY).write_text(json.dumps({**ran, "seed": 7, "options": options}))
    assert main(["replay", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "is a soak's folder" in err
    again = shlex.split(err[err.index("txchaos soak") :])
    nemesis = str(folder / "nemesis.json")
    assert again == shlex.split(
        "txchaos soak kafka_consumer:inbox-offset --duration 30s --workers 3 --rate 5 --option batch_size=500 "
        f"--option offset_store=manual --option 'tag=\"500\"' --seed 7 --nemesis {nemesis}"
    )
    # Each --option reads back as the value the soak ran with.
    from harness.cli.soak import parse_options

    given = [again[i + 1] for i, word in enumerate(again) if word == "--option"]
    assert parse_options(given) == options


def test_the_soak_help_names_every_nemesis_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.soak.nemesis import KINDS

    with pytest.raises(SystemExit):
        main(["soak", "--help"])
    listed = "".join(capsys.readouterr().out.split())  # argparse wraps the help, even inside a word
    assert f"acommalistof{','.join(KINDS)}|" in listed


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--master", "nope"], "Spark master 'nope' is not a spark:// or local[...] URL"),
        (["--master", "spark://127.0.0.1:1"], "no Spark master answers at 127.0.0.1:1"),
        (["--engine", "in-process", "--master", "local[2]"], "--master local[2] with --engine in-process"),
    ],
)
def test_a_soak_refuses_a_bad_verification_before_any_service_starts(
    extra: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.cli.stacks as stacks

    def no_stack(*_: object, **__: object) -> None:
        raise AssertionError("a stack was started")

    monkeypatch.setattr(stacks, "running_stack", no_stack)
    monkeypatch.chdir(REPO)
    assert main(["soak", "onepc_crash_gap:naive", "--ops", "10", *extra]) == 2
    assert said in capsys.readouterr().err


def test_status_and_down_see_the_stack_txchaos_endpoints_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shell whose runs reach a stack through $TXCHAOS_ENDPOINTS, with another reports folder: `status`
    probes that stack (nothing answers here), and `down` says how to stop it."""
    from dataclasses import replace

    started_under = tmp_path / "theirs"
    state = started_under / "stacks" / "s1"
    path = replace(fake_endpoints(), state_dir=str(state)).save(state / "endpoints.json")
    monkeypatch.setenv("TXCHAOS_ENDPOINTS", str(path))
    monkeypatch.setenv("TXCHAOS_REPORTS", str(tmp_path / "mine"))
    assert main(["status"]) == 3  # nothing answers
    out = capsys.readouterr().out
    assert "stack s1 (local) (named by $TXCHAOS_ENDPOINTS)" in out
    assert "no stack is up" not in out
    assert main(["down"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"stop it with `TXCHAOS_REPORTS={started_under} txchaos down`" in out


def test_a_run_or_soak_says_whether_it_found_what_its_scenario_expects(tmp_path: Path) -> None:
    from harness.cli.output import expectation
    from harness.run.core.outcome import RunResult
    from harness.run.spec.files import resolve
    from harness.run.spec.scenario import ScenarioSpec
    from harness.verify.verdict import Verdict

    (naive,) = resolve(str(REPO / "scenarios/onepc_crash_gap_scenario.py:naive"), 0)
    (fixed,) = resolve(str(REPO / "scenarios/onepc_crash_gap_scenario.py:check-then-skip-locked"), 0)
    dup = Verdict({"duplicate-effect": 1}, (), {}, "in-process")
    clean = Verdict({}, (), {}, "in-process")

    def said(verdict: Verdict, spec: ScenarioSpec) -> tuple[str, list[str]] | None:
        text = expectation(RunResult(tmp_path, verdict, spec))
        return None if text is None else (text.plain, [str(span.style) for span in text.spans])

    assert said(dup, naive) == ("  as expected: the scenario expects duplicate-effect", [])
    assert said(clean, naive) == ("  UNEXPECTED: the scenario expects duplicate-effect", ["red"])
    assert said(dup, fixed) == ("  UNEXPECTED: the scenario expects a clean run", ["red"])
    assert said(clean, fixed) is None


def test_a_verdict_line_keeps_the_op_ids_that_rich_would_take_for_style_tags() -> None:
    """A headline names its first op ids in brackets; printed as markup, rich dropped them as tags."""
    from rich.console import Console

    from harness.cli.output import verdict_line
    from harness.verify.verdict import Verdict, Witness

    op = "check-then-skip-s0-op17855"
    verdict = Verdict({"duplicate-effect": 1}, (Witness("duplicate-effect", op, (), {}),), {}, "in-process")
    out = Console(record=True, width=300, color_system=None)
    out.print(verdict_line("onepc_crash_gap:check-then-skip [soak]", verdict))
    assert out.export_text().strip() == f"onepc_crash_gap:check-then-skip [soak]: ANOMALIES: duplicate-effect=1 [{op}]"


def test_the_command_lines_console_prints_brackets_as_they_are() -> None:
    """Every line the CLI prints is data (folders, witnesses, errors): markup is off on its console."""
    from harness.cli.output import console

    with console.capture() as captured:
        console.print("kept run [a]: in use ([bold]x[/])", style="yellow")
    assert captured.get() == "kept run [a]: in use ([bold]x[/])\n"
