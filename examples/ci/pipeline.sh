#!/usr/bin/env bash
# One chaos pipeline, whatever the CI (github-actions.yml and gitlab-ci.yml both call it, and
# tests/integration/test_example_project.py runs it from a clean environment):
#   1. install txchaos into its own virtualenv, then the services it runs (`txchaos install`,
#      cached under ~/.cache/txchaos: cache that folder between pipelines);
#   2. run the team's chaos tests with Allure results and JUnit XML;
#   3. write the Allure report, with the previous report's history for the trend graphs;
#   4. exit with the tests' exit code, so the pipeline fails when they do.
#
# Settings (environment):
#   TXCHAOS_PIP_SPEC  what pip installs (default: txchaos; or a wheel's path)
#   TESTS             the team's chaos tests (default: tests)
#   PYTEST_ARGS       more pytest arguments (default: none), e.g. "-k inbox"
#   OUT               where results, report and junit.xml go (default: reports/ci)
#   PREVIOUS_REPORT   the previous pipeline's allure-report folder (default: none); its history/
#                     continues the trend
#   VENV              the virtualenv (default: .venv-txchaos)
#
# Exit codes: pytest's. 0 every test passed; 1 a test failed: an anomaly it did not expect, an
# expectation not met, a fault that never fired (UnfiredFault), a service that died by itself;
# 3 the stack could not start (the run proves nothing); 2/4/5 pytest's usage errors. Run outside
# pytest, `txchaos run` exits 0 clean, 1 anomalies, 2 bad configuration, 3 harness failure,
# 4 incomplete evidence, 5 service failed, 6 a requested fault never fired (README).
set -euo pipefail

spec="${TXCHAOS_PIP_SPEC:-txchaos}"
tests="${TESTS:-tests}"
out="${OUT:-reports/ci}"
previous="${PREVIOUS_REPORT:-}"
venv="${VENV:-.venv-txchaos}"

echo "== install: $spec into $venv, then the services"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$spec"
"$venv/bin/txchaos" install
export PATH="$PWD/$venv/bin:$PATH"

echo "== chaos tests: $tests"
mkdir -p "$out"
read -r -a extra <<< "${PYTEST_ARGS:-}"
set +e
"$venv/bin/python" -m pytest "$tests" --txchaos-provider local \
  --alluredir "$out/allure-results" --junitxml "$out/junit.xml" "${extra[@]}"
code=$?
set -e

echo "== report: $out/allure-report"
history=()
if [ -n "$previous" ] && [ -d "$previous/history" ]; then
  history=(--history "$previous")
else
  echo "no previous report with a history: the trend starts here"
fi
# A report that cannot be written must not hide the tests' verdict: say so, keep their exit code.
"$venv/bin/txchaos" report "$out/allure-results" --out "$out/allure-report" "${history[@]}" \
  || echo "the Allure report could not be written (the tests' exit code stands)"

echo "== exit $code"
exit "$code"
