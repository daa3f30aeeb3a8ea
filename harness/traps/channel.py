"""The trap relay, ``trapd``: Toxiproxy's server with the trap toxics (``trapd/``, Go), and its control channel.

A Python relay costs 18-25 µs of CPU a message relayed, and a relay in front of Toxiproxy a second
hop on every round trip, which together broke the 10 % clean-path budget of a service under test
(docs/traps.md "Cost"). So the protocol readers run in Go as a toxic inside the stack's Toxiproxy:
a trap proxy is a twin of the stack's proxy, forwarding straight to its upstream and carrying its
network faults. The harness keeps the decisions that need its processes (kill, freeze, thaw) and
its books. It reaches the engine on ``GET /trapd`` of the stack's Toxiproxy API, upgraded to a
channel of JSON lines (``trapd/control.go``); a trap with no stack runs in ``trapd serve``, a child
driven over its stdin. Either way what a harness made goes when its channel closes, even when the
harness was killed by SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from harness.errors import HarnessError
from harness.stack.go_builds import ensure_toxiproxy as _ensure
from harness.stack.install_shell import say

REPLY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
GONE = "the trap relay's channel closed: is the stack's Toxiproxy still running? (txchaos status)"

Event = dict[str, Any]


def binary() -> Path:
    """Return the built ``trapd`` for the sources in this package, building it first if needed (once)."""
    return Path(_ensure())


class Trapd:
    """One control channel to ``trapd``: ``call`` sends a command and waits for its reply; events go to handlers.

    ``Trapd(api)`` opens the channel on the stack's Toxiproxy at ``api`` (``http://HOST:PORT``);
    ``Trapd()`` starts ``trapd serve`` for traps with no stack. Example: ``trapd(api).call("set")["set"]``.
    """

    def __init__(self, api: str | None = None) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        if api is None:
            self._proc = subprocess.Popen([str(binary()), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert self._proc.stdin is not None
            assert self._proc.stdout is not None
            out, inp = self._proc.stdin, self._proc.stdout
        else:
            self._sock = _upgrade(api)
            out, inp = self._sock.makefile("wb"), self._sock.makefile("rb")
        self._out: IO[bytes] = out
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open = True
        self._waiting: dict[int, tuple[threading.Event, list[Event]]] = {}
        self._handlers: dict[int, Callable[[Event], None]] = {}
        self._reader = threading.Thread(target=self._read, args=(inp,), name="trapd-read", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self._open and (self._proc is None or self._proc.poll() is None)

    def call(self, cmd: str, **fields: object) -> Event:
        """Send ``cmd`` with ``fields`` and return trapd's reply; raise HarnessError on its error."""
        done, box = threading.Event(), list[Event]()
        with self._lock:
            cid = next(self._ids)
            self._waiting[cid] = (done, box)
            try:
                self._out.write(json.dumps({"id": cid, "cmd": cmd, **fields}).encode() + b"\n")
                self._out.flush()
            except (OSError, ValueError) as exc:
                self._waiting.pop(cid, None)
                raise HarnessError(f"the trap relay is gone ({exc})", hint=GONE) from exc
        if not done.wait(REPLY_TIMEOUT_S) or not box:
            raise HarnessError(f"the trap relay did not answer {cmd!r}", hint=GONE)
        reply: Event = box[0]
        if "error" in reply:
            raise HarnessError(f"the trap relay refused {cmd!r}: {reply['error']}", hint=f"check the {cmd} values")
        return reply

    def on_event(self, proxy: int, handler: Callable[[Event], None] | None) -> None:
        """Route the events of ``proxy`` to ``handler`` (each on a thread of its own); None: forget it."""
        with self._lock:
            if handler is None:
                self._handlers.pop(proxy, None)
            else:
                self._handlers[proxy] = handler

    def close(self) -> None:
        """Close the channel: trapd drops this harness's traps and proxies (``trapd serve`` exits)."""
        with contextlib.suppress(OSError, ValueError):
            self._out.close()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _read(self, inp: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in inp:
                message: Event = json.loads(line)
                if "event" in message:
                    with self._lock:
                        handler = self._handlers.get(int(message.get("proxy", 0)))
                    if handler is not None:
                        threading.Thread(target=handler, args=(message,), name="trap-fired", daemon=True).start()
                    continue
                with self._lock:
                    waiting = self._waiting.pop(int(message.get("id", 0)), None)
                if waiting is not None:
                    waiting[1].append(message)
                    waiting[0].set()
        with self._lock:  # the channel ended: nobody waits for an answer that cannot come
            self._open = False
            waiting_all, self._waiting = list(self._waiting.values()), {}
        for done, _ in waiting_all:
            done.set()


class NoTraps(HarnessError):
    """The Toxiproxy at an API address has no trap relay (a stock server, or one built before it)."""


def _upgrade(api: str) -> socket.socket:
    """Open ``GET /trapd`` on the Toxiproxy API ``api`` and return the socket once it is a control channel."""
    parsed = urlparse(api)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 8474
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise HarnessError(f"the stack's Toxiproxy at {api} did not answer: {exc}", hint=GONE) from exc
    sock.sendall(f"GET /trapd HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: nothing after the head may be read here
        if not chunk:
            break
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        sock.close()
        status = head.split(b"\r\n", 1)[0].decode(errors="replace") or "no answer"
        raise NoTraps(
            f"the Toxiproxy at {api} has no trap relay ({status})",
            hint="restart the stack (txchaos down, then up) so that it runs Toxiproxy with the traps (trapd)",
        )
    sock.settimeout(None)
    return sock


_daemons: dict[str | None, Trapd] = {}
_daemons_lock = threading.Lock()


def trapd(api: str | None = None) -> Trapd:
    """Return this process's channel to the trapd at ``api`` (None: a ``trapd serve`` of its own), opened on first use.

    A stack whose Toxiproxy has no trap relay (started before it existed) gets a ``trapd serve``
    in front of it instead, with a notice: the traps work, at the cost of a second hop.
    """
    with _daemons_lock:
        found = _daemons.get(api)
        if found is None or not found.alive():
            try:
                found = Trapd(api)
            except NoTraps as exc:
                say(f"note: trapping through a relay of its own, a second hop: {exc}")
                found = _daemons[None] if None in _daemons and _daemons[None].alive() else Trapd()
                _daemons[None] = found
            _daemons[api] = found
        return found


@atexit.register
def _stop() -> None:
    for found in _daemons.values():
        found.close()


__all__ = ["NoTraps", "Trapd", "binary", "trapd"]
