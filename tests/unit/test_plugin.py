"""The pytest11 plugin end to end with pytester: options, markers, validation."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_plugin_registers_markers(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.integration:*", "@pytest.mark.kafka:*", "@pytest.mark.spark:*"])


def test_bad_provider_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--txchaos-provider=kubernetes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--txchaos-provider='kubernetes'*auto, local or docker*"])


def test_missing_endpoints_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--txchaos-endpoints=/nonexistent/endpoints.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*endpoints.json*is not a file*"])


def test_fixtures_are_offered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--fixtures")
    text = result.stdout.str()
    for name in ("txchaos_stack [session scope]", "txchaos_reset", "txchaos_run"):
        assert name in text


def test_unit_only_run_starts_no_stack(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): assert True")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
