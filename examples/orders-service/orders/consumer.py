"""The orders service as the team runs it in production: its own consumer loop, not a txchaos stage.

It reads orders from a STOMP queue (stomp.py) and places them with SQLAlchemy, in its own commit
order: the database transaction, then the notification, then the ACK. Nothing here knows txchaos:
the tests start it as a process, tell it where things are through its environment, and kill it
in its commit gap with a wire trap on its own Postgres connection.

    python -m orders.consumer [--inbox]

Environment: ``ORDERS_DB`` (a SQLAlchemy URL or libpq URI), ``BROKER_HOST``, ``BROKER_PORT``,
``ORDERS_QUEUE``, ``SHIPPING_QUEUE``. ``--inbox`` places each order id once (the fix).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
from typing import Any

import stomp
from sqlalchemy import create_engine, text


class _Frames(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.frames.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.frames.put(frame)

    def on_disconnected(self) -> None:
        self.frames.put(None)


def main() -> int:
    parser = argparse.ArgumentParser(description="place orders from a queue")
    parser.add_argument("--inbox", action="store_true", help="place each order id once")
    inbox = parser.parse_args().inbox
    url = os.environ["ORDERS_DB"].replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url, pool_size=1)
    conn = stomp.Connection12([(os.environ["BROKER_HOST"], int(os.environ["BROKER_PORT"]))], heartbeats=(0, 0))
    listener = _Frames()
    conn.set_listener("orders", listener)
    conn.connect(wait=True)
    headers = {"activemq.prefetchSize": "1", "receipt": "subscribed"}
    conn.subscribe(f"/queue/{os.environ['ORDERS_QUEUE']}", id="orders", ack="client-individual", headers=headers)
    shipping = f"/queue/{os.environ['SHIPPING_QUEUE']}"
    while (frame := listener.frames.get()) is not None:
        if frame.cmd == "RECEIPT":
            print("orders consumer ready", flush=True)
            continue
        order = json.loads(frame.body)
        with engine.begin() as db:  # BEGIN ... COMMIT
            new = True
            if inbox:
                seen = "INSERT INTO orders_inbox (op_id) VALUES (:op) ON CONFLICT DO NOTHING RETURNING op_id"
                new = db.execute(text(seen), {"op": order["op"]}).first() is not None
            if new:
                place = "INSERT INTO orders (op_id, amount) VALUES (:op, :amount)"
                db.execute(text(place), {"op": order["op"], "amount": int(order.get("amount", 1))})
        placed = {"event": "order-placed", "order": {"id": order["op"]}}
        conn.send(shipping, json.dumps(placed), headers={"persistent": "true"})
        conn.ack(frame.headers["ack"])
    print("broker connection lost", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
