"""Run one DTM 2-phase message scenario: the service and the branch as worker processes, a verdict.

The ``dtm`` flow's parts put DTM in place of a broker queue: the topology (``DtmService``) runs
the ``service`` and ``branch`` processes on ports of their own; an operation is a transfer the
driver asks the service for over HTTP (the ``Transfers`` workload); quiescence (``decided``) is
every request answered and every prepared message decided by DTM (``succeed`` or ``failed``).
The books it closes with:

- every credit row is a ``residue_effect`` (``dtm_credits`` is the effect table): two for one
  operation is ``duplicate-effect``; a credit without a committed debit is ``orphan-effect``;
- a committed debit is the operation's ``submit`` (the service records it after its commit; a
  debit it never learnt committed, after an ambiguous commit, is recorded here): a debit with
  no credit is ``lost``;
- a message DTM has not decided at quiescence is ``residue_queue`` (``stuck``);
- a message prepared whose debit never committed and that nobody aborted is ``in-doubt``.

The lifecycle (arms, faults, the driver loop, the verdict and healing) is ``RunSession``'s.
"""

from __future__ import annotations

import http.client
import json
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow.compute as pc

from harness.clients import db
from harness.clients.dtm import DtmClient
from harness.errors import ConfigError, HarnessError
from harness.ledger.reader import read_segments
from harness.ledger.schema import Kind
from harness.patterns.dtm_transfer import gid_of, money
from harness.poll import poll_until
from harness.run.core.books import Book, EffectTable
from harness.run.core.parts import worker_spec
from harness.run.core.roles import Plain, Quiescence, SessionView, UntilDone
from harness.run.spec.flow import Flow, Parts, register
from harness.run.spec.scenario import ScenarioSpec
from harness.stack.base import Endpoints
from harness.stack.procs import free_ports
from harness.worker.spec import WorkerSpec

SERVICE = "service"
FINAL = ("succeed", "failed")  # DTM statuses after which it never calls the branch again
REQUEST_S = 15.0  # one transfer request: a held local transaction plus DTM round trips
CONNECT_FOR_S = 10.0  # a refused connection (the service restarting) is retried this long


@dataclass(frozen=True)
class DtmHolds:
    """A DTM spec's typed options: the held operation numbers (``slow_commits``), how long they are
    held at most (``hold_s``) and every other transaction's duration (``local_tx_s``: keeps
    transfers in flight under a fault)."""

    slow: frozenset[int] = frozenset()
    hold_s: float = 6.0
    local_tx_s: float = 0.0

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> DtmHolds:
        numbers = options.get("slow_commits", [])
        hold, busy = options.get("hold_s", 6.0), options.get("local_tx_s", 0.0)
        if (
            not isinstance(numbers, list | tuple)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
            or not isinstance(hold, int | float)
            or not isinstance(busy, int | float)
        ):
            raise ConfigError(
                f"slow_commits={numbers!r}, hold_s={hold!r}, local_tx_s={busy!r}",
                hint="give slow_commits as a list of operation numbers, hold_s and local_tx_s in seconds",
            )
        return cls(frozenset(numbers), float(hold), float(busy))


