"""Warm turns through a real ``hermes gateway run`` API server (hermes-agent 0.19) against the fake model."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_model import BROKEN_STREAM, FakeModel, last_user_text
from hermes_fixtures import OfflineRoot, bot_chat_messages

from actors.testkit import await_condition
from hermes_actors.hermes.gateway_api import read_gateway_api_server
from hermes_actors.hermes.select import default_runner, probe_api_server
from hermes_actors.hermes.sessions import find_bot_chat
from hermes_actors.hermes.setup import enable
from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner
from hermes_actors.messages import Turn

API_KEY = "test-api-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HermesGateway:
    """A ``hermes gateway run`` on the root (its API server serves warm turns) until stopped."""

    def __init__(self, proc: subprocess.Popen[bytes], env: dict[str, str]) -> None:
        self.proc = proc
        self.env = env

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def hermes_gateway(hermes_cli: str, offline_root: OfflineRoot, tmp_path: Path) -> Iterator[HermesGateway]:
    """``enable --gateway`` on the root, then ``hermes gateway run`` until the test ends."""
    env = {**os.environ, **offline_root.env, "API_SERVER_KEY": API_KEY}
    enable(offline_root.root, gateway=True, port=free_port(), cli=hermes_cli, env=env)
    with open(tmp_path / "gateway.log", "w") as log:
        proc = subprocess.Popen([hermes_cli, "gateway", "run"], env=env, cwd=offline_root.root,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    gateway = HermesGateway(proc, env)
    try:
        yield gateway
    finally:
        gateway.stop()


def warm_runner(offline_root: OfflineRoot, gateway: HermesGateway, hermes_cli: str) -> tuple[WarmOrCliRunner, Any]:
    """The root's default runner once the gateway's API server answers (warm turns), and that server."""
    server = read_gateway_api_server(offline_root.root, yaml.safe_load((offline_root.root / "config.yaml").read_text()),
                                     gateway.env).server()
    assert server is not None, "enable --gateway configured the API server"
    await_condition(lambda: probe_api_server(server), timeout=90, interval=0.5,
                    message="the hermes gateway's API server answering")
    runner = default_runner(offline_root.root, env=gateway.env, cli=hermes_cli)
    assert isinstance(runner, WarmOrCliRunner), "an answering API server makes the default runner warm"
    return runner, server


def test_warm_turns_through_the_gateway_then_the_cli_once_it_stopped_all_in_bot_chat(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    runner, server = warm_runner(offline_root, hermes_gateway, hermes_cli)

    bob = offline_root.home("bob")
    expected = find_bot_chat(bob)  # enable created it
    assert expected is not None
    turn = Turn(profile="bob", content="warm hello", delivery_id="w1", root=offline_root.root)
    assert runner.run_turn(turn) == "fake reply to: warm hello"
    assert runner.warm.session_id("bob", "Bot Chat") == expected  # it went through the API server
    assert runner.run_turn(Turn(profile="bob", content="warm again", delivery_id="w2",
                                root=offline_root.root)) == "fake reply to: warm again"
    assert find_bot_chat(bob) == expected

    hermes_gateway.stop()  # the hermes gateway goes away; our host does not
    assert not probe_api_server(server)
    cold = Turn(profile="bob", content="cold now", delivery_id="w3", root=offline_root.root, home=bob)
    assert runner.run_turn(cold) == "fake reply to: cold now"  # the CLI ran it, in the same session
    assert find_bot_chat(bob) == expected


def test_a_provider_failure_on_a_warm_turn_is_a_failure_retried_once_not_a_reply(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    """Regression: hermes' API server hands a failed turn's error text back as the answer (HTTP 200), so the DM
    was 'replied' with "API call failed after 3 retries: HTTP 500 …", never retried, and left in Bot Chat."""
    from hermes_actors import Gateway

    def script(messages: list[dict[str, Any]]) -> str:
        text = last_user_text(messages)
        if "please build" in text and sum(c.user_text == text for c in fake_model.calls) <= 3:
            raise RuntimeError("provider down")  # hermes' own three tries fail; ours succeeds
        return f"bob here: {text.split(': ', 1)[-1]} (I hit a rate limit earlier, all fine now)"

    fake_model.script = script  # type: ignore[assignment]
    runner, _ = warm_runner(offline_root, hermes_gateway, hermes_cli)
    with Gateway(offline_root.root, runner=runner, config={"bot_mode": {"wake_sender": False}}) as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="please build it")
        out = gw.wait_outcome(ack["delivery_id"], timeout=300)
        # a reply that merely mentions a provider problem stays a reply (hermes stored it as bob's answer)
        other = gw.wait_outcome(gw.message_agent(sender="alice", target="bob", message="how was it?")["delivery_id"],
                                timeout=300)
    assert (out["status"], out["reply"]) == ("replied", "bob here: please build it (I hit a rate limit earlier, "
                                                        "all fine now)"), out
    assert [c.user_text.endswith("please build it") for c in fake_model.calls if c.profile == "bob"][:4] == [True] * 4
    assert (other["status"], other["reply"]) == ("replied", "bob here: how was it? (I hit a rate limit earlier, "
                                                            "all fine now)"), other
    users = [m for m in bot_chat_messages(offline_root.home("bob"), active_only=True) if m[0] == "user"]
    assert [text.endswith("please build it") for _, text in users].count(True) == 1  # taken back before the retry


def test_a_warm_turn_whose_model_stream_breaks_is_a_failure_not_a_reply(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    """Regression (review): hermes gives up on a broken stream and its API server hands back "API call failed
    after 3 retries: Provider returned an empty stream …" as the answer; that text classifies as no known
    reason, so the DM was 'replied' with it, the sender woken "Reply from @bob: API call failed …", and the
    DM left unanswered in bob's Bot Chat. A CLI turn reports the same failure as failed."""
    from hermes_actors import Gateway

    def script(messages: list[dict[str, Any]]) -> str:
        text = last_user_text(messages)
        return BROKEN_STREAM if "break it" in text else f"bob here: {text.split(': ', 1)[-1]}"

    fake_model.script = script  # type: ignore[assignment]
    runner, _ = warm_runner(offline_root, hermes_gateway, hermes_cli)
    with Gateway(offline_root.root, runner=runner, config={"bot_mode": {"wake_sender": False}}) as gw:
        broken = gw.wait_outcome(gw.message_agent(sender="alice", target="bob", message="break it")["delivery_id"],
                                 timeout=300)
        after = gw.wait_outcome(gw.message_agent(sender="alice", target="bob", message="all well?")["delivery_id"],
                                timeout=300)
    assert broken["status"] == "failed", broken
    assert "API call failed after" in broken["error"], broken
    assert (after["status"], after["reply"]) == ("replied", "bob here: all well?"), after
    users = [text for role, text in bot_chat_messages(offline_root.home("bob"), active_only=True) if role == "user"]
    assert not any(text.endswith("break it") for text in users), users  # the failed DM is taken back


