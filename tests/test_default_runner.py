"""The default runner is the real Hermes: choice at start, no-CLI failure, the hop our hermes runners carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, make_root

from hermes_actors import Gateway
from hermes_actors.core.wake import wake_id
from hermes_actors.demo.bots import DemoRunner
from hermes_actors.facade.options import is_real_hermes
from hermes_actors.hermes import plugin
from hermes_actors.hermes.api_client import ApiServer
from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.hermes.install import ChatFlags
from hermes_actors.messages import Turn


def test_runner_names_and_which_runners_are_the_real_hermes(tmp_path: Path) -> None:
    assert isinstance(Gateway(tmp_path, runner="demo").runner, DemoRunner)
    assert Gateway(tmp_path).runner is None  # chosen at start()
    with pytest.raises(ValueError, match="unknown runner 'hermes-ish'"):
        Gateway(tmp_path, runner="hermes-ish")
    assert is_real_hermes(HermesCliRunner("/bin/sh", flags=ChatFlags()))
    assert is_real_hermes(ApiRunner(ApiServer("127.0.0.1", 9, "k" * 16)))
    assert not is_real_hermes(DemoRunner()) and not is_real_hermes(RecordingRunner())


def test_without_a_hermes_cli_turns_fail_runtime_offline_saying_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gateways: list[Gateway]
) -> None:
    monkeypatch.setenv("HERMES_ACTORS_HERMES_CLI", str(tmp_path / "no-such-hermes"))
    gw = Gateway(make_root(tmp_path))
    gateways.append(gw)
    gw.start()  # no CLI is not a start failure
    assert isinstance(gw.runner, HermesCliRunner) and not gw.runner.cli_found
    ack = gw.message_agent(sender="alice", target="bob", message="hi")
    out = gw.wait_outcome(ack["delivery_id"], timeout=20)
    assert (out["status"], out["reason"]) == ("failed", "runtime_offline")
    assert "hermes CLI not found" in out["error"] and "pip install 'hermes-actors[hermes]'" in out["error"]
    # auto wakes alice with that failure; her wake turn fails the same way: counted, not a DM outcome
    wake = gw.wait_outcome(wake_id(ack["delivery_id"]), timeout=20)
    assert wake["reason"] == "runtime_offline"
    stats = gw.stats()
    assert (stats["wakes_sent"], stats["wakes_failed"], stats["settled"]) == (1, 1, 1)


def test_a_cli_turn_gets_its_hop_in_the_environment(tmp_path: Path) -> None:
    runner = HermesCliRunner("/bin/sh", flags=ChatFlags(no_restore_cwd=True))
    env = runner.environment(Turn(profile="bob", content="x", delivery_id="d1", root=tmp_path, hop=3))
    assert env[plugin.HOP_ENV] == "3"
    assert plugin.parse_hop(env[plugin.HOP_ENV]) + 1 == 4  # what the plugin makes of it for a DM from this turn


def test_a_warm_turn_marks_its_session_with_the_hop_while_chat_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ApiRunner(ApiServer("127.0.0.1", 9, "k" * 16))
    runner._sessions[("bob", "Bot Chat")] = "sess-1"
    seen: list[Any] = []

    def fake_call(handle: str, method: str, path: str, body: Any, timeout: float, **_: Any) -> Any:
        seen.append((path, plugin.turn_hop("sess-1"), plugin.dm_hop(1, "sess-1")))
        return {"session_id": "sess-1", "message": {"role": "assistant", "content": "hi"}}

    monkeypatch.setattr(runner, "_call", fake_call)
    monkeypatch.delenv(plugin.HOP_ENV, raising=False)
    assert runner.run_turn(Turn(profile="bob", content="x", delivery_id="d1", hop=2)) == "hi"
    assert seen == [("/p/bob/api/sessions/sess-1/chat", 2, 3)]  # a DM from the turn is hop 3
    assert plugin.turn_hop("sess-1") is None and plugin.dm_hop(1, "sess-1") == 1  # the scope ended with the call
