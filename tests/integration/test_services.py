"""Three real services (Python, Go, Node.js), none importing txchaos, crashed in their commit gap by wire traps.

Each is built from the registries by its own build script (cached per source version), started with
the stack's proxied endpoints in its environment, and killed, frozen or cut off by a trap on its own
Postgres, STOMP or Kafka connection. A naive variant must be caught with its exact anomaly class on
the exact operation the trap fired on; its fixed variant must stay clean under every trap its
protocols reach, and the trap must have fired (a clean run with no firing proves nothing).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from harness import ConfigError, Crash, ServiceFailed
from harness.ledger.reader import read_ledger
from harness.ledger.schema import Kind
from harness.machines.profiles import profile
from harness.machines.search import find_counterexample
from harness.machines.service import service_machine
from harness.run.core.outcome import RunResult
from harness.run.core.session import run_scenario
from harness.run.spec.files import load_file
from harness.stack.base import Endpoints
from harness.stack.procs import TAG_VAR

pytestmark = [pytest.mark.integration, pytest.mark.activemq, pytest.mark.kafka]
ROOT = Path(__file__).resolve().parents[2]


EX = load_file(ROOT / "examples" / "services" / "services_scenario.py")


def firings(result: RunResult) -> list[tuple[str, str | None]]:
    """Return the (point, op) of every trap firing in the run's ledger."""
    table = read_ledger(result.run_dir / "ledger").to_pylist()
    return [(e["point"], e["op"]) for e in table if e["kind"] == Kind.CRASH.value]


