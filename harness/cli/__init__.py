"""The ``txchaos`` command line.

Exit codes: 0 clean verdict (or every expectation met), 1 anomalies found, 2 bad usage or
configuration, 3 the stack or the harness failed, 4 incomplete evidence (a run folder that cannot
give a full verdict: killed before it closed its books, damaged ledger lines).
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.status import Status
from rich.table import Table
from rich.text import Text

from harness.cli.args import SCENARIO_HELP, SEED_HELP
from harness.cli.output import console, expectation, verdict_line
from harness.cli.stacks import running_stack, stack_alive
from harness.cli.suite import cmd_flagship, cmd_report, cmd_test
from harness.errors import EXIT_INCOMPLETE, EXIT_UNFIRED, ConfigError, TxChaosError, error_lines

if TYPE_CHECKING:
    from harness.run.core.outcome import RunResult


def _seed(value: str) -> int:
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {value!r} is not an integer: pass e.g. --seed 7") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"seed {seed} is negative: seeds are 0 or more")
    return seed


# -- stack ------------------------------------------------------------------------------------
def cmd_up(args: argparse.Namespace) -> int:
    from harness.stack.selection import load_current, make_provider, save_current

    if load_current() is not None and stack_alive():
        raise ConfigError("a stack is already up", hint="`txchaos status` shows it; `txchaos down` stops it")
    provider = make_provider(args.provider, detached=True)
    with console.status(f"starting the {provider.name} stack (Postgres, ActiveMQ, Kafka, DTM, Toxiproxy)"):
        started = time.monotonic()
        endpoints = provider.start()
    save_current(endpoints)
    from harness.stack import spark_connect  # hook (issue 31): a warm Spark for `txchaos verify`

    warm = [sys.executable, "-m", "harness.verify.spark.warm"]
    spark_line = spark_connect.up(endpoints.state_dir, endpoints.stack_id, enabled=not args.no_spark, warm=warm)
    took = time.monotonic() - started
    console.print(Text.assemble("stack ", (endpoints.stack_id, "bold"), f" up in {took:.1f}s ({endpoints.provider})"))
    _print_endpoints(endpoints)
    console.print(f"endpoints file: {Path(endpoints.state_dir) / 'endpoints.json'}  (export TXCHAOS_ENDPOINTS=...)")
    console.print(spark_line)
    return 0


def _print_endpoints(endpoints: object) -> None:
    from harness.stack.base import Endpoints

    assert isinstance(endpoints, Endpoints)
    table = Table("service", "client address (proxy)", "proxy", "upstream")
    services = [("postgres", endpoints.postgres), ("activemq", endpoints.stomp), ("kafka", endpoints.kafka)]
    if endpoints.dtm is not None:
        services.append(("dtm", endpoints.dtm))
    for name, ep in services:
        table.add_row(name, ep.address, ep.proxy, f"{ep.upstream_host}:{ep.upstream_port}")
    table.add_row("toxiproxy api", endpoints.toxiproxy_api, "", "")
    console.print(table)
    # The password stays in the 0600 endpoints file: a terminal or CI log is no place for it.
    hidden = endpoints.postgres_url.replace(f":{endpoints.db_password}@", ":***@", 1)
    console.print(f"postgres url: {hidden}  (password in {Path(endpoints.state_dir) / 'endpoints.json'})")
    if endpoints.dtm is not None:
        console.print(f"dtm server:   {endpoints.dtm_url}")


def cmd_down(args: argparse.Namespace) -> int:
    from harness.stack.local_state import stop_detached
    from harness.stack.selection import current_file, endpoints_from_env, load_current

    ep = load_current()
    if ep is None:
        console.print("no stack is up")
        named = endpoints_from_env()
        if named is not None:  # started under another reports folder: say how to reach it
            root = Path(named.state_dir).parent.parent
            console.print(
                f"$TXCHAOS_ENDPOINTS names stack {named.stack_id}, which `txchaos up` started under {root}: "
                f"stop it with `TXCHAOS_REPORTS={root} txchaos down`",
                highlight=False,
            )
        return 0
    if ep.provider == "docker":
        from harness.stack.docker import DockerProvider

        DockerProvider.stop_project(ep.stack_id)
        stopped = [ep.stack_id]
    else:
        stopped = stop_detached(ep.stack_id)
    from harness.stack import spark_connect  # hook (issue 31): its server goes with the stack

    spark_connect.stop(Path(ep.state_dir), ep.stack_id)
    current_file().unlink(missing_ok=True)
    console.print(
        f"stack {ep.stack_id} down ({len(stopped)} process group(s) stopped); logs kept in {ep.state_dir}/logs"
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from harness.clients import db, kafka
    from harness.clients.dtm import DtmClient
    from harness.stack.selection import endpoints_from_env, load_current
    from harness.stack.waits import stomp_connected

    named = endpoints_from_env()  # the stack a run in this shell would use
    ep = named or load_current()
    if ep is None:
        console.print("no stack is up (start one with `txchaos up`)")
        return 3
    source = " (named by $TXCHAOS_ENDPOINTS)" if named is not None else ""
    console.print(Text.assemble("stack ", (ep.stack_id, "bold"), f" ({ep.provider}){source}, state in {ep.state_dir}"))
    _print_endpoints(ep)
    checks: dict[str, Callable[[], bool]] = {
        "toxiproxy": lambda: stack_alive(ep),
        "postgres": lambda: db.ping(ep.postgres_url),
        "activemq": stomp_connected(ep.stomp.host, ep.stomp.port),
        "kafka": lambda: kafka.broker_ready(ep.kafka.address, 2.0),
    }
    if ep.dtm is not None:
        checks["dtm"] = DtmClient(ep.dtm.host, ep.dtm.port, timeout=2.0).answers
    ok = True
    for name, probe in checks.items():
        try:
            up = bool(probe())
        except Exception:
            up = False
        ok &= up
        console.print(Text.assemble(f"  {name:<10} ", ("up", "green") if up else ("DOWN", "red")))
    return 0 if ok else 3


# -- runs -------------------------------------------------------------------------------------
def _show(result: RunResult, replay_hint: str) -> int:
    """Print a run's verdict, folder and first witnesses; return its exit code."""
    from harness.reporting.plots import render_run

    render_run(result.run_dir)
    verdict, spec = result.verdict, result.spec
    console.print(verdict_line(f"{spec.label} seed {spec.seed}", verdict))
    said = expectation(result)  # a known-bad variant's anomalies are what it exists to show
    if said:
        console.print(said)
    console.print(f"  run folder: {result.run_dir}")
    for w in verdict.witnesses[:5]:
        counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in w.summary.items() if v) or "-"
        console.print(f"  {w.anomaly}: op {w.op} ({counts}); messages {', '.join(w.msg_ids) or '-'}")
    for told in result.unfired_stories():
        console.print(f"  {told}")
    if verdict.clean:
        return 0
    console.print(f"  replay: {replay_hint}")
    return verdict.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    from harness.run.core.session import run_scenario
    from harness.run.spec.files import resolve

    specs = resolve(args.scenario, args.seed)  # validated before any service starts
    worst = 0
    with running_stack(args.provider) as endpoints:
        for spec in specs:
            # a status line's text given as a str is read as markup whatever the console says: a Text
            with console.status(Text(f"running {spec.label} seed {spec.seed}")) as status:

                def show(message: str, status: Status = status, label: str = spec.label) -> None:
                    status.update(Text(f"{label}: {message}"))

                result = run_scenario(spec, endpoints, progress=show)
            named = args.scenario.endswith(".py") or ".py:" in args.scenario
            target = args.scenario.partition(":")[0] if named else spec.name
            code = _show(result, f"txchaos run {target}:{spec.variant} --seed {spec.seed}")
            # each outcome has its own code; over several runs the one that says least is kept
            # (incomplete 4: nothing can be known, then anomalies 1, then an unfired fault 6)
            worst = most_telling(worst, code)
    return worst