def test_a_warm_turn_reported_timed_out_keeps_the_bot_busy_until_hermes_answers_it(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    """Regression: the turn timeout reported the DM and the bot's next DM ran beside it in the same Bot Chat
    (hermes went on running the first: the model saw two requests of bob at once, and both DMs merged).
    Journey review: meanwhile `status` showed bob `idle`; it shows him `busy` now. And the late answer stays in
    bob's Bot Chat, never passed on: the first DM's outcome stays `delivery_timeout`, as its text says."""
    from hermes_actors import Gateway
    from hermes_actors.ops.status import live_status

    def bob_state(gw: Gateway) -> str:
        return {p["profile"]: p["state"] for p in live_status(gw)["profiles"]}["bob"]

    hold = fake_model.hold(lambda call: call.profile == "bob" and call.user_text.endswith("slow one"))
    runner, _ = warm_runner(offline_root, hermes_gateway, hermes_cli)
    config = {"bot_mode": {"wake_sender": False, "turn_timeout_seconds": 5}}
    with Gateway(offline_root.root, runner=runner, config=config) as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="slow one")
        assert "delivery_id" in ack, ack
        first = ack["delivery_id"]
        hold.wait_entered(120)
        timed_out = gw.wait_outcome(first, timeout=60)
        assert timed_out["reason"] == "delivery_timeout"
        # hermes goes on with it (not "stopped"), and what it answers then is not passed on
        assert "it may still complete, but a later answer is not passed on" in timed_out["error"], timed_out
        second = gw.wait_outcome(gw.message_agent(sender="default", target="bob", message="second")["delivery_id"],
                                 timeout=60)
        assert (second["status"], second["reason"]) == ("failed", "target_busy"), second
        assert "still running an earlier turn in the hermes gateway" in second["error"]
        assert bob_state(gw) == "busy"
        hold.release()
        fake_model.wait_for(lambda call: call.profile == "bob" and call.user_text.endswith("slow one"),
                            timeout=60, answered=True)
        # once hermes answered the first, our chat request closes and the bot serves again
        await_condition(lambda: runner.warm.in_flight("bob") is None, timeout=60,
                        message="hermes' answer to the timed-out turn reached our open request")
        assert bob_state(gw) == "idle"
        assert gw.wait_outcome(first, timeout=5) == timed_out  # the late answer replaced nothing
        [*_, (asked_role, asked), (answer_role, _answer)] = bot_chat_messages(offline_root.home("bob"))
        assert (asked_role, answer_role) == ("user", "assistant") and asked.endswith("slow one")  # stored there
        third = gw.wait_outcome(gw.message_agent(sender="default", target="bob", message="third")["delivery_id"],
                                timeout=60)
    assert third["status"] == "replied", third
    assert fake_model.overlaps == []  # never two requests of bob at once


