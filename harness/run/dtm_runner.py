"""Run one DTM 2-phase message scenario: the service and the branch as worker processes, a verdict.

``DtmRunSession`` is ``RunSession`` with DTM in place of a broker queue: ``open`` (schema and
tables, the ``service`` and ``branch`` processes on ports of their own) -> ``arm`` / ``submit``
/ ``hold_fault`` -> ``close``. An operation is a transfer the driver asks the service for over
HTTP; quiescence is every request answered and every prepared message decided by DTM
(``succeed`` or ``failed``). The books it closes with:

- every credit row is a ``residue_effect`` (``dtm_credits`` is the effect table): two for one
  operation is ``duplicate-effect``; a credit without a committed debit is ``orphan-effect``;
- a committed debit is the operation's ``submit`` (the service records it after its commit; a
  debit it never learnt committed, after an ambiguous commit, is recorded here): a debit with
  no credit is ``lost``;
- a message DTM has not decided at quiescence is ``residue_queue`` (``stuck``);
- a message prepared whose debit never committed and that nobody aborted is ``in-doubt``.

Arms, faults, the verdict and healing are ``RunSession``'s.
"""

from __future__ import annotations

import http.client
import json
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow.compute as pc

from harness.clients import db
from harness.clients.dtm import DtmClient
from harness.errors import ConfigError, HarnessError
from harness.ledger.reader import read_segments
from harness.ledger.schema import Kind
from harness.patterns.dtm_transfer import gid_of, money
from harness.run.runner import Progress, RunResult, RunSession, begin_run, reset_state
from harness.run.spec import ScenarioSpec
from harness.run.supervisor import WorkerPool
from harness.stack.base import Endpoints
from harness.stack.procs import free_ports
from harness.worker.spec import WorkerSpec

SERVICE = "service"
FINAL = ("succeed", "failed")  # DTM statuses after which it never calls the branch again
REQUEST_S = 15.0  # one transfer request: a held local transaction plus DTM round trips
CONNECT_FOR_S = 10.0  # a refused connection (the service restarting) is retried this long


def _quiet(_: str) -> None:
    return None