def cmd_replay(args: argparse.Namespace) -> int:
    from harness.run.core.replay import load_steps, replay, spec_of_folder
    from harness.soak.driver import SUMMARY, again_command

    if (Path(args.run_dir) / SUMMARY).is_file():  # a soak's steps fall due by its clock, not one after another
        raise ConfigError(
            f"{args.run_dir} is a soak's folder: its steps ran on the schedule's clock, not as a list to replay",
            hint=f"run the soak again on the same schedule: {again_command(Path(args.run_dir))}",
        )
    steps = load_steps(Path(args.run_dir))  # a folder without steps is refused before any service starts
    spec = spec_of_folder(Path(args.run_dir), args.scenario)
    with running_stack(args.provider) as endpoints, console.status(f"replaying {len(steps)} steps of {spec.label}"):
        result = replay(spec, endpoints, steps)
    # the folder's own scenario name may not resolve (a file of the user's): the hint names what was given
    named = f" --scenario {shlex.quote(args.scenario)}" if args.scenario else ""
    return _show(result, f"txchaos replay {shlex.quote(str(result.run_dir))}{named}")


_RUN_CODE_RANK = (0, EXIT_UNFIRED, 1, EXIT_INCOMPLETE)  # txchaos run's exit codes, least to most telling


def most_telling(a: int, b: int) -> int:
    """Return the exit code of two runs' that a gate must see: incomplete, then anomalies, then unfired."""
    return max(a, b, key=_RUN_CODE_RANK.index)


