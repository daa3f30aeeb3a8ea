"""The local stack's servers are told to stay on loopback and to ask for passwords (no services run here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.stack import go_builds
from harness.stack.install_shell import BootstrapError
from harness.stack.local_recipes import PG_HBA


def _svr_go() -> Path:
    root = Path(go_builds.go_env()["GOMODCACHE"])
    return root / f"{go_builds.DTM_MODULE}@{go_builds.DTM_VERSION}" / "dtmsvr" / "svr.go"


def test_the_pinned_dtm_source_gets_both_listeners_on_loopback() -> None:
    source = _svr_go()
    if not source.exists():
        pytest.skip(f"no DTM sources in the Go module cache ({source}): run ./txchaos")
    text = source.read_text()
    patched = go_builds.dtm_loopback_source(text)
    assert patched.count(f'"{go_builds.DTM_LOOPBACK}:%d"') == 2
    assert 'Sprintf(":%d"' not in patched, "a listener is left on every interface"
    assert len(patched.splitlines()) == len(text.splitlines())


def test_a_dtm_source_the_build_does_not_know_is_refused() -> None:
    with pytest.raises(BootstrapError, match="expected 1"):
        go_builds.dtm_loopback_source('app.Run(fmt.Sprintf("0.0.0.0:%d", conf.HTTPPort))')


def test_postgres_trusts_no_tcp_connection() -> None:
    rules = [line.split() for line in PG_HBA.splitlines() if line and not line.startswith("#")]
    assert rules, "pg_hba.conf would be empty"
    for rule in rules:
        if rule[0].startswith("host"):
            assert rule[-1] == "scram-sha-256", rule
        else:
            assert rule[0] == "local", rule  # the socket, in the server's private 0700 folder
