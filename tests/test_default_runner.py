"""The default runner is the real Hermes: choice at start, no-CLI failure, the hop our hermes runners carry."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from roots import AnsweringApi, LogCapture, RecordingRunner, make_root

from hermes_actors import Gateway
from hermes_actors.core.wake import wake_id
from hermes_actors.demo.bots import DemoRunner
from hermes_actors.errors import TurnFailed
from hermes_actors.facade.options import is_real_hermes
from hermes_actors.hermes import plugin
from hermes_actors.hermes.api_client import ApiServer
from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.hermes.install import ChatFlags
from hermes_actors.hermes.select import default_runner
from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner
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
    # review: it said "not found or not working at hermes … or pass cli=...": the path it tried, and both
    # spellings of naming the executable (a CLI user needs --cli PATH)
    assert out["error"] == (f"hermes CLI not found: no executable {str(tmp_path / 'no-such-hermes')!r} "
                            "($HERMES_ACTORS_HERMES_CLI, looked up on PATH) — install hermes-agent (pip install "
                            "'hermes-actors[hermes]'), or name the executable: --cli PATH (hermes-actors commands) "
                            "or cli='PATH' (Python)"), out
    # auto wakes alice with that failure; her wake turn fails the same way: not a DM outcome, and tried again
    # after its back-off (runtime_offline: it never began), so it is not counted failed (given up) yet
    wake = gw.wait_outcome(wake_id(ack["delivery_id"]), timeout=20)
    assert wake["reason"] == "runtime_offline"
    stats = gw.stats()
    assert (stats["wakes_sent"], stats["wakes_retried"], stats["wakes_failed"], stats["settled"]) == (1, 1, 0, 1)


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


def _warm_config(port: int) -> dict[str, Any]:
    """A root's config.yaml naming a hermes API server for warm turns on ``port`` (as ``enable --gateway`` does)."""
    return {"platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": port,
                                                                    "key": "k" * 32}}},
            "gateway": {"multiplex_profiles": True}}


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections to it are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("host", ["serve", "the hermes gateway"])
def test_warm_turns_off_at_the_start_are_a_warning_unless_hosted_in_the_gateway(tmp_path: Path, host: str) -> None:
    """Regression (acceptance review): a host started with warm turns configured while the hermes API server did
    not answer said so at INFO (seen only with -v): its turns silently ran as CLI turns. Inside the gateway, whose
    own API server starts beside the actors, it stays an info line."""
    if host == "the hermes gateway":
        (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")
    with LogCapture("INFO") as logs:
        runner = default_runner(tmp_path, _warm_config(_closed_port()), cli="/bin/sh", env={})
    assert isinstance(runner, WarmOrCliRunner)
    said = logs.matching("warm turns are off at the start: the hermes API server", "does not answer",
                         "run with the hermes CLI /bin/sh", "hermes gateway run")
    levels = [r["level"].name for r in logs.records if "hermes API server" in r["message"]]
    if host == "serve":
        assert len(said) == 1 and levels == ["WARNING"], logs.lines
        assert runner.turns_now()["turns_via"] == "cli"
    else:
        assert said == [] and levels == ["INFO"], logs.lines
        assert logs.matching("wait up to 30 s from now for the hermes API server", "this hermes gateway is starting")
        assert runner.turns_now()["turns_via"] == "starting"  # its turns wait for the server (a warning if never)


_KEY = "k" * 32
_MUX = {"gateway": {"multiplex_profiles": True}}


@pytest.mark.parametrize(("config", "gateway_json", "dotenv", "env", "warm"), [
    # hermes 0.19, multiplexing profiles, reads these from the root's .env only: set in the environment alone,
    # it starts no API server
    (_MUX, None, "", {"API_SERVER_ENABLED": "true", "API_SERVER_KEY": _KEY}, False),
    (_MUX, None, f"API_SERVER_ENABLED=true\nAPI_SERVER_KEY={_KEY}\n", {}, True),
    # the legacy gateway.json is read under config.yaml
    (_MUX, {"platforms": {"api_server": {"enabled": True, "extra": {"key": _KEY}}}}, "", {}, True),
    # a top-level api_server: block's enabled wins over platforms.api_server's
    ({**_MUX, "platforms": {"api_server": {"enabled": True}}, "api_server": {"enabled": False}}, None, "",
     {"API_SERVER_KEY": _KEY}, False),
], ids=["environment-only", "dotenv", "gateway-json", "top-level-off"])
def test_turns_wait_for_an_api_server_only_where_hermes_starts_one(
    tmp_path: Path, config: dict[str, Any], gateway_json: dict[str, Any] | None, dotenv: str, env: dict[str, str],
    warm: bool
) -> None:
    """Regression: hermes-actors read the API server's settings otherwise than hermes 0.19 does (the environment's
    variables while multiplexing, no gateway.json, no top-level api_server:): the gateway hosting the actors had
    its turns wait 30 s for a server hermes never starts (or never tried one it starts). Now turns wait for one
    only where hermes starts it, and go to the CLI at once where it starts none."""
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")  # hosted in it
    if gateway_json is not None:
        gateway_json["platforms"]["api_server"]["extra"]["port"] = _closed_port()
        (tmp_path / "gateway.json").write_text(json.dumps(gateway_json), encoding="utf-8")
    (tmp_path / ".env").write_text(dotenv + f"API_SERVER_PORT={_closed_port()}\n", encoding="utf-8")
    with LogCapture("INFO") as logs:
        runner = default_runner(tmp_path, config, cli="/bin/sh", env=env)
    if warm:
        assert isinstance(runner, WarmOrCliRunner) and runner.turns_now()["turns_via"] == "starting", logs.lines
    else:
        assert isinstance(runner, HermesCliRunner), runner
        assert logs.matching("starts no API server", "turns run with the hermes CLI /bin/sh", "doctor"), logs.lines


class _Recording:
    """Stands in for one path of a WarmOrCliRunner: records the turns it runs, answers its name."""

    def __init__(self, name: str) -> None:
        self.name, self.turns, self.server, self.cli = name, [], f"{name}-server", f"{name}-cli"

    def run_turn(self, turn: Turn) -> str:
        self.turns.append(turn.delivery_id)
        return self.name

    def in_flight(self, profile: str) -> str | None:
        return None


def test_hosted_in_the_gateway_a_turn_runs_warm_once_its_api_server_answers(tmp_path: Path) -> None:
    """Regression (acceptance, hermes 0.19, `platforms.hermes_actors` listed before `api_server`): the runner chosen
    as our platform connected found the gateway's own API server not up yet and ran every DM of the next 30-40 s as
    a cold CLI turn, though the server answered a second later."""
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")
    port = _closed_port()
    runner = default_runner(tmp_path, _warm_config(port), cli="/bin/sh", env={})  # our platform connects first
    api = AnsweringApi(port=port)  # then the gateway's API server
    try:
        assert isinstance(runner, WarmOrCliRunner)
        runner.warm, runner.cli = _Recording("warm"), _Recording("cli")  # type: ignore[assignment]
        assert runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)) == "warm"
    finally:
        api.close()
    assert runner.cli.turns == []  # type: ignore[attr-defined]


def test_the_no_cli_failure_names_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path given (cli=/--cli) wins over $HERMES_ACTORS_HERMES_CLI; without either, beside python and PATH."""
    from hermes_actors.hermes.install import cli_not_found_text

    monkeypatch.setenv("HERMES_ACTORS_HERMES_CLI", "/env/hermes")
    given = HermesCliRunner(str(tmp_path / "given"))
    with pytest.raises(TurnFailed) as info:
        given.flags()
    assert info.value.reason == "runtime_offline"
    assert info.value.text == cli_not_found_text(str(tmp_path / "given"))
    assert f"no executable {str(tmp_path / 'given')!r} (the path or name given" in info.value.text
    assert "'/env/hermes' ($HERMES_ACTORS_HERMES_CLI" in cli_not_found_text()
    monkeypatch.delenv("HERMES_ACTORS_HERMES_CLI")
    assert "no `hermes` beside python (" in cli_not_found_text() and "nor on PATH" in cli_not_found_text()