def cmd_install(args: argparse.Namespace) -> int:
    from harness.stack.bootstrap import install

    code = install(verify=args.verify)
    if code != 0 or not args.docker:
        return code
    from harness.stack.docker_engine import ensure_engine

    # Engine, base image, Compose v2 and the images; a daemon it starts keeps running for `up`.
    ensure_engine()
    console.print("docker provider ready: `txchaos up --provider docker`")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    module = f"harness.bench.{args.what}"
    bench_main: Callable[[list[str]], int] = importlib.import_module(module).main
    return bench_main(args.bench_args)


def _forward(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    """Return a command that hands its remaining arguments to ``module.func(argv)``."""

    def command(args: argparse.Namespace) -> int:
        entry: Callable[[list[str]], int] = getattr(importlib.import_module(module), func)
        return entry(args.forward_args)

    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txchaos", description="Chaos harness for transactional messaging.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "install", help="install the services (Postgres, jars, Toxiproxy, DTM, Allure) into the cache; idempotent"
    )
    p.add_argument("--verify", action="store_true", help="hash every installed file again; reinstall what changed")
    p.add_argument(
        "--docker",
        action="store_true",
        help="also set up the docker provider: docker.io, a dockerd, a base image, Compose v2 and the images",
    )
    p.set_defaults(func=cmd_install)

    p = sub.add_parser("up", help="start a stack and keep it running; prints the endpoints")
    p.add_argument("--provider", choices=("auto", "local", "docker"), default=None)
    p.add_argument("--no-spark", action="store_true", help="start no Spark Connect server beside the stack")
    p.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop the stack `up` started").set_defaults(func=cmd_down)
    sub.add_parser("status", help="show the running stack and probe each service").set_defaults(func=cmd_status)

    p = sub.add_parser("run", help="run SCENARIO[:VARIANT]; writes a run folder and prints its verdict")
    p.add_argument("scenario", help=SCENARIO_HELP)
    p.add_argument("--seed", type=_seed, default=0, help=SEED_HELP)
    p.add_argument("--provider", choices=("auto", "local", "docker"), default=None)
    p.set_defaults(func=cmd_run)

    from harness.cli.soak import add_parser as add_soak

    add_soak(sub, _seed)

    from harness.cli.prune import add_parser as add_prune

    add_prune(sub)

    p = sub.add_parser("replay", help="run a run folder's steps (steps.jsonl) again on a fresh run of its scenario")
    p.add_argument("run_dir")
    p.add_argument("--scenario", default=None, help="the scenario file or name, when not the folder's own")
    p.add_argument("--provider", choices=("auto", "local", "docker"), default=None)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("flagship", help="the flagship chaos run: stack, scenarios, verified ledgers, Allure report")
    p.add_argument("--provider", choices=("auto", "local", "docker"), default=None)
    p.set_defaults(func=cmd_flagship)

    p = sub.add_parser("test", help="run the whole test suite (extra arguments go to pytest)")
    p.set_defaults(func=cmd_test, passthrough="pytest_args")

    p = sub.add_parser("report", help="turn an allure-results folder into an offline HTML report")
    p.add_argument("results")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--history",
        default=None,
        metavar="PREV_REPORT_DIR",
        help="an earlier report's folder: its history/ fills this report's trend graphs",
    )
    p.add_argument("--provider", default="local", help="the stack provider the results ran on (environment tab)")
    p.set_defaults(func=cmd_report)

    # add_help=False: `-h` goes on to the forwarded command, which knows its own options.
    p = sub.add_parser(
        "verify",
        add_help=False,
        help="verify a run folder's ledger (Spark by default: verdict-spark.json; in-process: verdict.json)",
    )
    p.set_defaults(func=_forward("harness.verify.cli", "verify_main"), passthrough="forward_args")

    p = sub.add_parser(
        "ledger", add_help=False, help="ledger tools: `ledger synth --events N --out DIR` writes a synthetic run"
    )
    p.add_argument("tool", choices=("synth",))
    p.set_defaults(func=_forward("harness.verify.cli", "synth_main"), passthrough="forward_args")

    p = sub.add_parser(
        "bench",
        help="benchmarks: `stack` (start, reset, throughput), `verify` (ledger engines), "
        "`machines` (state machines per pattern), `kafka` (at-least-once consumer throughput), `traps` "
        "(wire traps), `services` (services under test: traps in the window, clean path, search), "
        "`bare` (the machine's limit: broker and database work without the harness), "
        "`soak` (soaks beside the bare loops, verified by both engines), `journal` (the broker's journal "
        "sync under kill -9: what turning it off would lose), `compact` (the close of finished runs: "
        "compaction and verdict, wall and peak RSS), `acks` (a STOMP subscription's transacted ACKs over its life)",
    )
    p.add_argument(
        "what",
        choices=(
            "stack",
            "verify",
            "machines",
            "kafka",
            "traps",
            "services",
            "bare",
            "soak",
            "journal",
            "compact",
            "acks",
        ),
    )
    p.set_defaults(func=cmd_bench, passthrough="bench_args")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    passthrough = getattr(args, "passthrough", None)
    if passthrough:  # `test` and `bench` hand everything they do not know to pytest / the benchmark
        setattr(args, passthrough, extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from harness.signals import message, stop_children, terminating

    try:
        # SIGTERM (a CI timeout) and SIGHUP interrupt like Ctrl-C, so every `finally` heals.
        with terminating():
            code: int = args.func(args)
        return code
    except TxChaosError as exc:
        sys.stderr.write(error_lines(exc))
        return exc.exit_code
    except KeyboardInterrupt as exc:
        with terminating():  # a second signal must not cut this short
            stop_children()
        console.print(message(exc), style="yellow")
        if isinstance(exc.__cause__, Exception):  # an error raised after the signal (kept, on stderr)
            sys.stderr.write(f"txchaos: after the signal: {type(exc.__cause__).__name__}: {exc.__cause__}\n")
        return 3
    except Exception:
        traceback.print_exc()
        console.print("txchaos: the harness failed (exit 3); the traceback above says where", style="red")
        return 3
