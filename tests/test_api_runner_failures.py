"""What a warm turn's sender is told when the API server fails: never "not delivered" once the turn was sent.

A local stand-in for the hermes API server (127.0.0.1) lists one Bot Chat session and then
answers the chat request as each test needs: it drops the connection, never answers, or is
not there at all. The turn's message may reach the agent once the chat request is sent, so
only a failure before that is ``runtime_offline`` (retryable, retried once); after it the
outcome is ``ambiguous`` and the chat is never posted twice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from roots import make_root, send_dm

from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed
from hermes_actors.cli.render import status_text
from hermes_actors.hermes.api_client import ApiServer
from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.messages import Turn
from hermes_actors.ops.status import live_status


class FakeApi:
    """Serves ``GET /p/<p>/api/sessions``; ``chat`` decides what a chat POST gets ("drop", "hang", "500" or
    "answer": ``answer`` as the assistant message, after ``on_chat()`` ran, where hermes stores the turn)."""

    def __init__(self, chat: str, answer: str = "", on_chat: Callable[[], None] | None = None) -> None:
        self.chat = chat
        self.answer = answer
        self.on_chat = on_chat
        self.chats: list[dict[str, Any]] = []
        self.release = threading.Event()  # ends a hanging chat at teardown
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"data": [{"id": "s1", "title": "Bot Chat", "started_at": 1}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                api.chats.append(json.loads(self.rfile.read(length)))
                self.close_connection = True
                if api.chat == "hang":
                    api.release.wait(30)
                if api.chat == "answer":  # hermes' API server: HTTP 200 with the turn's final_response
                    if api.on_chat is not None:
                        api.on_chat()
                    body = json.dumps({"session_id": "s1", "message": {"role": "assistant",
                                                                       "content": api.answer}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                if api.chat == "500":  # what hermes' API server answers when the agent raised
                    body = b"500 Internal Server Error\n\nServer got itself in trouble"
                    self.send_response(500)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                # "drop": no answer at all; the connection closes as the handler returns

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-api", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def dropping_api() -> Iterator[FakeApi]:
    api = FakeApi("drop")
    yield api
    api.close()


@pytest.fixture
def hanging_api() -> Iterator[FakeApi]:
    api = FakeApi("hang")
    yield api
    api.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = int(server.server_address[1])
    server.server_close()
    return port


def turn() -> Turn:
    return Turn(profile="bob", content="hello bob", delivery_id="d1", session="Bot Chat")


def test_a_connection_lost_after_the_chat_was_sent_is_ambiguous(dropping_api: FakeApi) -> None:
    runner = ApiRunner(ApiServer("127.0.0.1", dropping_api.port, "k" * 16), timeout=30)
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(turn())
    assert caught.value.ambiguous
    assert "was lost during @bob's Bot Chat turn" in caught.value.text
    assert dropping_api.chats == [{"message": "hello bob"}]


def test_a_chat_that_does_not_answer_in_time_is_ambiguous_with_delivery_timeout(hanging_api: FakeApi) -> None:
    runner = ApiRunner(ApiServer("127.0.0.1", hanging_api.port, "k" * 16), timeout=0.5, connect_timeout=30)
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(turn())
    assert caught.value.ambiguous and caught.value.reason == "delivery_timeout"
    assert "may still be running there" in caught.value.text


def test_a_server_that_is_not_there_is_runtime_offline_and_not_ambiguous() -> None:
    runner = ApiRunner(ApiServer("127.0.0.1", closed_port(), "k" * 16), timeout=5, connect_timeout=5)
    runner._sessions[("bob", "Bot Chat")] = "s1"  # straight to the chat request: its connect is refused
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(turn())
    assert not caught.value.ambiguous and caught.value.reason == "runtime_offline"
    assert "is not reachable" in caught.value.text


def test_through_the_gateway_a_dropped_chat_is_ambiguous_and_posted_once(
    tmp_path: Path, dropping_api: FakeApi, gateways: list[Gateway]
) -> None:
    runner = ApiRunner(ApiServer("127.0.0.1", dropping_api.port, "k" * 16), timeout=30)
    gw = Gateway(make_root(tmp_path), runner=runner, config={"bot_mode": {"wake_sender": False}})
    gateways.append(gw)
    gw.start()
    ack = gw.message_agent(sender="alice", target="bob", message="hello bob")
    out = gw.wait_outcome(ack["delivery_id"], timeout=60)
    assert (out["status"], out["retryable"]) == ("ambiguous", False)
    assert "do not resend" in out["error"]
    assert len(dropping_api.chats) == 1  # no automatic retry posted it again


def test_status_shows_a_bot_busy_while_hermes_still_runs_its_timed_out_warm_turn(
    tmp_path: Path, hanging_api: FakeApi, gateways: list[Gateway]
) -> None:
    """Regression (journey review): while hermes still ran a warm turn reported `delivery_timeout`, `status` showed
    the bot `idle` (its state came from the DMs in flight only), yet every DM to it was refused `target_busy`. It is
    `busy` now, from the state that refusal is decided by, until hermes ends that turn."""
    runner = ApiRunner(ApiServer("127.0.0.1", hanging_api.port, "k" * 16), timeout=60)
    gw = Gateway(make_root(tmp_path), runner=runner,
                 config={"bot_mode": {"wake_sender": False, "turn_timeout_seconds": 0.5}})
    gateways.append(gw)
    gw.start()
    assert gw.wait_outcome(send_dm(gw, "HANG warm"), timeout=30)["reason"] == "delivery_timeout"
    assert gw.wait_outcome(send_dm(gw, "next"), timeout=30)["reason"] == "target_busy"  # hermes still runs the first

    def bob() -> dict[str, Any]:
        [row] = [p for p in live_status(gw)["profiles"] if p["profile"] == "bob"]
        return row

    assert (bob()["state"], bob()["queued"]) == ("busy", 0)
    assert "  @bob              busy (a turn given up on still runs in the hermes gateway: DMs to it fail " \
           "target_busy)\n" in status_text(live_status(gw))
    assert {p["profile"]: p["state"] for p in live_status(gw)["profiles"]}["alice"] == "idle"  # only bob's turn runs
    hanging_api.release.set()  # hermes ends the turn (its connection closes unanswered)
    await_condition(lambda: bob()["state"] == "idle", timeout=30, interval=0.05,
                    message="bob idle once hermes ended the timed-out turn")


def test_an_unreachable_server_is_retried_once_and_fails_runtime_offline(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    runner = ApiRunner(ApiServer("127.0.0.1", closed_port(), "k" * 16), timeout=5, connect_timeout=5)
    gw = Gateway(make_root(tmp_path), runner=runner, config={"bot_mode": {"wake_sender": False}})
    gateways.append(gw)
    gw.start()
    ack = gw.message_agent(sender="alice", target="bob", message="hello bob")
    out = gw.wait_outcome(ack["delivery_id"], timeout=60)
    assert (out["status"], out["reason"], out["retryable"]) == ("failed", "runtime_offline", True)


def test_a_runner_raising_an_ambiguous_turn_failed_is_never_retried(tmp_path: Path, gateways: list[Gateway]) -> None:
    calls: list[int] = []

    def runner(t: Turn) -> str:
        calls.append(t.attempt)
        raise TurnFailed("503 service unavailable after the request was sent", ambiguous=True)

    gw = Gateway(make_root(tmp_path), runner=runner, config={"bot_mode": {"wake_sender": False}})
    gateways.append(gw)
    gw.start()
    ack = gw.message_agent(sender="alice", target="bob", message="hi")
    out = gw.wait_outcome(ack["delivery_id"], timeout=30)
    assert (out["status"], out["retryable"], out["reason"]) == ("ambiguous", False, "provider_server_error")
    assert calls == [1]  # provider_server_error alone would earn one retry


@pytest.mark.parametrize(("config", "reason"), [
    ("{}", "missing_config"),
    ("model: {provider: custom, default: fake-model}", "provider_server_error"),
    # a provider and a local base_url without a name: hermes 0.19 asks the server for its model and runs it
    ("model: {provider: custom, base_url: 'http://127.0.0.1:9/v1'}", "provider_server_error"),
])
def test_a_500_for_a_bot_without_a_model_says_so_as_missing_config(tmp_path: Path, config: str, reason: str) -> None:
    """On warm turns a bot with no model of its own failed `provider_server_error` (retryable, retried) with
    hermes' bare "500 ... Server got itself in trouble"; the CLI path says `missing_config`. It is told as that,
    and only then (a model section hermes completes itself is a model)."""
    api = FakeApi("500")
    try:
        home = tmp_path / "bob"
        home.mkdir()
        (home / "config.yaml").write_text(config, encoding="utf-8")
        runner = ApiRunner(ApiServer("127.0.0.1", api.port, "k" * 16), timeout=30)
        with pytest.raises(TurnFailed) as caught:
            runner.run_turn(Turn(profile="bob", content="hello bob", delivery_id="d1", session="Bot Chat",
                                 home=home))
    finally:
        api.close()
    assert caught.value.reason == reason, caught.value.text
    assert ("has no model" in caught.value.text) == (reason == "missing_config")
    assert "answered 500 on @bob's Bot Chat turn" in caught.value.text


@pytest.mark.parametrize(("answer", "stored", "status"), [
    # hermes gave up and stored no answer: its text is the failure, worded as it may be (none of these names a
    # reason; before, a text not starting the way hermes words "API call failed after …" was the bot's reply)
    ("Codex response remained incomplete after 3 continuation attempts", None, "failed"),
    ("Response truncated due to output length limit", None, "failed"),
    ("API call failed after 3 retries: Provider returned an empty stream with no finish_reason (possible upstream "
     "error or malformed SSE response).", None, "failed"),
    # a genuine answer that reads like an error is the reply: hermes stored it
    ("API call failed after 3 retries: that is what the build log says, HTTP 500 and all.",
     "API call failed after 3 retries: that is what the build log says, HTTP 500 and all.", "replied"),
    ("All good here.", "All good here.", "replied"),
])
def test_a_warm_turn_is_a_reply_only_when_hermes_stored_an_answer(
    tmp_path: Path, answer: str, stored: str | None, status: str
) -> None:
    """Regression (review): a warm turn whose model stream broke was 'replied' with hermes' error text, the sender
    woken "Reply from @dave: API call failed …", because a text naming no known reason was taken for the answer
    before state.db was asked. state.db decides first, as the exit status does on CLI turns."""
    session_db = pytest.importorskip("hermes_state", reason="needs hermes-agent (the [hermes] extra)").SessionDB
    home = tmp_path / "bob"
    home.mkdir()
    db = session_db(db_path=home / "state.db")
    try:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "Bot Chat")
    finally:
        db.close()

    def hermes_stores_the_turn() -> None:
        db = session_db(db_path=home / "state.db")
        try:
            db.append_message("s1", "user", "hello bob")
            if stored is not None:
                db.append_message("s1", "assistant", stored)
        finally:
            db.close()

    api = FakeApi("answer", answer=answer, on_chat=hermes_stores_the_turn)
    try:
        runner = ApiRunner(ApiServer("127.0.0.1", api.port, "k" * 16), timeout=30)
        try:
            got = ("replied", runner.run_turn(Turn(profile="bob", content="hello bob", delivery_id="d1",
                                                   session="Bot Chat", home=home)))
        except TurnFailed as failure:
            got = ("failed", failure.text)
            assert (failure.reason, failure.ambiguous) == ("unknown", False), failure  # as on a CLI turn
    finally:
        api.close()
    assert got[0] == status, got
    assert answer in got[1], got  # the reply, or the failure naming hermes' text