class DtmRunSession(RunSession):
    """One DTM run, driven step by step.

    >>> with DtmRunSession(spec, endpoints) as run:
    ...     run.arm(Crash("after_local_commit", op_index=2))
    ...     run.submit(5)
    ...     result = run.close()
    """

    def __init__(
        self, spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
    ) -> None:
        if spec.broker != "dtm":
            raise ConfigError(f"{spec.label} runs on {spec.broker}", hint="set broker='dtm' or use RunSession")
        if endpoints.dtm is None:
            raise ConfigError("this stack has no DTM server", hint="start a new stack: `txchaos down && txchaos up`")
        # DTM calls the service and the branch on 127.0.0.1: both providers run it on the host's
        # loopback (the docker provider with host networking, docs/docker.md).
        super().__init__(spec, endpoints, runs_root=runs_root, progress=progress)
        self.service_port = free_ports(1).pop()
        self.tag = secrets.token_hex(4)
        self.dtm = DtmClient(endpoints.dtm.host, endpoints.dtm.port, timeout=3.0)
        self._requests = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dtm-driver")
        self._answers: dict[str, Future[str]] = {}
        self._undecided: dict[str, str] = {}
        # (debited, credited) when the books closed: what conservation of money is checked on.
        self.books: tuple[int, int] | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> DtmRunSession:
        """Reset the stack's state for this run and start the service and the branch."""
        spec, ep, folder = self.spec, self.endpoints, self.folder
        self._started = time.monotonic()
        begin_run(spec, ep, folder, self.ledger)
        try:
            self._engine = reset_state(spec, ep, folder)
            self._pool = WorkerPool(self._worker_specs(), folder.path, self.ledger)
            self._pool.start()
            checkback = spec.options.get("checkback", "barrier")
            folder.step(f"start {SERVICE} ({spec.handler}, check-back {checkback}) on port {self.service_port}")
            for helper in spec.helpers:
                port = self.helper_ports[helper.name]
                folder.step(f"start {helper.name} ({helper.handler}, {helper.options}) on port {port}")
        except BaseException:
            self._heal()
            raise
        return self

    def close(self) -> RunResult:
        """Wait for quiescence, close the books and return the verdict; heals in any case."""
        if self._result is not None:
            return self._result
        if self._pool is None or self._engine is None:
            raise HarnessError("close() of a run that is not open", hint="call open() (or use the session as `with`)")
        try:
            self._await_decided(self._pool)
            self._pool.stop()
            self._pool = None
            self._snapshot_books(self._engine)
            self.folder.close_books()  # the snapshot is in the ledger: the folder is complete
        finally:
            self._heal()
        self._result = self._verdict()
        return self._result

    def _heal(self) -> None:
        self._requests.shutdown(wait=False, cancel_futures=True)
        super()._heal()

    def __enter__(self) -> DtmRunSession:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._heal()

    # -- acting while the flow runs ------------------------------------------------------------
    def submit(self, count: int, *, poison: bool = False, hold_s: float | None = None) -> list[str]:
        """Ask the service for ``count`` transfers (answers come in the background); return their ids.

        ``hold_s`` keeps each one's local transaction open until DTM checks it back, that long at
        most (else the spec's ``options["slow_commits"]`` numbers are held ``options["hold_s"]``).
        """
        if poison:
            raise ConfigError("a DTM transfer has no poison form", hint="submit plain transfers")
        slow, default_hold, busy = _holds(self.spec)
        new = [self.op_id(n) for n in range(len(self.ops), len(self.ops) + count)]
        held = 0.0
        for op in new:
            n = len(self.ops)
            hold = hold_s if hold_s is not None else default_hold if n in slow else busy
            held = max(held, hold)
            body = {"op": op, "n": n, "amount": 1 + n % 7, "hold_s": hold}
            self.ops.append(op)
            self._answers[op] = self._requests.submit(self._request, op, body)
        self.folder.step(f"submit {count} transfer(s)" + (f", local transaction held {held}s" if held else ""))
        self.progress(f"submitted {len(self.ops)} transfers")
        return new

    def _request(self, op: str, body: dict[str, object]) -> str:
        """POST one transfer to the service; return its answer (a failure is an answer too)."""
        deadline = time.monotonic() + CONNECT_FOR_S
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.service_port, timeout=REQUEST_S)
            try:
                conn.request("POST", "/transfer", body=json.dumps(body), headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = json.loads(resp.read() or b"{}")
                return f"{resp.status} {answer.get('result', '')}".strip()
            except ConnectionRefusedError:  # the request never left: the service is restarting
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                self.ledger.emit(Kind.ERROR, op=op, dest="transfer", error="service refused connections")
                return "refused"
            except (OSError, http.client.HTTPException, ValueError) as exc:  # sent: the service died or timed out
                self.ledger.emit(Kind.ERROR, op=op, dest="transfer", error=repr(exc))
                return f"no answer: {exc!r}"
            finally:
                conn.close()

    def gid(self, op: str) -> str:
        """Return the DTM gid of operation ``op`` in this run."""
        return gid_of(op, self.tag)

    def money(self) -> tuple[int, int]:
        """Return (debited, credited): the sums of the committed debits and credits now."""
        if self._engine is None:
            raise HarnessError("money() of a run that is not open", hint="call open() first")
        return money(self._engine)

    # -- phases --------------------------------------------------------------------------------
    def _worker_specs(self) -> list[WorkerSpec]:
        spec = self.spec
        endpoints_path = self.folder.path / "endpoints.json"
        endpoints_path.write_text(self.endpoints.to_json())
        urls = {f"{name}_url": f"http://127.0.0.1:{port}" for name, port in self.helper_ports.items()}

        def process(name: str, handler: str, options: dict[str, object]) -> WorkerSpec:
            return WorkerSpec(
                name=name,
                run_dir=str(self.folder.path),
                endpoints_path=str(endpoints_path),
                handler=handler,
                stage=name,
                input_queue=f"dtm:{name}",
                output_queue=None,
                options=options,
                kind="process",
            )

        service_opts = {**urls, **spec.options, "port": self.service_port, "gid_tag": self.tag}
        out = [process(SERVICE, spec.handler, service_opts)]
        out += [process(h.name, h.handler, {**h.options, "port": self.helper_ports[h.name]}) for h in spec.helpers]
        return out

    def wait_decided(self, timeout_s: float | None = None) -> dict[str, str]:
        """Wait until every request is answered and DTM has decided every message so far.

        Returns the undecided operations and their DTM status (empty when all are decided)
        after ``timeout_s`` (default: the spec's timeout).
        """
        deadline = time.monotonic() + (self.spec.timeout_s if timeout_s is None else timeout_s)
        for future in list(self._answers.values()):
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        pending = dict.fromkeys(self.ops, "unknown")
        while pending and time.monotonic() < deadline:
            for op in sorted(pending):
                try:
                    trans = self.dtm.query(self.gid(op)).get("transaction")
                except HarnessError:  # DTM restarting or cut off: ask again
                    continue
                status = "never prepared" if trans is None else str(trans["status"])
                if trans is None or status in FINAL:
                    del pending[op]
                else:
                    pending[op] = status
            if pending:
                time.sleep(0.2)
        return pending

    def _await_decided(self, pool: WorkerPool) -> None:
        deadline = time.monotonic() + self.spec.timeout_s
        self._undecided = self.wait_decided()
        pool.wait_serving(deadline)
        time.sleep(self.spec.settle_s)  # a branch retry already sent lands before the books close
        decided = len(self.ops) - len(self._undecided)
        self.folder.step(f"quiescence after {decided}/{len(self.ops)} decided by DTM; {pool.restarts} restart(s)")
        if self._undecided:
            self.progress(f"timeout: {len(self._undecided)} message(s) DTM has not decided")

    def _snapshot_books(self, engine: db.Engine) -> None:
        for op in db.column_values(engine, "dtm_credits", "op_id"):
            self.ledger.emit(Kind.RESIDUE_EFFECT, op=op, dest="dtm_credits")
        for op, status in sorted(self._undecided.items()):
            self.ledger.emit(Kind.RESIDUE_QUEUE, op=op, msg=self.gid(op), dest="dtm", status=status)
        events = read_segments(self.folder.path / "ledger")
        recorded = set(events.filter(pc.equal(events["kind"], str(Kind.SUBMIT)))["op"].to_pylist())
        for op in sorted(set(db.column_values(engine, "dtm_debits", "op_id")) - recorded):
            # The service never learnt this debit committed (an error on COMMIT's answer).
            self.ledger.emit(Kind.SUBMIT, op=op, msg=self.gid(op), dest="dtm", by="snapshot")
        debited, credited = self.books = money(engine)
        self.folder.step(f"snapshot dtm_credits and dtm_debits: debited {debited}, credited {credited}")


def _holds(spec: ScenarioSpec) -> tuple[set[int], float, float]:
    """Return the held operation numbers, how long they are held at most, and every other
    transaction's duration (``options["local_tx_s"]``: keeps transfers in flight under a fault)."""
    numbers = spec.options.get("slow_commits", [])
    hold, busy = spec.options.get("hold_s", 6.0), spec.options.get("local_tx_s", 0.0)
    if not isinstance(numbers, list | tuple) or not isinstance(hold, int | float) or not isinstance(busy, int | float):
        raise ConfigError(
            f"slow_commits={numbers!r}, hold_s={hold!r}, local_tx_s={busy!r}",
            hint="give slow_commits as a list of operation numbers, hold_s and local_tx_s in seconds",
        )
    return {int(n) for n in numbers}, float(hold), float(busy)


def run_dtm_scenario(
    spec: ScenarioSpec, endpoints: Endpoints, *, runs_root: Path | None = None, progress: Progress = _quiet
) -> RunResult:
    """Run ``spec`` (``broker="dtm"``) against ``endpoints`` and return the result.

    Transfers run four at a time, but one a crash arm or a held commit names runs alone (the
    flow quiet before and after it): a killed process takes every request in flight with it,
    and the scenario's expectation is about that one operation.
    """
    alone = {c.op_index for c in spec.crashes if c.op_index is not None} | _holds(spec)[0]
    with DtmRunSession(spec, endpoints, runs_root=runs_root, progress=progress) as run:

        def submit_up_to(count: int) -> None:
            while len(run.ops) < count:
                if len(run.ops) in alone:
                    run.wait_decided()
                    run.submit(1)
                    run.wait_decided()
                else:
                    run.submit(1)

        for crash in spec.crashes:
            run.arm(crash)
        for window in sorted(spec.faults, key=lambda w: w.after_ops):
            submit_up_to(window.after_ops)
            run.hold_fault(window)
        submit_up_to(spec.messages)
        return run.close()
