"""A scenario file of a user's that is broken is bad input: one error naming the file, the error and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import ConfigError
from harness.run.spec.files import resolve

BROKEN = {
    "import": ("import nosuch_module_of_the_user\n", "failed to load: ModuleNotFoundError: No module named"),
    "syntax": ("x = (\n", "failed to load: SyntaxError: '(' was never closed"),
    "raises": ("def variants(seed):\n    return {'a': 1 / 0}\n", "variants(3) raised: ZeroDivisionError"),
    "shape": ("def variants(seed):\n    return [1]\n", "variants(3) returned list, not {name: ScenarioSpec}"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_scenario_file_is_refused_with_its_error(case: str, tmp_path: Path) -> None:
    text, said = BROKEN[case]
    path = tmp_path / f"{case}_scenario.py"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        resolve(str(path), 3)
    assert f"scenario file {path}" in str(err.value)
    assert said in str(err.value)
    if case in ("import", "raises"):
        assert f"(line {text.count(chr(10))})" in str(err.value)  # the line in the user's file


def test_the_cli_calls_a_broken_scenario_file_bad_input_not_a_harness_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mine_scenario.py"
    path.write_text("import nosuch_module_of_the_user\n")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "No module named 'nosuch_module_of_the_user' (line 1)" in err
    assert "Traceback" not in err
    assert "harness failed" not in err


def test_a_folder_is_neither_a_name_nor_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is neither a scenario's name nor a scenario file"):
        resolve(f"{tmp_path}/", 0)
