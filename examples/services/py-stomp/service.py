"""Consume operations from a STOMP queue, record each as a Postgres row, then announce it on an output queue.

Both variants commit the database first, then send the output, then ACK the input message:
  naive: the transaction inserts the effect; a redelivered message (the service died after its
         COMMIT, before its ACK) is applied a second time;
  fixed: the transaction first claims the op id in an inbox table and inserts the effect only when
         the claim is new; a redelivery is skipped, its output sent again and the message acked.

Run: python service.py [--variant naive|fixed]  (configuration from the environment, see README.md)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import re
import signal
import socket
import sys
import threading
from typing import Any

import psycopg
import stomp
from psycopg import sql
from stomp.exception import StompException

log = logging.getLogger("py-stomp")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LOST = "lost"  # what the listener puts on the queue when the broker connection ends


class Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Hand frames from stomp.py's receiver thread to the main loop, which does all the work."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.subscribed = threading.Event()

    def on_message(self, frame: Any) -> None:
        self.inbox.put(frame)

    def on_receipt(self, frame: Any) -> None:
        if frame.headers.get("receipt-id") == "subscribed":
            self.subscribed.set()

    def on_error(self, frame: Any) -> None:
        log.error("broker ERROR frame: %s %s", frame.headers.get("message"), frame.body)

    def on_disconnected(self) -> None:
        self.inbox.put(LOST)


def config() -> dict[str, Any]:
    """Read the environment and argv (argv wins for the variant); exit 2 on a bad value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=["naive", "fixed"], default=os.environ.get("VARIANT", "naive"))
    variant = parser.parse_args().variant
    env = os.environ
    cfg = {
        "variant": variant,
        "dsn": env.get("DATABASE_URL", ""),
        "host": env.get("STOMP_HOST", "127.0.0.1"),
        "port": env.get("STOMP_PORT", ""),
        "input": env.get("INPUT", ""),
        "output": env.get("OUTPUT", ""),
        "effects": env.get("EFFECTS_TABLE", "py_effects"),
        "inbox": env.get("INBOX_TABLE", "py_inbox"),
    }
    problems = [] if variant in ("naive", "fixed") else [f"VARIANT {variant!r}: use naive or fixed"]
    problems += [f"{k} is not set" for k in ("DATABASE_URL", "INPUT", "OUTPUT") if not env.get(k)]
    if not cfg["port"].isdigit():
        problems.append(f"STOMP_PORT {cfg['port']!r}: give the broker's STOMP port")
    problems += [
        f"table name {t!r}: use letters, digits, _" for t in (cfg["effects"], cfg["inbox"]) if not IDENT.match(t)
    ]
    if problems:
        log.error("bad configuration: %s", "; ".join(problems))
        sys.exit(2)
    return cfg


def apply(db: psycopg.Connection[Any], cfg: dict[str, Any], op: str, amount: int) -> bool:
    """Run the op's one transaction; return False when the fixed variant has seen the op before."""
    with db.transaction(), db.cursor() as cur:
        if cfg["variant"] == "fixed":
            claim = sql.SQL("INSERT INTO {} (op_id) VALUES (%s) ON CONFLICT DO NOTHING")
            cur.execute(claim.format(sql.Identifier(cfg["inbox"])), (op,))
            if cur.rowcount == 0:
                return False
        effect = sql.SQL("INSERT INTO {} (op_id, amount) VALUES (%s, %s)")
        cur.execute(effect.format(sql.Identifier(cfg["effects"])), (op, amount))
    return True


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s py-stomp %(levelname)s %(message)s")
    cfg = config()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    # autocommit: db.transaction() then sends BEGIN and COMMIT itself, one transaction per message.
    db = psycopg.connect(cfg["dsn"], autocommit=True)
    listener = Listener()
    conn = stomp.Connection12([(cfg["host"], int(cfg["port"]))], heartbeats=(0, 0), reconnect_attempts_max=1)
    conn.set_listener("service", listener)
    conn.connect(wait=True)
    # stomp.py leaves Nagle on, which delays each small frame by the peer's delayed ACK (~40 ms).
    sock = getattr(conn.transport, "socket", None)
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.subscribe(
        f"/queue/{cfg['input']}",
        id="in",
        ack="client-individual",
        headers={"activemq.prefetchSize": "1", "receipt": "subscribed"},
    )
    if not listener.subscribed.wait(30):
        log.error("no RECEIPT for SUBSCRIBE /queue/%s within 30 s", cfg["input"])
        return 1
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    log.info("variant %s: /queue/%s -> /queue/%s", cfg["variant"], cfg["input"], cfg["output"])

    while not stopping.is_set():
        try:
            frame = listener.inbox.get(timeout=0.5)
        except queue.Empty:
            continue
        if frame is LOST:
            if stopping.is_set():
                break
            log.error("STOMP connection lost; exiting (the unacked message will be redelivered)")
            return 1
        try:
            body = json.loads(frame.body)
            op, amount = str(body["op"]), int(body["amount"])
        except (ValueError, KeyError, TypeError) as exc:
            # A message no retry can fix would come back forever: drop it, loudly.
            log.error("unreadable message %s (%r): %s; acking it", frame.headers.get("message-id"), frame.body, exc)
            conn.ack(frame.headers["ack"])
            continue
        try:
            applied = apply(db, cfg, op, amount)
        except psycopg.OperationalError as exc:
            log.error("database connection lost at op %s: %s; exiting", op, exc)
            return 1
        try:
            output = json.dumps({"op": op})
            conn.send(f"/queue/{cfg['output']}", output, "application/json", headers={"persistent": "true"})
            conn.ack(frame.headers["ack"])
        except (StompException, OSError) as exc:
            log.error("STOMP connection lost at op %s: %s; exiting (the message will be redelivered)", op, exc)
            return 1
        log.info("op %s amount %d %s", op, amount, "applied" if applied else "seen before, skipped")

    log.info("SIGTERM: stopping")
    conn.disconnect()
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