@pytest.mark.parametrize("name", ["py", "go", "node"])
def test_the_naive_variant_is_caught_with_its_class_on_the_op_the_trap_fired_on(
    name: str, txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    ex = EX.EXAMPLES[name]
    spec = EX.scenario(name, "naive", messages=8, crashes=(Crash(ex.naive_point, op_index=3),), timeout_s=60)
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    op = f"{name}-naive-s0-op00003"
    assert firings(result) == [(ex.naive_point, op)]
    assert result.verdict.found() == {ex.naive_anomaly: 1}, result.verdict.headline()
    assert result.verdict.ops(ex.naive_anomaly) == {op}
    assert not left_running(result), "a service instance outlived its run"


def left_running(result: RunResult) -> list[int]:
    """Return the pids of processes still tagged with the run (its service instances, restarts included)."""
    tag = f"{TAG_VAR}=run/{result.run_dir.name}/".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if any(v.startswith(tag) for v in environ.read_bytes().split(b"\0")):
                pids.append(int(environ.parent.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return pids


CASES = [(name, point) for name, ex in EX.EXAMPLES.items() for point in ex.points]


@pytest.mark.parametrize(("name", "point"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_the_fixed_variant_is_clean_under_every_trap(
    name: str, point: str, txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    spec = EX.scenario(name, "fixed", messages=8, crashes=(Crash(point, op_index=3),), timeout_s=60)
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    assert firings(result) == [(point, f"{name}-fixed-s0-op00003")]
    assert result.verdict.clean, result.verdict.headline()


def test_an_offset_commit_trap_fires_by_hit_and_catches_the_naive_go_consumer(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    # An OffsetCommit names offsets, not records: armed on the 4th commit, one record per commit.
    crash = (Crash("kafka_before_offset_commit", nth=4),)
    naive = run_scenario(EX.scenario("go", "naive", messages=8, crashes=crash), txchaos_stack, runs_root=tmp_path)
    fixed = run_scenario(EX.scenario("go", "fixed", messages=8, crashes=crash), txchaos_stack, runs_root=tmp_path)
    assert [p for p, _ in firings(naive)] == ["kafka_before_offset_commit"]
    assert naive.verdict.found() == {"duplicate-effect": 1}, naive.verdict.headline()
    assert [p for p, _ in firings(fixed)] == ["kafka_before_offset_commit"]
    assert fixed.verdict.clean, fixed.verdict.headline()


def test_a_frozen_instance_is_thawed_and_a_dropped_one_restarted(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    frozen = EX.scenario(
        "py", "fixed", messages=6, crashes=(Crash("pg_after_commit", op_index=2, action="freeze"),), timeout_s=60
    )
    frozen = replace(frozen, service=EX.service("py", "fixed", freeze_s=1.5))
    result = run_scenario(frozen, txchaos_stack, runs_root=tmp_path)
    assert result.verdict.clean, result.verdict.headline()
    steps = result.verdict.steps
    assert any("fired on op py-fixed-s0-op00002 in py-stomp-fixed-0: freeze" in s for s in steps)
    assert any(s.startswith("thaw 1 frozen instance") for s in steps)
    dropped = EX.scenario("node", "fixed", messages=6, crashes=(Crash("pg_before_commit", op_index=2, action="drop"),))
    result = run_scenario(dropped, txchaos_stack, runs_root=tmp_path)
    assert firings(result) == [("pg_before_commit", "node-fixed-s0-op00002")]
    assert result.verdict.clean, result.verdict.headline()


def test_a_service_that_never_gets_ready_is_refused_before_anything_is_submitted(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    spec = EX.scenario("py", "naive", messages=3)
    silent = EX.Service(
        "silent", command=("{python}", "-c", "import time; time.sleep(30)"), env=EX.STOMP, ready_timeout_s=2
    )
    spec = replace(spec, service=silent, name="silent")
    with pytest.raises(ConfigError) as err:
        run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    assert "silent-0 never printed a line matching 'READY' in 2s" in str(err.value)
    ledger = read_ledger(next(tmp_path.iterdir()) / "ledger").to_pylist()
    assert not [e for e in ledger if e["kind"] == Kind.SUBMIT.value]


def test_a_service_that_dies_by_itself_is_its_failure_not_an_anomaly(txchaos_stack: Endpoints, tmp_path: Path) -> None:
    script = "import time; print('READY', flush=True); time.sleep(1); raise SystemExit(7)"
    dying = EX.Service("dying", command=("{python}", "-c", script), env=EX.STOMP)
    spec = EX.scenario("py", "naive", messages=3, timeout_s=4)
    spec = replace(spec, service=dying, name="dying")
    with pytest.raises(ServiceFailed) as err:
        run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    assert "first dying-0 (exit 7)" in str(err.value)
    assert ServiceFailed.exit_code == 5
    run_dir = next(tmp_path.iterdir())
    assert (run_dir / "logs" / "dying-0.log").exists()  # the service's output is kept with the run
    assert (run_dir / "verdict.json").exists()  # the books were closed before the failure was raised


def test_a_message_a_cut_off_instance_held_comes_back_before_the_books_close(
    txchaos_stack: Endpoints, tmp_path: Path
) -> None:
    # The trap cuts the connection after the naive service's DB commit and output, before its ACK.
    # Its operation is out at once; the broker gives the message back only after its redelivery
    # delay, and a service writes no ledger saying one is pending. Closing the books then drained it
    # as residue (stuck) instead of letting the naive service apply it twice (a state machine met it).
    # The operations come out while the instance still runs; a short settle closed the books
    # before it had ended and its replacement got the message back.
    crash = Crash("stomp_before_ack", op_index=5, action="drop")
    spec = EX.scenario("py", "naive", messages=6, crashes=(crash,), settle_s=0.2)
    result = run_scenario(spec, txchaos_stack, runs_root=tmp_path)
    assert "stuck" not in result.verdict.found(), result.verdict.headline()
    assert result.verdict.ops("duplicate-effect") == {"py-naive-s0-op00005"}, result.verdict.headline()


@pytest.mark.parametrize("name", ["py", "go", "node"])
def test_the_service_state_machine_finds_each_naive_variant(name: str, txchaos_stack: Endpoints) -> None:
    # Found, not shrunk: shrinking a service's counterexample costs minutes of real runs; the
    # benchmark (`txchaos bench services`) times the search and shows the shrunk program.
    machine = service_machine(EX.scenario(name, "naive", messages=1, timeout_s=20), txchaos_stack)
    # go found it within 5-48 examples in seven searches here (Hypothesis's first examples repeat
    # one draw, five pg_before_commit kills); CI once ran 67 without a failure Hypothesis kept, as
    # it drops one judged after its example ran out of choices (the search reports it now). The cap
    # only bounds a miss: a search stops at its first counterexample.
    search = settings(profile(), max_examples=120, database=None, phases=[Phase.generate])
    found = find_counterexample(machine, search)
    if not found:  # say what the search did, so a miss can be told from traps that never fired
        pytest.fail(f"no counterexample in {machine.examples} examples; {machine.fired_summary()}")
    anomaly = EX.EXAMPLES[name].naive_anomaly
    assert f"ANOMALIES: {anomaly}=" in found
    assert "seed: " in found
    assert "arm_trap(" in found  # the step list replays it
    assert machine.found_at is not None
