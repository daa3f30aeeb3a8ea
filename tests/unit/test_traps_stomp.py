"""The STOMP trap parser finds ACK and COMMIT sent and a COMMIT's RECEIPT, with the ops they concern."""

from __future__ import annotations

from tests.unit.trapfeed import GoSession, Hit, stomp_session

StompSession = GoSession


def frame(command: str, headers: dict[str, str], body: bytes = b"", *, eol: bytes = b"\n") -> bytes:
    lines = [command.encode()] + [f"{k}:{v}".encode() for k, v in headers.items()]
    return eol.join(lines) + eol + eol + body + b"\x00"


def session(*ops: str) -> StompSession:
    return stomp_session(*ops)


def up(s: StompSession, data: bytes) -> list[Hit]:
    out, hits = s.feed("up", data)
    assert out == data
    return hits


def down(s: StompSession, data: bytes) -> list[Hit]:
    out, hits = s.feed("down", data)
    assert out == data
    return hits


def test_ack_carries_the_op_of_the_message_it_acknowledges() -> None:
    s = session()
    message = frame("MESSAGE", {"message-id": "ID:1", "ack": "a-1", "txchaos-op": "op-5", "subscription": "0"}, b"{}")
    assert down(s, b"\n" + message) == []  # a heart-beat, then the frame
    ack = frame("ACK", {"id": "a-1"})
    assert up(s, b"\n\n" + ack) == [Hit("stomp_before_ack", 2, frozenset({"op-5"}))]


def test_commit_carries_its_sends_and_acks_and_its_receipt_fires_after() -> None:
    s = session("op-9")
    down(s, frame("MESSAGE", {"message-id": "ID:2", "ack": "a-2"}, b'{"op": "op-9"}'))  # op found in the body
    up(s, frame("BEGIN", {"transaction": "tx1"}))
    up(s, frame("SEND", {"destination": "/queue/out", "transaction": "tx1", "txchaos-op": "op-10"}, b"x"))
    up(s, frame("ACK", {"id": "a-2", "transaction": "tx1"}))
    commit = frame("COMMIT", {"transaction": "tx1", "receipt": "r-1"})
    assert up(s, commit) == [Hit("stomp_before_commit", 0, frozenset({"op-9", "op-10"}))]
    other = frame("RECEIPT", {"receipt-id": "r-0"})
    assert down(s, other + frame("RECEIPT", {"receipt-id": "r-1"})) == [
        Hit("stomp_after_commit", len(other), frozenset({"op-9", "op-10"}))
    ]


def test_aborted_transactions_are_forgotten() -> None:
    s = session()
    up(s, frame("SEND", {"destination": "/queue/out", "transaction": "tx1", "txchaos-op": "op-1"}))
    up(s, frame("ABORT", {"transaction": "tx1"}))
    assert up(s, frame("COMMIT", {"transaction": "tx1"})) == [Hit("stomp_before_commit", 0, frozenset())]


def test_content_length_bodies_may_hold_nuls_and_frames_may_split_anywhere() -> None:
    s = session()
    body = b"a\x00b\x00c"
    data = frame(
        "MESSAGE", {"message-id": "m", "content-length": str(len(body)), "txchaos-op": "op-2"}, body, eol=b"\r\n"
    )
    data += frame("RECEIPT", {"receipt-id": "none"})
    for i in range(len(data)):
        assert down(s, data[i : i + 1]) == []
    ack = frame("ACK", {"message-id": "m", "subscription": "0"}, eol=b"\r\n")
    hits = []
    for i in range(len(ack)):
        hits += [(i, h.ops) for h in up(s, ack[i : i + 1])]
    assert hits == [(len(ack) - 1, frozenset({"op-2"}))]


def test_a_big_body_is_not_kept_whole() -> None:
    s = session()
    body = b"x" * 1_000_000
    data = frame("SEND", {"destination": "/queue/q", "transaction": "t"}, body)
    for i in range(0, len(data), 4096):
        up(s, data[i : i + 4096])
    # that the body is not kept whole is stomp_test.go's TestABigBodyIsNotKeptWhole
    assert up(s, frame("COMMIT", {"transaction": "t"}))[0].point == "stomp_before_commit"