class DtmService:
    """The topology of a DTM run: the service and its helpers on ports of their own, DTM asked by gid.

    What the parts share lives here: the requests in flight and their answers, the messages DTM
    had not decided at quiescence, and the money debited and credited when the books closed.
    """

    late_workers: ClassVar[bool] = False
    # A transfer is asked of the service on its own port, which at once asks DTM and Postgres: no
    # broker holds it meanwhile, so a cut of either fails the transfers it meets at their start.
    submits_via: ClassVar[frozenset[str]] = frozenset({"dtm", "postgres"})

    def __init__(self, session: SessionView) -> None:
        # DTM calls the service and the branch on 127.0.0.1: both providers run it on the host's
        # loopback (the docker provider with host networking, docs/docker.md).
        self.session = session
        dtm = session.endpoints.dtm
        assert dtm is not None  # check() refused a stack without DTM
        self.group = f"{session.ns}.group"
        self.service_port = free_ports(1).pop()
        self.tag = secrets.token_hex(4)
        self.dtm = DtmClient(dtm.host, dtm.port, timeout=3.0)
        self.requests = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dtm-driver")
        self.answers: dict[str, Future[str]] = {}
        self.undecided: dict[str, str] = {}
        # (debited, credited) when the books closed: what conservation of money is checked on.
        self.closing_money: tuple[int, int] | None = None

    @classmethod
    def check(cls, spec: ScenarioSpec, endpoints: Endpoints) -> None:
        if endpoints.dtm is None:
            raise ConfigError("this stack has no DTM server", hint="start a new stack: `txchaos down && txchaos up`")

    def provision(self) -> None:
        return None

    def announce(self) -> None:
        spec, folder = self.session.spec, self.session.folder
        checkback = spec.options.get("checkback", "barrier")
        folder.step(f"start {SERVICE} ({spec.handler}, check-back {checkback}) on port {self.service_port}")
        for helper in spec.helpers:
            port = self.session.helper_ports[helper.name]
            folder.step(f"start {helper.name} ({helper.handler}, {helper.options}) on port {port}")

    def worker_specs(self) -> list[WorkerSpec]:
        s = self.session
        spec = s.spec
        urls = {f"{name}_url": f"http://127.0.0.1:{port}" for name, port in s.helper_ports.items()}

        def process(name: str, handler: str, options: dict[str, object]) -> WorkerSpec:
            return worker_spec(
                s.folder.path,
                name,
                handler,
                input_queue=f"dtm:{name}",
                output_queue=None,
                options=options,
                kind="process",
            )

        service_opts = {**urls, **spec.options, "port": self.service_port, "gid_tag": self.tag}
        out = [process(SERVICE, spec.handler, service_opts)]
        out += [process(h.name, h.handler, {**h.options, "port": s.helper_ports[h.name]}) for h in spec.helpers]
        return out

    def effect_tables(self) -> tuple[tuple[str, str], ...]:
        return (("dtm_credits", "op_id"),)

    def release(self) -> None:
        self.requests.shutdown(wait=False, cancel_futures=True)

    def gid(self, op: str) -> str:
        """Return the DTM gid of operation ``op`` in this run."""
        return gid_of(op, self.tag)

    def money(self) -> tuple[int, int]:
        """Return (debited, credited): the sums of the committed debits and credits now."""
        return money(self.session.engine("money"))

    def decide(self) -> dict[str, str]:
        """Wait for every decision (``wait_decided``); keep the undecided for the books and return them."""
        self.undecided = self.wait_decided()
        return self.undecided

    def wait_decided(self, timeout_s: float | None = None) -> dict[str, str]:
        """Wait until every request is answered and DTM has decided every message so far.

        Returns the undecided operations and their DTM status (empty when all are decided)
        after ``timeout_s`` (default: the spec's timeout).
        """
        s = self.session
        deadline = time.monotonic() + (s.spec.timeout_s if timeout_s is None else timeout_s)
        for future in list(self.answers.values()):
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        pending = dict.fromkeys(s.ops, "unknown")

        def decided() -> bool:
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
            return not pending

        poll_until(
            decided,
            deadline=deadline,
            every_s=0.2,
            report=lambda waited: s.progress(f"{len(pending)} transfer(s) undecided by DTM after {waited:.0f}s"),
        )
        return pending


