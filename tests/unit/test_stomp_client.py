"""The STOMP client's own wire work, against a scripted peer on a loopback socket (no broker here:
the broker's behaviour is tests/integration/test_activemq_facts.py's).

What is proven: frames cut anywhere by TCP come out whole; a body holding NUL bytes is kept by its
content-length; header values are escaped going out and unescaped coming in; a RECEIPT wait keeps the
MESSAGEs that arrive before it; a write is not cut off by the last read's wait; a caller busy
elsewhere keeps its connection (beats are sent for it and the broker's beats read later are not
silence); a broker that falls silent, or closes, is reported.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.clients.activemq import StompClient, encode, split_frame, take_frame
from harness.errors import HarnessError

Script = Callable[[socket.socket, bytes], None]  # the peer's side after it read the CONNECT frame


def _read_frame(conn: socket.socket) -> bytes:
    data = bytearray()
    while True:
        chunk = conn.recv(1 << 20)
        data += chunk
        if not chunk or b"\0" in chunk:
            return bytes(data)


@pytest.fixture
def peer() -> Iterator[Callable[[Script, str], StompClient]]:
    """Return ``connect(script, heart_beat)``: a client connected to a peer that answers CONNECTED
    with ``heart_beat`` and then runs ``script`` on its socket in a thread."""
    threads: list[threading.Thread] = []
    servers: list[socket.socket] = []
    clients: list[StompClient] = []

    def connect(script: Script, heart_beat: str = "0,0", *, beats: tuple[int, int] = (0, 0)) -> StompClient:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                connect_frame = _read_frame(conn)
                conn.sendall(encode("CONNECTED", {"version": "1.2", "heart-beat": heart_beat}))
                script(conn, connect_frame)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        client = StompClient("127.0.0.1", server.getsockname()[1], client_id="t", heartbeats=beats)
        clients.append(client)
        return client

    yield connect  # type: ignore[misc]
    for c in clients:
        c.close()
    for s in servers:
        s.close()
    for t in threads:
        t.join(5)


def _message(body: bytes, **headers: str) -> bytes:
    return encode("MESSAGE", {"destination": "/queue/q", "subscription": "sub-1", **headers}, body)


def test_frames_cut_anywhere_come_out_whole_with_their_bodies_and_unescaped_headers(peer) -> None:  # type: ignore[no-untyped-def]
    body = b'{"op": "a"}\0with a NUL inside'
    wire = _message(body, **{"message-id": "ID:host-1:2", "ack": "ID:host-1:2", "txchaos-op": "line\nbreak"})
    wire += b"\n\n" + _message(b"second", **{"message-id": "m2"})  # heart-beat EOLs between frames

    def script(conn: socket.socket, _: bytes) -> None:
        for i in range(0, len(wire), 3):  # three bytes a segment
            conn.sendall(wire[i : i + 3])
            time.sleep(0.001)
        time.sleep(0.5)

    client = peer(script)
    first = client.receive(5)
    assert first is not None
    assert first.body == body.decode()
    assert first.message_id == "ID:host-1:2"
    assert first.headers["txchaos-op"] == "line\nbreak"
    second = client.receive(5)
    assert second is not None
    assert second.body == "second"
    assert client.receive(0.1) is None


def test_header_values_are_escaped_on_the_wire(peer) -> None:  # type: ignore[no-untyped-def]
    seen: list[bytes] = []

    def script(conn: socket.socket, _: bytes) -> None:
        seen.append(_read_frame(conn))

    client = peer(script)
    client.send("q", "body", headers={"txchaos-error": "a:b\nc\\d"})
    time.sleep(0.3)
    assert b"txchaos-error:a\\cb\\nc\\\\d\n" in seen[0]
    assert b"content-length:4\n" in seen[0]


def test_a_receipt_wait_keeps_the_messages_that_come_before_it(peer) -> None:  # type: ignore[no-untyped-def]
    def script(conn: socket.socket, _: bytes) -> None:
        commit = _read_frame(conn)
        receipt = commit.split(b"receipt:")[1].split(b"\n")[0].decode()
        conn.sendall(_message(b"early", **{"message-id": "m1"}) + encode("RECEIPT", {"receipt-id": receipt}))
        time.sleep(0.3)

    client = peer(script)
    client.commit("tx-1")
    held = client.receive(0)
    assert held is not None
    assert held.body == "early"


def test_sends_committed_go_in_one_transaction_and_return_on_its_receipt(peer) -> None:  # type: ignore[no-untyped-def]
    frames: list[bytes] = []

    def script(conn: socket.socket, _: bytes) -> None:
        buf = bytearray()
        while not frames or not frames[-1].startswith(b"COMMIT"):
            buf += conn.recv(1 << 16)
            while (taken := take_frame(buf)) is not None:
                frames.append(taken[0])
        receipt = split_frame(frames[-1], frames[-1].index(b"\n\n"))[1]["receipt"]
        time.sleep(0.3)  # the caller waits for the receipt, not for its own write
        conn.sendall(encode("RECEIPT", {"receipt-id": receipt}))
        time.sleep(0.3)

    client = peer(script)
    started = time.monotonic()
    client.send_committed([("q", f"m-{i}", {"txchaos-op": f"op:{i}"}) for i in range(3)])
    assert time.monotonic() - started >= 0.25
    parsed = [split_frame(f, f.index(b"\n\n")) for f in frames]
    assert [p[0] for p in parsed] == ["BEGIN", "SEND", "SEND", "SEND", "COMMIT"]
    tx = parsed[0][1]["transaction"]
    assert all(p[1]["transaction"] == tx for p in parsed)
    assert [(p[1]["destination"], p[1]["persistent"], p[1]["txchaos-op"], p[2]) for p in parsed[1:4]] == [
        ("/queue/q", "true", f"op:{i}", f"m-{i}".encode()) for i in range(3)
    ]


def test_a_write_waits_for_a_slow_reader_whatever_the_last_read_waited(peer) -> None:  # type: ignore[no-untyped-def]
    got: list[int] = []

    def script(conn: socket.socket, _: bytes) -> None:
        time.sleep(0.5)  # reads nothing meanwhile: the client's send fills the socket buffers
        got.append(len(_read_frame(conn)))

    client = peer(script)
    assert client.receive(0.01) is None  # a read that waited 10 ms
    client.send("q", "x" * 8_000_000)  # blocks until the peer reads, as it would for a slow broker
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got
    assert got[0] > 8_000_000


def test_an_error_frame_is_raised_with_what_the_broker_said(peer) -> None:  # type: ignore[no-untyped-def]
    def script(conn: socket.socket, _: bytes) -> None:
        conn.sendall(encode("ERROR", {"message": "Transaction not active"}, b"detail"))
        time.sleep(0.3)

    client = peer(script)
    with pytest.raises(HarnessError, match="broker ERROR frame: Transaction not active detail"):
        client.receive(5)
    with pytest.raises(HarnessError, match="Transaction not active"):  # and every call after it
        client.begin()


def test_a_busy_caller_keeps_its_connection_its_beats_sent_for_it(peer) -> None:  # type: ignore[no-untyped-def]
    beats: list[float] = []

    def script(conn: socket.socket, _: bytes) -> None:
        conn.settimeout(0.05)
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            conn.sendall(b"\n")  # the broker's beat every 0.2 s
            try:
                if conn.recv(64).strip(b"\n") == b"":
                    beats.append(time.monotonic() - start)
            except TimeoutError:
                pass
            time.sleep(0.15)
        conn.sendall(_message(b"late"))
        time.sleep(0.3)

    client = peer(script, "200,200", beats=(200, 200))
    time.sleep(1.5)  # busy elsewhere (a handler): nothing read for 7 of the broker's intervals
    msg = client.receive(3)
    assert msg is not None
    assert msg.body == "late"
    assert len(beats) >= 4, beats  # the client beat while its caller was busy


def test_a_broker_that_falls_silent_is_reported_lost(peer) -> None:  # type: ignore[no-untyped-def]
    def script(conn: socket.socket, _: bytes) -> None:
        time.sleep(1.5)  # promised beats every 0.2 s, sends none

    client = peer(script, "200,200", beats=(200, 200))
    start = time.monotonic()
    with pytest.raises(HarnessError, match=r"lost: nothing from the broker for 0\.6s"):
        client.receive(5)
    assert time.monotonic() - start < 1.5


def test_a_broker_whose_beats_come_two_intervals_apart_keeps_the_connection(peer) -> None:  # type: ignore[no-untyped-def]
    # ActiveMQ beats only when it wrote nothing since its last check: after a frame, its next byte
    # can come almost two intervals later. That is a live broker, not a lost one.
    def script(conn: socket.socket, _: bytes) -> None:
        start = time.monotonic()
        while time.monotonic() - start < 1.6:
            time.sleep(0.38)  # 1.9 of the agreed 0.2 s
            conn.sendall(b"\n")
        conn.sendall(_message(b"after the beats"))
        time.sleep(0.3)

    client = peer(script, "200,200", beats=(0, 200))
    msg = client.receive(3)
    assert msg is not None
    assert msg.body == "after the beats"


def test_a_broker_that_closes_is_reported_lost(peer) -> None:  # type: ignore[no-untyped-def]
    def script(conn: socket.socket, _: bytes) -> None:
        pass  # closes at once

    client = peer(script)
    with pytest.raises(HarnessError, match="lost: closed by the broker"):
        client.receive(5)


def test_a_refused_connect_says_so_with_its_remedy() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.close()
    with pytest.raises(HarnessError, match=rf"STOMP connect to 127\.0\.0\.1:{port} failed") as info:
        StompClient("127.0.0.1", port, heartbeats=(0, 0))
    assert "txchaos status" in str(info.value)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        # keys go out as given (only values are escaped): none of the characters STOMP escapes
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\\:\n\r\0"), min_size=1).filter(
            lambda k: k != "content-length"
        ),
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")),
        max_size=6,
    ),
    st.binary(max_size=64),
)
def test_a_frame_split_after_taking_gives_back_the_headers_and_body_it_was_encoded_from(
    headers: dict[str, str], body: bytes
) -> None:
    buf = bytearray(b"\n\r\n" + encode("MESSAGE", headers, body) + b"\n" + encode("RECEIPT", {"receipt-id": "r:1"}))
    taken = take_frame(buf)
    assert taken is not None
    command, got, got_body = split_frame(*taken)
    assert command == "MESSAGE"
    assert got_body == body
    assert {k: v for k, v in got.items() if k != "content-length"} == headers
    receipt = take_frame(buf)
    assert receipt is not None
    assert split_frame(*receipt) == ("RECEIPT", {"receipt-id": "r:1"}, b"")
    assert take_frame(buf) is None


def test_the_first_of_repeated_headers_counts_and_connected_is_not_unescaped() -> None:
    frame = b"MESSAGE\r\nid:ID\\chost\\c1\r\nid:second\nplain:a\\\\b\n\nbody"
    assert split_frame(frame, frame.index(b"\n\n")) == ("MESSAGE", {"id": "ID:host:1", "plain": "a\\b"}, b"body")
    connected = b"CONNECTED\nserver:odd\\cname\n\n"
    assert split_frame(connected, connected.index(b"\n\n"))[1] == {"server": "odd\\cname"}
    assert split_frame(frame, frame.index(b"\n\n"), unescape=False)[1]["id"] == "ID\\chost\\c1"


def test_an_unknown_escape_is_a_protocol_error_naming_the_value() -> None:
    frame = b"MESSAGE\nreason:a\\tb\n\n"
    with pytest.raises(HarnessError, match=r"unknown escape '\\\\t'"):
        split_frame(frame, frame.index(b"\n\n"))
