"""The real hermes-agent CLI (0.19 or newer) against the fake model: CLI turns and enable/disable."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml
from fake_model import FakeModel, ToolCall, last_user_text, text_of
from hermes_fixtures import OfflineRoot, bot_chat_messages

from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.hermes.recorded_edits import SetupError
from hermes_actors.hermes.sessions import find_bot_chat
from hermes_actors.hermes.setup import disable, enable
from hermes_actors.messages import Turn
from hermes_actors.store.hermes_root import is_managed


def test_cli_turn_for_bob_lands_in_his_bot_chat(hermes_cli: str, offline_root: OfflineRoot,
                                                 fake_model: FakeModel) -> None:
    fake_model.script = lambda messages: f"bob here, you said: {last_user_text(messages)}"
    runner = HermesCliRunner(hermes_cli, env=offline_root.env, timeout=180)
    bob = offline_root.home("bob")
    turn = Turn(profile="bob", content="-hello bob", delivery_id="d1", root=offline_root.root, home=bob)

    assert runner.run_turn(turn) == "bob here, you said: -hello bob"
    first = find_bot_chat(bob)
    assert first is not None
    assert bot_chat_messages(bob) == [("user", "-hello bob"), ("assistant", "bob here, you said: -hello bob")]

    # a second turn continues the same session (no new one)
    assert runner.run_turn(Turn(profile="bob", content="again", delivery_id="d2", root=offline_root.root,
                                home=bob)) == "bob here, you said: again"
    assert find_bot_chat(bob) == first
    assert [m for m in bot_chat_messages(bob) if m[0] == "user"] == [("user", "-hello bob"), ("user", "again")]
    assert find_bot_chat(offline_root.home("alice")) is None  # alice's state is untouched

    # a NUL cannot ride a command line: the turn still runs, the NUL shown as U+FFFD
    assert runner.run_turn(Turn(profile="bob", content="nul\x00here", delivery_id="d3", root=offline_root.root,
                                home=bob)) == "bob here, you said: nul\ufffdhere"


def test_enable_then_disable_on_a_real_root(hermes_cli: str, offline_root: OfflineRoot) -> None:
    root = offline_root.root
    bob = offline_root.home("bob")
    (bob / "profile.yaml").write_text("description: a builder\n", encoding="utf-8")
    config_before = (root / "config.yaml").read_text(encoding="utf-8")

    first = enable(root, gateway=True, port=8765, cli=hermes_cli, env={})
    assert any("Bot Chat" in line for line in first.changed)
    for profile in ("default", "alice", "bob"):
        home = offline_root.home(profile)
        assert is_managed(home), profile
        assert find_bot_chat(home) is not None, profile
        assert "hermes-actors" in yaml.safe_load((home / "config.yaml").read_text())["plugins"]["enabled"]
    assert yaml.safe_load((bob / "profile.yaml").read_text())["description"] == "a builder"
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert config["platforms"]["api_server"] == {"enabled": True, "extra": {"host": "127.0.0.1", "port": 8765}}
    assert config["platforms"]["hermes_actors"] == {"enabled": True, "extra": {"host_actors": True}}
    assert config["gateway"]["multiplex_profiles"] is True
    assert config["model"]["provider"] == "custom"  # other keys kept
    assert any("API_SERVER_KEY" in line for line in first.todo)

    sessions = {p: find_bot_chat(offline_root.home(p)) for p in ("default", "alice", "bob")}
    again = enable(root, gateway=True, port=8765, cli=hermes_cli, env={})
    assert again.changed == []
    assert {p: find_bot_chat(offline_root.home(p)) for p in sessions} == sessions

    undone = disable(root)
    assert undone.changed
    for profile in ("default", "alice", "bob"):
        assert not is_managed(offline_root.home(profile)), profile
    assert yaml.safe_load((bob / "profile.yaml").read_text()) == {"description": "a builder"}
    assert yaml.safe_load((root / "config.yaml").read_text()) == yaml.safe_load(config_before)
    assert find_bot_chat(bob) == sessions["bob"]  # conversations are kept
    assert disable(root).changed == []


def test_enable_named_profiles_only_and_keeps_existing_block(hermes_cli: str, offline_root: OfflineRoot) -> None:
    alice = offline_root.home("alice")
    (alice / "profile.yaml").write_text(yaml.safe_dump({"ui_meta": {"hermes-bots": {"title": "Scout"}}}))
    report = enable(offline_root.root, ["alice"], cli=hermes_cli, env={})
    assert not any("profile.yaml" in line for line in report.changed)  # alice's block was there already
    assert yaml.safe_load((alice / "profile.yaml").read_text())["ui_meta"]["hermes-bots"] == {"title": "Scout"}
    assert not is_managed(offline_root.home("bob"))
    disable(offline_root.root, ["alice"])
    assert yaml.safe_load((alice / "profile.yaml").read_text())["ui_meta"]["hermes-bots"] == {"title": "Scout"}
    assert "plugins" not in yaml.safe_load((alice / "config.yaml").read_text())


_CONNECTED = (
    "import json; from gateway.config import load_gateway_config; "
    "print(json.dumps(sorted(str(p.value) for p in load_gateway_config().get_connected_platforms())))"
)


def connected_platforms(offline_root: OfflineRoot) -> list[str]:
    """The platforms the real ``hermes gateway run`` of this root would start (hermes' own config loader)."""
    done = subprocess.run([sys.executable, "-c", _CONNECTED], env=offline_root.env, cwd=offline_root.root,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_hermes_gateway_hosts_the_actors_only_where_enable_gateway_asked_it_to(
    hermes_cli: str, offline_root: OfflineRoot
) -> None:
    root = offline_root.root
    enable(root, cli=hermes_cli, env={})  # the plugin is loaded: the host is `hermes-actors serve`
    assert "hermes_actors" not in connected_platforms(offline_root)  # hermes would enable any "connected" plugin

    enable(root, gateway=True, port=8765, cli=hermes_cli, env={})
    assert "hermes_actors" in connected_platforms(offline_root)

    config = yaml.safe_load((root / "config.yaml").read_text())
    config["platforms"]["hermes_actors"]["enabled"] = False  # the user's own word wins
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert "hermes_actors" not in connected_platforms(offline_root)

    again = enable(root, gateway=True, port=8765, cli=hermes_cli, env={})  # asked again: it hosts again
    assert any("platforms.hermes_actors.enabled = True" in line for line in again.changed)
    assert "hermes_actors" in connected_platforms(offline_root)
    disable(root)  # the block enable wrote goes, its switch turned off by hand or not (a block of the user's own
    # gets its false back: test_disable_puts_the_false_of_the_users_own_block_back)
    assert "hermes_actors" not in yaml.safe_load((root / "config.yaml").read_text()).get("platforms", {})


_ORDER = (
    "import json; from gateway.config import load_gateway_config; "
    "print(json.dumps([str(p.value) for p in load_gateway_config().platforms]))"
)


def platform_order(offline_root: OfflineRoot) -> list[str]:
    """The order the real ``hermes gateway run`` of this root connects its platforms in (hermes' own loader)."""
    done = subprocess.run([sys.executable, "-c", _ORDER], env=offline_root.env, cwd=offline_root.root,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return [p for p in json.loads(done.stdout.strip().splitlines()[-1]) if p in ("api_server", "hermes_actors")]


def test_enable_gateway_lists_the_api_server_before_the_actors_platform(
    hermes_cli: str, offline_root: OfflineRoot
) -> None:
    """Regression (acceptance, hermes 0.19): a `platforms.hermes_actors` block before the `api_server` block that
    enable --gateway appends (the user's own, as here, or one left by an older enable/disable) made hermes, which
    connects platforms in config order, start the actors before the API server: their turns ran on the CLI.
    enable now moves ours after it, keeping the rest of the file."""
    root = offline_root.root
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["platforms"] = {"hermes_actors": {"enabled": False, "extra": {"host_actors": True}}}  # the user's own
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    report = enable(root, gateway=True, port=8765, cli=hermes_cli, env={})
    assert platform_order(offline_root) == ["api_server", "hermes_actors"]
    assert any("moved platforms.hermes_actors after platforms.api_server" in line for line in report.changed), report
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert config["platforms"]["hermes_actors"] == {"enabled": True, "extra": {"host_actors": True}}
    assert config["model"]["provider"] == "custom"  # other keys kept
    assert enable(root, gateway=True, port=8765, cli=hermes_cli, env={}).changed == []  # in order: nothing to move
    disable(root)
    left = yaml.safe_load((root / "config.yaml").read_text())["platforms"]
    assert list(left) == ["hermes_actors"] and left["hermes_actors"]["enabled"] is False  # the user's switch is back


@pytest.mark.parametrize("nested", ["hermes_actors", "api_server"])
def test_enable_gateway_lists_the_api_server_first_when_the_platforms_are_under_gateway(
    hermes_cli: str, offline_root: OfflineRoot, nested: str
) -> None:
    """Regression: hermes 0.19 reads platform blocks under `gateway.platforms` too, before the top level's. With
    the user's `hermes_actors` block there, enable --gateway added `platforms.api_server` at the top level, which
    hermes connected after the actors (their turns waited for it); with the user's `api_server` block there, it
    added a second one at the top level whose port 8642 replaced theirs. enable now edits a block where it is and
    puts ours beside it, in order."""
    root = offline_root.root
    config = yaml.safe_load((root / "config.yaml").read_text())
    user_block = ({"enabled": False, "extra": {"host_actors": True}} if nested == "hermes_actors"
                  else {"enabled": True, "extra": {"host": "127.0.0.1", "port": 9123}})
    config["gateway"] = {"platforms": {nested: user_block}}
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = yaml.safe_load((root / "config.yaml").read_text())

    report = enable(root, gateway=True, cli=hermes_cli, env={})
    assert platform_order(offline_root) == ["api_server", "hermes_actors"]
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert "platforms" not in config, config  # nothing at the top level: both blocks under gateway.platforms
    assert list(config["gateway"]["platforms"]) == ["api_server", "hermes_actors"]
    assert config["gateway"]["platforms"]["hermes_actors"] == {"enabled": True, "extra": {"host_actors": True}}
    port = 9123 if nested == "api_server" else 8642
    assert config["gateway"]["platforms"]["api_server"]["extra"]["port"] == port  # the user's port kept
    assert not any("hermes connects the hermes_actors platform before" in line for line in report.todo), report
    assert enable(root, gateway=True, cli=hermes_cli, env={}).changed == []
    disable(root)
    assert yaml.safe_load((root / "config.yaml").read_text()) == before


def test_enable_gateway_says_what_to_move_when_the_blocks_are_split_between_the_two_maps(
    hermes_cli: str, offline_root: OfflineRoot
) -> None:
    """Our block under gateway.platforms, the user's api_server block at the top level: hermes connects ours first
    and no move inside one map changes that; enable edits each where it is and says what to move."""
    root = offline_root.root
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["gateway"] = {"platforms": {"hermes_actors": {"enabled": True, "extra": {"host_actors": True}}}}
    config["platforms"] = {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": 9123}}}
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    report = enable(root, gateway=True, cli=hermes_cli, env={})
    assert platform_order(offline_root) == ["hermes_actors", "api_server"]  # hermes' own loader: ours first
    assert any(line.startswith(f"{root / 'config.yaml'}: hermes connects the hermes_actors platform before the "
                               "api_server one") for line in report.todo), report.todo
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert list(config["platforms"]) == ["api_server"]  # no second block of ours at the top level
    config["platforms"] = {"hermes_actors": config["gateway"]["platforms"].pop("hermes_actors"), **config["platforms"]}
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))  # the user follows the line
    again = enable(root, gateway=True, cli=hermes_cli, env={})
    assert platform_order(offline_root) == ["api_server", "hermes_actors"]
    assert not any("hermes connects the hermes_actors platform before" in line for line in again.todo), again.todo


_SERVES = (
    "import json, logging; logging.disable(50); from gateway.config import load_gateway_config, Platform; "
    "c = load_gateway_config(); a = c.platforms.get(Platform.API_SERVER); "
    "print(json.dumps({'api': bool(a and a.enabled), 'port': a and a.extra.get('port'), "
    "'mux': bool(c.multiplex_profiles)}))"
)


@pytest.mark.parametrize("extra", [
    {"multiplex_profiles": False},
    {"multiplex_profiles": "no", "gateway": {"multiplex_profiles": True}},
    {"platforms": {"api_server": {"enabled": "no", "extra": {"port": 9123}}}},
    {"platforms": {"api_server": {"enabled": None, "extra": {"port": 9123}}}},
    {"gateway": {"platforms": {"api_server": {"enabled": "off", "extra": {"port": 9123}}}}},
    {"gateway": {"platforms": {"api_server": {"enabled": True, "extra": {"port": 9123}}}},
     "platforms": {"api_server": None}},
], ids=["top-mux-false", "top-mux-no", "api-no", "api-null", "nested-api-off", "top-api-null"])
def test_enable_gateway_switches_on_what_hermes_reads_as_off(
    hermes_cli: str, offline_root: OfflineRoot, extra: dict[str, Any]
) -> None:
    """Regression: enable --gateway left a top-level `multiplex_profiles: false` (read by hermes before the
    gateway.multiplex_profiles it wrote) and an api_server `enabled` of 'no', null or 'off' (only a literal false
    was replaced) as they were: hermes 0.19 then multiplexed nothing or started no API server, and the report said
    nothing; a top-level `api_server: null` beside a real block under gateway.platforms was refused as "not a
    mapping", though hermes skips it. hermes' own loader now serves multiplexed, and disable puts back every value."""
    root = offline_root.root
    config = yaml.safe_load((root / "config.yaml").read_text())
    config.update(extra)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = yaml.safe_load((root / "config.yaml").read_text())

    enable(root, gateway=True, cli=hermes_cli, env={})
    done = subprocess.run([sys.executable, "-c", _SERVES], env=offline_root.env, cwd=root, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    port = 9123 if "9123" in json.dumps(extra) else 8642
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"api": True, "port": port, "mux": True}
    disable(root)
    assert yaml.safe_load((root / "config.yaml").read_text()) == before


def test_enable_gateway_says_when_something_hermes_reads_first_keeps_multiplexing_off(
    hermes_cli: str, offline_root: OfflineRoot
) -> None:
    """gateway.json's multiplex_profiles wins over the gateway.multiplex_profiles enable writes: a "to do" says so."""
    root = offline_root.root
    (root / "gateway.json").write_text(json.dumps({"multiplex_profiles": False}))
    report = enable(root, gateway=True, cli=hermes_cli, env={})
    assert any("the hermes gateway does not multiplex profiles" in line and "gateway.json" in line
               for line in report.todo), report.todo


def test_enable_skips_a_profile_hermes_cannot_run_and_says_why(hermes_cli: str, offline_root: OfflineRoot) -> None:
    upper = offline_root.root / "profiles" / "UPPER"
    upper.mkdir()
    report = enable(offline_root.root, cli=hermes_cli, env={})
    assert not is_managed(upper)  # managed, it would be on the roster and every DM to it would fail at turn time
    assert is_managed(offline_root.home("alice"))
    assert any(line.startswith("UPPER: not enabled") and "lowercase" in line for line in report.todo)
    with pytest.raises(SetupError, match="cannot be run by hermes"):
        enable(offline_root.root, ["UPPER"], cli=hermes_cli, env={})


def test_enable_refuses_to_edit_a_config_yaml_of_nested_aliases(hermes_cli: str, offline_root: OfflineRoot) -> None:
    """Dumping it back would be harmless, but every later reader would expand 10**9 values: it is named, not edited."""
    from test_config import BILLION_LAUGHS

    config = offline_root.root / "config.yaml"
    config.write_text(BILLION_LAUGHS)
    with pytest.raises(SetupError, match="more than 100000 values once its YAML aliases are expanded") as caught:
        enable(offline_root.root, gateway=True, cli=hermes_cli, env={})
    assert str(config) in str(caught.value) and config.read_text() == BILLION_LAUGHS


def test_enable_asks_to_start_the_actors_only_when_no_host_serves_the_root(
    hermes_cli: str, offline_root: OfflineRoot
) -> None:
    from hermes_actors import Gateway

    root = offline_root.root
    first = enable(root, ["alice"], cli=hermes_cli, env={})
    assert f"start the actors: hermes-actors serve --root {root}" in first.todo
    with Gateway(root, runner=lambda turn: "ok", serve_submit=True):
        again = enable(root, cli=hermes_cli, env={})  # a serve runs: its roster takes the change by itself
    assert not any("start the actors" in line for line in again.todo), again.todo


def _dm_on_the_cli(hermes_cli: str, offline_root: OfflineRoot, sender: str, target: str,
                   message: str) -> dict[str, Any]:
    """One DM on the enabled root, its turn on the real hermes CLI; its outcome."""
    from hermes_actors import Gateway

    enable(offline_root.root, cli=hermes_cli, env={})
    runner = HermesCliRunner(hermes_cli, env=offline_root.env, timeout=180)
    with Gateway(offline_root.root, runner=runner) as gw:
        ack = gw.message_agent(sender=sender, target=target, message=message)
        return gw.wait_outcome(ack["delivery_id"], timeout=300)


def test_a_provider_failure_is_retried_once_without_the_dm_twice_in_the_session(
    hermes_cli: str, offline_root: OfflineRoot, fake_model: FakeModel
) -> None:
    """hermes 0.19 stores the DM, then fails (HTTP 500 three times): the retry takes it back first."""
    failing = {"bob": True}

    def script(messages: list[dict[str, object]]) -> str:
        text = last_user_text(messages)  # type: ignore[arg-type]
        if failing["bob"] and "please build" in text:
            failing["bob"] = sum(c.user_text == text for c in fake_model.calls) < 3  # hermes tries 3 times
            raise RuntimeError("provider down")
        return f"bob here, you said: {text}"

    fake_model.script = script  # type: ignore[assignment]
    out = _dm_on_the_cli(hermes_cli, offline_root, "alice", "bob", "please build it")
    assert out is not None and out["status"] == "replied", out
    dm = "Message from 🤖 alice (@alice): please build it"  # the turn's text: the DM under its header
    assert out["reply"] == f"bob here, you said: {dm}"
    bob_calls = [c for c in fake_model.calls if c.profile == "bob"]
    assert len(bob_calls) == 4, [c.user_text for c in bob_calls]  # hermes tried 3 times, then our one retry
    assert bob_calls[-1].user_text == dm  # the model read the DM once, not two copies merged
    assert bot_chat_messages(offline_root.home("bob"), active_only=True) == [
        ("user", dm), ("assistant", f"bob here, you said: {dm}")]


def test_a_failed_turn_whose_model_already_acted_is_not_retried(
    hermes_cli: str, offline_root: OfflineRoot, fake_model: FakeModel
) -> None:
    """The model answered with a tool call, then the provider failed: resending would repeat its work."""
    def script(messages: list[dict[str, object]]) -> object:
        if messages and messages[-1].get("role") == "tool":
            raise RuntimeError("provider down")
        return ToolCall("todo", {"todos": [{"id": "1", "content": "build it", "status": "pending"}]})

    fake_model.script = script  # type: ignore[assignment]
    out = _dm_on_the_cli(hermes_cli, offline_root, "alice", "bob", "please build it")
    assert out is not None and out["status"] == "failed", out
    assert out["reason"] == "provider_server_error", out
    first_calls = [c for c in fake_model.calls if c.profile == "bob" and c.tool_result is None]
    assert len(first_calls) == 1, [c.user_text for c in first_calls]  # one attempt: no retry resent the DM
    assert [m for m in bot_chat_messages(offline_root.home("bob"), active_only=True) if m[0] == "user"] == [
        ("user", "Message from 🤖 alice (@alice): please build it")]


def test_a_bot_chat_turn_shows_the_model_its_teammates_in_the_system_message(
    hermes_cli: str, offline_root: OfflineRoot, fake_model: FakeModel
) -> None:
    """hermes 0.19 has no Bot Mode roster in its prompt; the tool's schema tells the model to pick from it."""
    out = _dm_on_the_cli(hermes_cli, offline_root, "alice", "bob", "who else is here?")
    assert out["status"] == "replied", out
    (call,) = [c for c in fake_model.calls if c.profile == "bob"]
    system = "".join(text_of(m) for m in call.messages if m.get("role") == "system")
    roster = system[system.index("## Bot Mode teammates"):]
    assert "\n- @alice" in roster and "\n- @hermes" in roster and "@bob" not in roster
    assert call.user_text == "Message from 🤖 alice (@alice): who else is here?"  # the DM itself is as sent


def test_a_dm_that_failed_for_good_is_taken_back_so_the_next_turn_does_not_read_it_again(
    hermes_cli: str, offline_root: OfflineRoot, fake_model: FakeModel
) -> None:
    """Regression: a DM reported failed (retryable) stayed in Bot Chat; resent, the model read it twice."""
    healthy = {"now": False}

    def script(messages: list[dict[str, object]]) -> str:
        text = last_user_text(messages)  # type: ignore[arg-type]
        if not healthy["now"]:
            raise RuntimeError("provider down")
        return f"bob here, you said: {text}"

    fake_model.script = script  # type: ignore[assignment]
    failed = _dm_on_the_cli(hermes_cli, offline_root, "alice", "bob", "report please")
    assert (failed["status"], failed["reason"], failed["retryable"]) == ("failed", "provider_server_error", True)
    assert bot_chat_messages(offline_root.home("bob"), active_only=True) == []  # NOT delivered: nothing left
    healthy["now"] = True
    again = _dm_on_the_cli(hermes_cli, offline_root, "alice", "bob", "report please")  # the sender resends
    dm = "Message from 🤖 alice (@alice): report please"
    assert again["reply"] == f"bob here, you said: {dm}"  # read once, not two copies merged
