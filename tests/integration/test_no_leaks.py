"""Killing the pytest process mid-run leaves no server, and no data folder, behind once the next run starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from harness import procfs
from harness.stack.procs import TAG_VAR, reap_orphans

pytestmark = pytest.mark.integration


def tagged(prefix: str) -> list[int]:
    """Return the pids whose environment carries a harness tag starting with ``prefix``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        stat = procfs.read(int(proc.name))
        if stat is not None and stat.state != "Z" and any(e.startswith(f"{TAG_VAR}={prefix}".encode()) for e in env):
            pids.append(int(proc.name))
    return pids


def test_sigkilled_pytest_leaves_no_server_and_no_folder(tmp_path: Path) -> None:
    marker = tmp_path / "stack.txt"
    (tmp_path / "test_hold.py").write_text(
        textwrap.dedent(f"""
        import json
        import time
        from pathlib import Path

        def test_hold(txchaos_stack):
            info = {{"stack_id": txchaos_stack.stack_id, "state_dir": txchaos_stack.state_dir}}
            Path({str(marker)!r}).write_text(json.dumps(info))
            time.sleep(600)
        """)
    )
    env = dict(os.environ, TXCHAOS_PROVIDER="local")
    env.pop("TXCHAOS_ENDPOINTS", None)
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_hold.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            assert child.poll() is None, "the nested pytest died before its stack was up"
            time.sleep(0.2)
        info = json.loads(marker.read_text())
        stack_id, state_dir = info["stack_id"], Path(info["state_dir"])
        prefix = f"stack/{stack_id}/"
        assert len(tagged(prefix)) >= 4, "the nested run should have started all four services"
        pg_data = list(Path(tempfile.gettempdir()).glob(f"txchaos-pg-{stack_id}*"))
        assert pg_data, "the probe is blind: no Postgres data folder found while the stack ran"
        assert (state_dir / "kafka").is_dir()
        assert (state_dir / "endpoints.json").exists()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    deadline = time.monotonic() + 15
    while tagged(prefix) and time.monotonic() < deadline:
        time.sleep(0.2)
    reap_orphans()  # what the next start does first
    assert tagged(prefix) == [], "server processes outlived the killed pytest run"
    left = list(Path(tempfile.gettempdir()).glob(f"txchaos-pg-{stack_id}*"))
    assert left == [], f"the killed stack's Postgres data folder is still there: {left}"
    # Only the service logs stay: the killed run never copied them into its run folder.
    kept = sorted(p.name for p in state_dir.iterdir()) if state_dir.exists() else []
    assert kept in ([], ["logs"]), f"the killed stack left {kept} in {state_dir}"
