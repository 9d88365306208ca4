"""A warm turn's call to the hermes API server has one deadline for the whole call and a cap on the answer.

Regression (review, ``/tmp/httpfuzz/t13_apiclient.py``): ``api_request`` had only a per-read timeout and read the
body whole, so a server trickling its answer a byte at a time kept a 2 s call 25.5 s, and a 300 MB body was read
into memory. A local stand-in server (a raw socket on 127.0.0.1) answers as each test needs.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from hermes_actors import TurnFailed
from hermes_actors.hermes.api_client import ANSWER_MAX_BYTES, ApiServer, call_api

BODY = b'{"session_id": "s1", "message": {"role": "assistant", "content": "late"}}'


class RawServer:
    """Accepts one connection, reads the request, then runs ``answer(conn, done)``; ``done`` is set by the test
    once the client returned (so a trickle stops)."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self.done = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

        def run() -> None:
            conn, _ = self.listener.accept()
            with conn:
                conn.recv(65536)
                try:
                    answer(conn, self.done)
                except OSError:
                    pass  # the client hung up: what a capped or timed-out call does

        self.thread = threading.Thread(target=run, name="raw-api", daemon=True)
        self.thread.start()

    def server(self) -> ApiServer:
        return ApiServer("127.0.0.1", self.port, "k" * 16)

    def close(self) -> None:
        self.done.set()
        self.thread.join(30)
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket, threading.Event], None]], RawServer]]:
    started: list[RawServer] = []

    def start(answer: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        started.append(RawServer(answer))
        return started[-1]

    yield start
    for raw in started:
        raw.close()


def _trickle(data: bytes, conn: socket.socket, done: threading.Event) -> None:
    """Send ``data`` a byte at a time, a pause between bytes shorter than the call's timeout, until the client
    is done (or all was sent: without a whole-call deadline the client waits for all of it and answers)."""
    for byte in data:
        if done.wait(0.05):
            return
        conn.sendall(bytes([byte]))


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_server_trickling_its_answer_is_cut_off_at_the_calls_timeout(
    serve: Callable[..., RawServer], part: str
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(BODY)
    padded = head + b"X-Pad: " + b"p" * 150 + b"\r\n\r\n"  # ~9 s at a byte per 50 ms

    def answer(conn: socket.socket, done: threading.Event) -> None:
        if part == "headers":
            _trickle(padded, conn, done)
            conn.sendall(BODY)
        else:
            conn.sendall(head + b"\r\n")
            _trickle(BODY, conn, done)

    raw = serve(answer)
    try:
        with pytest.raises(TurnFailed) as caught:
            call_api(raw.server(), "bob", "POST", "/p/bob/api/sessions/s1/chat", {"message": "hi"}, 0.5,
                     delivers=True)
    finally:
        raw.done.set()
    assert caught.value.reason == "delivery_timeout" and caught.value.ambiguous, caught.value.text
    assert "within 0.5s" in caught.value.text


def test_an_answer_announced_over_the_cap_is_not_read_and_fails_the_turn_naming_the_cap(
    serve: Callable[..., RawServer]
) -> None:
    def answer(conn: socket.socket, done: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (300 << 20))
        conn.sendall(b'{"message": {"content": "')
        done.wait(5)  # never sends the rest: a client reading it whole waits, then loses the connection

    raw = serve(answer)
    try:
        with pytest.raises(TurnFailed) as caught:
            call_api(raw.server(), "bob", "POST", "/p/bob/api/sessions/s1/chat", {"message": "hi"}, 30,
                     delivers=True)
    finally:
        raw.done.set()
    failure = caught.value
    assert failure.reason == "unknown" and not failure.ambiguous, failure.text
    assert "more than 64 MiB" in failure.text and "314,572,800 bytes announced" in failure.text, failure.text


def test_an_answer_streamed_past_the_cap_is_cut_off_at_the_cap(serve: Callable[..., RawServer]) -> None:
    sent: list[int] = []

    def answer(conn: socket.socket, done: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        chunk = b" " * (1 << 20)
        for _ in range((ANSWER_MAX_BYTES >> 20) + 8):  # no length: read to the end, which is past the cap
            conn.sendall(chunk)
            sent.append(len(chunk))
        conn.sendall(b"{}")

    raw = serve(answer)
    with pytest.raises(TurnFailed) as caught:
        call_api(raw.server(), "bob", "GET", "/p/bob/api/sessions", None, 60)
    raw.close()
    assert caught.value.reason == "unknown" and "more than 64 MiB" in caught.value.text, caught.value.text
    assert f"over {ANSWER_MAX_BYTES:,} bytes sent" in caught.value.text


def test_an_answer_within_the_cap_and_the_time_is_read_whole(serve: Callable[..., RawServer]) -> None:
    def answer(conn: socket.socket, done: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(BODY), BODY))

    raw = serve(answer)
    assert call_api(raw.server(), "bob", "POST", "/x", {"message": "hi"}, 30, delivers=True)["message"] == {
        "role": "assistant", "content": "late"}
