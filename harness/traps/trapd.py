"""The trap relay process, ``trapd``: built from ``relay/`` (Go) once per source version, driven over a pipe.

A Python relay costs 18-25 µs of CPU a message relayed, which alone breaks the 10 % clean-path
budget of a service under test (docs/traps.md "Cost"), so the relay and the protocol readers run
in Go; the harness keeps the decisions that need its processes (kill, freeze, thaw) and its books.
One ``trapd`` serves every trap set and proxy of this Python process. It reads one JSON command a
line on stdin and answers on stdout (``relay/control.go``); a trap's firing arrives there as an
event, handled on a thread of its own while the Go side holds the message. trapd exits when its
stdin closes, so it never outlives the harness, even one killed by SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from harness.errors import ConfigError, HarnessError
from harness.stack.bootstrap import cache_root, go_env, say

SOURCE = Path(__file__).parent / "relay"
REPLY_TIMEOUT_S = 30.0
GONE = "its error is printed above (trapd:); the run cannot trap without it"

Event = dict[str, Any]


def _sources() -> list[Path]:
    return sorted(p for p in SOURCE.iterdir() if p.name == "go.mod" or (p.suffix == ".go" and "_test" not in p.name))


def binary() -> Path:
    """Return the built relay for the sources in this package, building it first if needed (once)."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    dest = cache_root() / "bin" / f"trapd-{digest.hexdigest()[:16]}"
    if dest.exists():
        return dest
    go = shutil.which("go")
    if go is None:
        raise ConfigError(
            "the trap relay (trapd) is built with Go, and `go` is not on PATH",
            hint="install Go 1.22+ (the bootstrap needs it for Toxiproxy too), or set relays=False on the Service",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / "trapd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs that start at once build it once
        if dest.exists():
            return dest
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            for path in _sources():
                shutil.copy(path, tmp)
            env = {**go_env(), "GOTOOLCHAIN": "local"}
            say("building the trap relay (trapd) with go build, once per version...")
            built = subprocess.run(
                [go, "build", "-trimpath", "-o", "trapd", "."], cwd=tmp, env=env, capture_output=True, text=True
            )
            if built.returncode != 0:
                raise HarnessError(
                    f"building the trap relay failed (go build, exit {built.returncode}): {built.stderr[-800:]}",
                    hint=f"its sources are {SOURCE}; `go version` must be 1.22 or newer",
                )
            os.replace(Path(tmp) / "trapd", dest)
    return dest


class Relay:
    """One running ``trapd``: ``call`` sends a command and waits for its reply; events go to handlers.

    Example: ``relay().call("set")["set"]``.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [str(binary()), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._stdin: IO[str] = self._proc.stdin
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[threading.Event, list[Event]]] = {}
        self._handlers: dict[int, Callable[[Event], None]] = {}
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), name="trapd-read", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def call(self, cmd: str, **fields: object) -> Event:
        """Send ``cmd`` with ``fields`` and return trapd's reply; raise HarnessError on its error."""
        done, box = threading.Event(), list[Event]()
        with self._lock:
            cid = next(self._ids)
            self._waiting[cid] = (done, box)
            try:
                self._stdin.write(json.dumps({"id": cid, "cmd": cmd, **fields}) + "\n")
                self._stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
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
        with contextlib.suppress(OSError, ValueError):
            self._stdin.close()  # trapd exits at the end of its stdin
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
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
        with self._lock:  # trapd ended: nobody waits for an answer that cannot come
            waiting_all, self._waiting = list(self._waiting.values()), {}
        for done, _ in waiting_all:
            done.set()


_relay: Relay | None = None
_relay_lock = threading.Lock()


def relay() -> Relay:
    """Return this process's trapd, started (and built) on first use, or again if it ended."""
    global _relay
    with _relay_lock:
        if _relay is None or not _relay.alive():
            _relay = Relay()
        return _relay


@atexit.register
def _stop() -> None:
    if _relay is not None:
        _relay.close()


__all__ = ["Relay", "binary", "relay"]
