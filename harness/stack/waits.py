"""Readiness waits: poll a probe until it passes, or fail with the service's log tail and a hint."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness.errors import StackError
from harness.stack.procs import Managed


@dataclass(frozen=True)
class Wait:
    """Poll ``probe`` every ``interval`` s for up to ``timeout`` s, tolerating ``tolerated`` errors."""

    what: str
    probe: Callable[[], bool]
    timeout: float = 60.0
    interval: float = 0.1
    tolerated: tuple[type[BaseException], ...] = (OSError,)
    hint: str = ""
    # Log lines that mean the process will never be ready although it stays up (DTM logs a failed
    # bind and keeps running without its HTTP API): seen in the process's log, the wait ends at once.
    fatal: tuple[str, ...] = ()

    def run(self, proc: Managed | None = None) -> float:
        """Return the seconds it took; raise StackError when the time is up or the process died."""
        started = time.monotonic()
        last_error: BaseException | None = None
        while True:
            if proc is not None and not proc.alive():
                raise StackError(
                    f"{self.what}: process exited with code {proc.popen.returncode} before it was ready",
                    hint=self.hint or f"read {proc.log_path}",
                    log_tail=proc.log_tail(),
                )
            if proc is not None and self.fatal:
                logged = proc.log_tail(200)
                seen = [line for line in self.fatal if line in logged]
                if seen:
                    raise StackError(
                        f"{self.what}: the process logged {seen[0]!r}; it will not answer",
                        hint=self.hint or f"read {proc.log_path}",
                        log_tail=proc.log_tail(),
                    )
            try:
                if self.probe():
                    return time.monotonic() - started
            except self.tolerated as exc:
                last_error = exc
            if time.monotonic() - started > self.timeout:
                why = f" (last error: {last_error!r})" if last_error else ""
                raise StackError(
                    f"{self.what}: not ready after {self.timeout:.0f}s{why}",
                    hint=self.hint or "raise the timeout with TXCHAOS_START_TIMEOUT, or read the log",
                    log_tail=proc.log_tail() if proc else "",
                )
            time.sleep(self.interval)


def port_open(host: str, port: int) -> Callable[[], bool]:
    """Return a probe that passes once ``host:port`` accepts a TCP connection."""

    def probe() -> bool:
        with socket.create_connection((host, port), timeout=0.5):
            return True

    return probe


def stomp_connected(host: str, port: int) -> Callable[[], bool]:
    """Return a probe that passes once a STOMP CONNECT gets CONNECTED (the broker is serving)."""

    def probe() -> bool:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            s.settimeout(2.0)
            data = s.recv(64)
            return data.startswith(b"CONNECTED")

    return probe


def openwire_answers(host: str, port: int) -> Callable[[], bool]:
    """Return a probe that passes once the broker greets an OpenWire connection (its WireFormatInfo).

    A proxy accepts before its upstream does: only the broker's own first frame (which names
    ``ActiveMQ``, the format's magic) says its OpenWire connector serves.
    """

    def probe() -> bool:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            seen = b""
            while len(seen) < 64:
                chunk = sock.recv(256)
                if not chunk:
                    return False
                seen += chunk
                if b"ActiveMQ" in seen:
                    return True
            return False

    return probe


def wait_each(services: Iterable[str], wait: Callable[[str], None]) -> None:
    """Run ``wait(service)`` for every service at once, one thread each; raise the first error once all end.

    The services start in parallel, so their waits overlap: a stack is ready in the time of its
    slowest service, not the sum. Every wait runs to its end before an error is raised, so none
    is left probing behind the caller.
    """
    errors: list[BaseException] = []

    def run(service: str) -> None:
        try:
            wait(service)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,), name=f"wait-{s}") for s in services]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