def test_warm_turns_tell_an_empty_answer_and_a_failure_after_a_tool_call_from_a_reply(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    """Regressions: hermes' warning for an empty answer came back as bob's reply; a provider failure after a
    tool call was 'replied' with the error text (the stored tool-calling step looked like an answer)."""
    from fake_model import ToolCall

    from hermes_actors import Gateway

    def script(messages: list[dict[str, Any]]) -> Any:
        text = last_user_text(messages)
        if text.endswith("empty please"):
            return ""
        if text.endswith("tool then fail"):
            if messages[-1].get("role") == "tool":
                raise RuntimeError("provider down")
            return ToolCall("todo", {"todos": [{"id": "1", "content": "build it", "status": "pending"}]})
        return f"bob got: {text}"

    fake_model.script = script  # type: ignore[assignment]
    runner, _ = warm_runner(offline_root, hermes_gateway, hermes_cli)
    with Gateway(offline_root.root, runner=runner, config={"bot_mode": {"wake_sender": False}}) as gw:
        empty = gw.wait_outcome(gw.message_agent(sender="alice", target="bob", message="empty please")["delivery_id"],
                                timeout=300)
        failed = gw.wait_outcome(gw.message_agent(sender="alice", target="bob", message="tool then fail")
                                 ["delivery_id"], timeout=300)
    assert empty["status"] == "silent", empty
    assert (failed["status"], failed["reason"]) == ("failed", "provider_server_error"), failed
    first_steps = [c for c in fake_model.calls if c.user_text.endswith("tool then fail") and c.tool_result is None]
    assert len(first_steps) == 1  # the model already acted: no retry resent the DM


def test_a_dm_lost_with_a_killed_gateway_is_taken_back_before_the_bots_next_turn(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    """Regression: the gateway died mid-turn; its DM stayed unanswered in Bot Chat and hermes merged it into the
    bot's next turn — whose answer went to the next DM's sender alone (the first sender was told "ambiguous")."""
    from hermes_actors import Gateway

    hold = fake_model.hold(lambda call: call.profile == "bob" and call.user_text.endswith("the slow one"))
    runner, _ = warm_runner(offline_root, hermes_gateway, hermes_cli)
    try:
        with Gateway(offline_root.root, runner=runner, config={"bot_mode": {"wake_sender": False}}) as gw:
            first = gw.message_agent(sender="alice", target="bob", message="the slow one")["delivery_id"]
            hold.wait_entered(120)
            os.killpg(hermes_gateway.proc.pid, signal.SIGKILL)  # the gateway dies mid-turn
            hermes_gateway.proc.wait(30)
            assert gw.wait_outcome(first, timeout=120)["status"] == "ambiguous"
            left = bot_chat_messages(offline_root.home("bob"), active_only=True)
            assert left[-1] == ("user", "Message from 🤖 alice (@alice): the slow one"), left  # hermes stored it
            second = gw.wait_outcome(gw.message_agent(sender="default", target="bob", message="second thing")
                                     ["delivery_id"], timeout=300)
    finally:
        hold.release()
    assert second["status"] == "replied", second
    last = [c for c in fake_model.calls if c.profile == "bob"][-1]
    said = [str(m.get("content")) for m in last.messages if m.get("role") == "user"]
    assert not any("the slow one" in text for text in said), said  # the dead turn's DM is not read again
    assert said[-1].endswith("second thing")
