"""A client process for test_traps.py: it commits through a trap, then says so and acts again.

``python -m tests.integration.traps_client MODE OP...`` with the trap's address in the environment
(``TRAP_PG_URL``, ``TRAP_STOMP``, ``TRAP_KAFKA``). After each confirmed commit it prints
``committed OP`` and does one more thing the harness can see (a row in ``trap_after``, a message
on the ``.after`` queue): a trap that fires in the window leaves neither.
"""

from __future__ import annotations

import os
import sys


def pg(ops: list[str]) -> None:
    from harness.clients import db

    eng = db.engine(os.environ["TRAP_PG_URL"], pool_size=1)
    for op in ops:
        with eng.begin() as conn:  # psycopg: BEGIN and COMMIT as simple queries, the INSERT bound (extended)
            conn.exec_driver_sql("INSERT INTO trap_effects(op) VALUES (%s)", (op,))
        print(f"committed {op}", flush=True)
        with eng.begin() as conn:
            conn.exec_driver_sql("INSERT INTO trap_after(op) VALUES (%s)", (op,))


def stomp(queue: str, ops: list[str]) -> None:
    from harness.clients.activemq import StompClient

    host, port = os.environ["TRAP_STOMP"].split(":")
    with StompClient(host, int(port)) as client:
        client.subscribe(queue)
        for _ in ops:
            msg = client.receive(timeout=10)
            assert msg is not None, "no input message"
            op = msg.headers["txchaos-op"]
            tx = client.begin()
            client.send(queue + ".out", op, transaction=tx, headers={"txchaos-op": op})
            client.ack(msg, transaction=tx)
            client.commit(tx)
            print(f"committed {op}", flush=True)
            client.send(queue + ".after", op)


def kafka(topic: str, ops: list[str], *, transactional: bool) -> None:
    from harness.clients.kafka import OutputProducer

    producer = OutputProducer(os.environ["TRAP_KAFKA"], transactional_id=f"{topic}-tx" if transactional else None)
    for op in ops:
        if transactional:
            producer.begin()
        producer.produce(topic, f'{{"op": "{op}"}}'.encode(), key=op)
        if transactional:
            producer.commit()
        else:
            producer.flush()
        print(f"committed {op}", flush=True)


def consume(topic: str, count: int) -> None:
    from harness.clients.kafka import GroupConsumer

    consumer = GroupConsumer(os.environ["TRAP_KAFKA"], f"{topic}-group", [topic])
    done = 0
    while done < count:
        for record in consumer.poll_batch(1, 1.0):
            consumer.store(record)
            consumer.commit()
            print(f"committed {record.value.decode()}", flush=True)
            done += 1


def main(argv: list[str]) -> None:
    mode, rest = argv[0], argv[1:]
    if mode == "pg":
        pg(rest)
    elif mode == "stomp":
        stomp(rest[0], rest[1:])
    elif mode == "kafka-consume":
        consume(rest[0], int(rest[1]))
    else:
        kafka(rest[0], rest[1:], transactional=mode == "kafka-txn")


if __name__ == "__main__":
    main(sys.argv[1:])