@dataclass
class Transfers(Plain):
    """Operations that are transfers: each a POST to the service, answered in the background."""

    session: SessionView
    place: DtmService

    def submit(self, count: int, *, poison: bool = False, hold_s: float | None = None, **extra: Any) -> list[str]:
        """Ask the service for ``count`` transfers (answers come in the background); return their ids.

        ``hold_s`` keeps each one's local transaction open until DTM checks it back, that long at
        most (else the spec's ``options["slow_commits"]`` numbers are held ``options["hold_s"]``).
        """
        if poison:
            raise ConfigError("a DTM transfer has no poison form", hint="submit plain transfers")
        if extra:
            raise ConfigError(f"a DTM transfer has no option {sorted(extra)}", hint="give hold_s= or nothing")
        s = self.session
        holds = s.spec.settings_as(DtmHolds)
        slow, default_hold, busy = holds.slow, holds.hold_s, holds.local_tx_s
        new = s.mint(count)
        held = 0.0
        for op in new:
            n = len(s.ops)
            hold = hold_s if hold_s is not None else default_hold if n in slow else busy
            held = max(held, hold)
            body = {"op": op, "n": n, "amount": 1 + n % 7, "hold_s": hold}
            s.ops.append(op)
            self.place.answers[op] = self.place.requests.submit(self._request, op, body)
        s.folder.step(f"submit {count} transfer(s)" + (f", local transaction held {held}s" if held else ""))
        s.progress(f"submitted {len(s.ops)} transfers")
        return new

    def _request(self, op: str, body: dict[str, object]) -> str:
        """POST one transfer to the service; return its answer (a failure is an answer too)."""
        ledger, port = self.session.ledger, self.place.service_port
        deadline = time.monotonic() + CONNECT_FOR_S
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_S)
            try:
                conn.request("POST", "/transfer", body=json.dumps(body), headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = json.loads(resp.read() or b"{}")
                return f"{resp.status} {answer.get('result', '')}".strip()
            except ConnectionRefusedError:  # the request never left: the service is restarting
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                ledger.emit(Kind.ERROR, op=op, dest="transfer", error="service refused connections")
                return "refused"
            except (OSError, http.client.HTTPException, ValueError) as exc:  # sent: the service died or timed out
                ledger.emit(Kind.ERROR, op=op, dest="transfer", error=repr(exc))
                return f"no answer: {exc!r}"
            finally:
                conn.close()

    def alone(self) -> set[int]:
        # A killed process takes every request in flight with it, and the scenario's expectation
        # is about the one operation a crash arm or a held commit names: it runs alone.
        spec = self.session.spec
        return {c.op_index for c in spec.crashes if c.op_index is not None} | spec.settings_as(DtmHolds).slow

    def wait_idle(self) -> None:
        self.place.wait_decided()


def decided(session: SessionView, place: DtmService) -> Quiescence:
    """Quiet when every request is answered and DTM decided every message (or the timeout)."""
    return UntilDone(session, place.decide, "decided by DTM")


def dtm_books(session: SessionView, place: DtmService) -> tuple[Book, ...]:
    """The credits (the effect table), then the transfers' own books."""
    return (EffectTable(session.ledger, session.folder, "dtm_credits"), DtmDecisions(session, place))


@dataclass
class DtmDecisions:
    """The transfers' books: each debit a ``submit`` (one the service never learnt committed is added
    here), each credit a ``residue_effect``, each message DTM has not decided a ``residue_queue``;
    money debited and credited kept on the session for conservation."""

    session: SessionView
    place: DtmService

    def close(self, engine: db.Engine) -> None:
        s, place = self.session, self.place
        for op, status in sorted(place.undecided.items()):
            s.ledger.emit(Kind.RESIDUE_QUEUE, op=op, msg=place.gid(op), dest="dtm", status=status)
        events = read_segments(s.folder.path / "ledger")
        recorded = set(events.filter(pc.equal(events["kind"], str(Kind.SUBMIT)))["op"].to_pylist())
        for op in sorted(set(db.column_values(engine, "dtm_debits", "op_id")) - recorded):
            # The service never learnt this debit committed (an error on COMMIT's answer).
            s.ledger.emit(Kind.SUBMIT, op=op, msg=place.gid(op), dest="dtm", by="snapshot")
        debited, credited = place.closing_money = money(engine)
        s.folder.step(f"snapshot dtm_credits and dtm_debits: debited {debited}, credited {credited}")


FLOW = register(
    Flow(
        "dtm",
        "http",
        "a 2-phase message transfer: a service and its branch over DTM",
        parts=Parts(DtmService, Transfers, decided, dtm_books),
        accepts=frozenset({"helpers"}),
        refusal="the DTM run has one service and its helpers (the branch): leave those out",
        parse=DtmHolds.from_options,
        label="DTM",
        counts_out=False,
    )
)
