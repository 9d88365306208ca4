"""The Hermes plugin, loaded by hermes-agent's own plugin loader (needs ``hermes-agent`` importable).

Until the project venv has the ``hermes`` extra, run with the scratch venv:
``PYTHONPATH=$PWD /tmp/hv/bin/python -m pytest -q -p no:cacheprovider tests/test_hermes_plugin.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from roots import RecordingRunner, make_root

from hermes_actors.core.targets import NOT_BOT_CHAT_TEXT
from hermes_actors.gateway import Gateway
from hermes_actors.hermes import plugin
from hermes_actors.hermes.submit import SubmitServer, ping
from hermes_actors.hermes.submit_protocol import SendCall
from hermes_actors.tool import message_agent_tool_schema

# ── pure pieces (no hermes needed) ──────────────────────────────────────────


@pytest.mark.parametrize(
    ("home", "expected"),
    [
        ("/h/root/profiles/alice", ("/h/root", "alice")),
        ("/h/root", ("/h/root", "default")),
        ("/h/profiles", ("/h/profiles", "default")),
    ],
)
def test_root_and_profile(home: str, expected: tuple[str, str]) -> None:
    root, profile = plugin.root_and_profile(Path(home))
    assert (str(root), profile) == expected


@pytest.mark.parametrize(
    ("titles", "expected"),
    [
        (["Bot Chat"], True),
        ([" Bot Chat "], True),
        (["Bot Chat #2", "Bot Chat"], True),  # continued after compression
        (["Bot Chat #3", "Bot Chat #2", "Bot Chat"], True),
        (["Bot Chat #2"], False),  # a numbered title that is no continuation
        (["Scratch"], False),
        (["Bot Chat #2", "Scratch"], False),
        ([], False),
    ],
)
def test_is_bot_chat_lineage(titles: list[str], expected: bool) -> None:
    assert plugin.is_bot_chat_lineage(titles) is expected


def test_importing_the_plugin_loads_none_of_the_actors() -> None:
    """hermes imports the plugin in every process that enables it: the import stays light (no pykka, no actors),
    though the tool's Bot Chat rule uses the one session-name constant of ``hermes_actors.records``."""
    import os
    import subprocess

    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    probe = ("import sys; import hermes_actors.hermes.plugin; "
             "print(sorted(m for m in ('pykka', 'actors', 'hermes_actors.records') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("raw", "hop"), [(None, 0), ("", 0), ("3", 3), (" 2 ", 2), ("x", 0), ("-1", 0), ("5000", 0)])
def test_parse_hop(raw: str | None, hop: int) -> None:
    assert plugin.parse_hop(raw) == hop


def test_a_hosted_send_that_fails_after_it_was_handed_over_is_never_told_not_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review apismall): in the process hosting the actors, a ``TimeoutError`` of the send (its
    Dispatcher did not answer in time; the request waits in its mailbox and may still be queued) fell through to
    the handler's catch-all, "the message was NOT sent": a resend could deliver it twice."""
    from hermes_actors.hermes import host

    class Unanswered:
        def message_agent(self, **_: Any) -> dict[str, Any]:
            raise TimeoutError("DispatcherActor did not answer SendRequest within 30s")

    monkeypatch.setattr(plugin, "active_profile_home", lambda: tmp_path / "root" / "profiles" / "alice")
    monkeypatch.setattr(plugin, "session_lineage_titles", lambda db, session: ["Bot Chat"])
    monkeypatch.setattr(host, "hosted_gateway", lambda root: Unanswered())
    result = json.loads(plugin.message_agent_handler({"target": "bob", "message": "hi"}, session_id="s-bot"))
    assert result["reason"] == "unknown" and "NOT sent" not in result["error"], result
    assert result["error"].startswith("The gateway did not answer in time (TimeoutError: DispatcherActor"), result
    assert "Do NOT resend" in result["error"], result


# ── through hermes' plugin loader ───────────────────────────────────────────

_NO_HERMES = "hermes-agent is not installed in this venv (the `hermes` extra; or run with /tmp/hv/bin/python)"


def _plugin_manager() -> Any:
    """A fresh hermes PluginManager (the global one may have run already)."""
    return pytest.importorskip("hermes_cli.plugins", reason=_NO_HERMES).PluginManager()


@pytest.fixture
def hermes_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A managed root whose alice enables our plugin, hermes pointed at alice, the entry point visible."""
    pytest.importorskip("hermes_cli.plugins", reason=_NO_HERMES)
    root = make_root(tmp_path)
    alice = root / "profiles" / "alice"
    (alice / "config.yaml").write_text(yaml.safe_dump({"plugins": {"enabled": ["hermes-actors"]}}))
    dist = tmp_path / "ep" / "hermes_actors_under_test-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hermes-actors-under-test\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[hermes_agent.plugins]\nhermes-actors = hermes_actors.hermes.plugin\n")
    monkeypatch.syspath_prepend(str(dist.parent))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HERMES_HOME", str(alice))
    monkeypatch.delenv(plugin.HOP_ENV, raising=False)
    yield root


@pytest.fixture
def loaded(hermes_root: Path) -> Any:
    """hermes' plugin manager after discovery."""
    manager = _plugin_manager()
    manager.discover_and_load()
    return manager


def _sessions(home: Path) -> dict[str, str]:
    """Sessions in ``home/state.db``: a Bot Chat, its continuation after compression, and two others."""
    from hermes_state import SessionDB

    db = SessionDB(db_path=home / "state.db")
    try:
        db.create_session("s-bot", source="cli")
        db.set_session_title("s-bot", "Bot Chat")  # titles are unique: one Bot Chat per profile
        db.end_session("s-bot", "compression")
        db.create_session("s-bot-now", source="cli", parent_session_id="s-bot")
        db.set_session_title("s-bot-now", "Bot Chat #2")  # hermes' title for the continued Bot Chat
        db.create_session("s-other", source="cli")
        db.set_session_title("s-other", "Scratch")
        db.create_session("s-old", source="cli")
        db.set_session_title("s-old", "Old")
        db.end_session("s-old", "compression")
        db.create_session("s-cont", source="cli", parent_session_id="s-old")
        db.set_session_title("s-cont", "Bot Chat #3")  # numbered, but continues no Bot Chat
    finally:
        db.close()
    return {"bot": "s-bot", "bot_continued": "s-bot-now", "other": "s-other", "cont": "s-cont"}


def _call(session_id: str, **args: Any) -> dict[str, Any]:
    from tools.registry import registry

    text = registry.dispatch("message_agent", args, task_id="t1", session_id=session_id, user_task=None)
    assert isinstance(text, str)
    answer: dict[str, Any] = json.loads(text)
    return answer


def test_hermes_loads_the_plugin_from_its_entry_point(loaded: Any) -> None:
    from tools.registry import registry

    state = loaded._plugins["hermes-actors"]
    assert state.enabled and state.error is None
    assert state.tools_registered == ["message_agent"]
    entry = registry.get_entry("message_agent")
    assert entry.toolset == plugin.TOOLSET
    assert entry.schema == message_agent_tool_schema()["function"]
    model_sees = registry.get_definitions({"message_agent"})
    assert model_sees == [message_agent_tool_schema()]


def test_a_profile_without_the_plugin_enabled_does_not_load_it(
    hermes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_HOME", str(hermes_root / "profiles" / "bob"))  # bob's config enables nothing
    manager = _plugin_manager()
    manager.discover_and_load()
    state = manager._plugins["hermes-actors"]
    assert not state.enabled and "not enabled" in (state.error or "")


def test_a_session_that_is_not_bot_chat_is_refused_with_the_seed_text(loaded: Any, hermes_root: Path) -> None:
    ids = _sessions(hermes_root / "profiles" / "alice")
    rec = SendRecorder()
    with SubmitServer(hermes_root, send=rec):
        for session in (ids["other"], ids["cont"], "no-such-session", ""):
            answer = _call(session, target="bob", message="hi")
            assert answer["error"] == NOT_BOT_CHAT_TEXT, session
    assert rec.calls == []


class SendRecorder:
    def __init__(self) -> None:
        self.calls: list[SendCall] = []

    def __call__(self, call: SendCall) -> dict[str, Any]:
        self.calls.append(call)
        return {"status": "queued", "delivery_id": "d1" * 16, "to": f"@{call.target}"}


def test_a_bot_chat_call_is_submitted_to_the_host_as_the_active_profile(
    loaded: Any, hermes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _sessions(hermes_root / "profiles" / "alice")
    rec = SendRecorder()
    with SubmitServer(hermes_root, send=rec):
        first = _call(ids["bot"], target="bob", message="hi")
        monkeypatch.setenv(plugin.HOP_ENV, "3")  # a turn our runner started for a hop-3 delivery
        nested = _call(ids["bot_continued"], target="carol", message="deeper")
    assert first == {"status": "queued", "delivery_id": "d1" * 16, "to": "@bob"}
    assert nested["to"] == "@carol"
    # the session goes along: the host adds the hop of a warm turn it runs there (hermes runs it elsewhere)
    assert [(c.sender, c.target, c.message, c.hop, c.session) for c in rec.calls] == [
        ("alice", "bob", "hi", 1, ids["bot"]),
        ("alice", "carol", "deeper", 4, ids["bot_continued"]),
    ]


def test_without_a_host_the_tool_refuses_runtime_offline(loaded: Any, hermes_root: Path) -> None:
    ids = _sessions(hermes_root / "profiles" / "alice")
    answer = _call(ids["bot"], target="bob", message="hi")
    assert answer["reason"] == "runtime_offline"
    assert f"hermes-actors serve --root {hermes_root}" in answer["error"]


def test_in_the_hosting_process_the_dm_reaches_the_gateway(
    loaded: Any, hermes_root: Path, gateways: list[Gateway]
) -> None:
    ids = _sessions(hermes_root / "profiles" / "alice")
    rec = RecordingRunner()
    gw = Gateway(hermes_root, runner=rec, serve_submit=True)
    gateways.append(gw)
    gw.start()
    with plugin.turn_hop_scope(ids["bot"], 2):  # a warm turn of a hop-2 delivery, run in this process
        ack = _call(ids["bot"], target="bob", message="hello bob")
    assert ack["status"] == "queued" and ack["to"] == "@bob"
    assert gw.wait_outcome(ack["delivery_id"], timeout=30)["text"] == "Reply from @bob: ok: hello bob"
    turn = rec.entered[0]
    assert turn.sender == "alice" and turn.hop == 3
    assert turn.content.startswith("Message from 🤖 ") and turn.content.endswith("(@alice): hello bob")


def test_a_broken_call_is_a_tool_error_not_a_crash(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_args: Any) -> list[str]:
        raise OSError("disk on fire")

    monkeypatch.setattr(plugin, "session_lineage_titles", explode)
    answer = _call("s", target="bob", message="hi")
    assert "OSError: disk on fire" in answer["error"] and "NOT sent" in answer["error"]


def test_the_platform_hosts_one_gateway_per_root(
    loaded: Any, hermes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.config import PlatformConfig
    from gateway.platform_registry import platform_registry

    monkeypatch.setenv("HERMES_HOME", str(hermes_root))
    config = PlatformConfig(enabled=True, extra={"runner": "demo"})
    first = platform_registry.create_adapter(plugin.PLATFORM_NAME, config)
    second = platform_registry.create_adapter(plugin.PLATFORM_NAME, config)  # a second profile of the root

    async def lifecycle() -> list[Any]:
        seen = [await first.connect(), await second.connect(), ping(hermes_root)]
        await first.disconnect()
        seen.append(ping(hermes_root))
        await second.disconnect()
        seen.append(ping(hermes_root))
        return seen

    up1, up2, pong, after_one, after_both = asyncio.run(lifecycle())
    assert up1 is True and up2 is True
    assert pong is not None and pong["root"] == str(hermes_root.resolve())
    assert after_one is not None and after_one["pid"] == pong["pid"]  # still hosted: one profile remains
    assert after_both is None
    assert sys.modules.get("hermes_actors.hermes.plugin_platform") is not None


def test_the_platform_says_its_gateway_is_stopping_once_hermes_stop_or_our_disconnect_began(
    loaded: Any, hermes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a warm turn cut at the stop of the hermes gateway hosting us asks (gateway_process.own_gateway_stopping):
    hermes' stop began (its runner's stop task, before it closes the API server), or our disconnect did."""
    from types import SimpleNamespace

    from gateway.config import PlatformConfig
    from gateway.platform_registry import platform_registry

    from hermes_actors.hermes import plugin_platform
    from hermes_actors.hermes.gateway_process import own_gateway_stopping

    monkeypatch.setenv("HERMES_HOME", str(hermes_root))
    adapter = platform_registry.create_adapter(plugin.PLATFORM_NAME, PlatformConfig(enabled=True,
                                                                                   extra={"runner": "demo"}))
    runner = SimpleNamespace(_stop_task=None)
    adapter.gateway_runner = runner  # as hermes sets it on every plugin platform
    seen: list[bool] = []
    real_release = plugin_platform.release_host

    def release(root: Path, timeout: float) -> bool:
        seen.append(own_gateway_stopping())  # our disconnect runs: the gateway stops
        return real_release(root, timeout)

    monkeypatch.setattr(plugin_platform, "release_host", release)

    async def lifecycle() -> None:
        assert await adapter.connect()
        seen.append(own_gateway_stopping())
        runner._stop_task = object()  # Ctrl-C: hermes' stop() made its task
        seen.append(own_gateway_stopping())
        runner._stop_task = None
        await adapter.disconnect()
        seen.append(own_gateway_stopping())  # released: no turn of ours is left to cut

    asyncio.run(lifecycle())
    assert seen == [False, True, True, False]


def test_the_hosted_gateway_holds_its_turns_from_hermes_stop_on_never_on_our_disconnect_alone(
    loaded: Any, hermes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (real-hermes soak): hermes' stop closes its API server and drains, and only then disconnects our
    platform; until then the Gateway it hosts started the queued turns (on the CLI) and a wake. The hosted Gateway's
    ``host_stopping`` is hermes' own stop (``own_gateway_stop_begun``): its turn gates hold from then on. Our
    disconnect alone is no such sign (a multiplexing gateway may drop one profile's platform and go on): the hold
    is for good, so only hermes' stop, which is final, may start it."""
    from types import SimpleNamespace

    from gateway.config import PlatformConfig
    from gateway.platform_registry import platform_registry

    from hermes_actors.hermes import plugin_platform
    from hermes_actors.hermes.gateway_process import own_gateway_stop_begun, own_gateway_stopping
    from hermes_actors.hermes.host import hosted_gateway

    monkeypatch.setenv("HERMES_HOME", str(hermes_root))
    adapter = platform_registry.create_adapter(plugin.PLATFORM_NAME, PlatformConfig(enabled=True,
                                                                                   extra={"runner": "demo"}))
    runner = SimpleNamespace(_stop_task=None)
    adapter.gateway_runner = runner  # as hermes sets it on every plugin platform
    seen: list[Any] = []
    real_release = plugin_platform.release_host

    def release(root: Path, timeout: float) -> bool:
        seen.append(("disconnect", own_gateway_stopping(), own_gateway_stop_begun()))
        return real_release(root, timeout)

    monkeypatch.setattr(plugin_platform, "release_host", release)

    async def lifecycle() -> None:
        assert await adapter.connect()
        gw = hosted_gateway(hermes_root)
        assert gw is not None and gw.host_stopping is own_gateway_stop_begun
        seen.append(own_gateway_stop_begun())
        runner._stop_task = object()  # SIGTERM: hermes' stop() made its task
        seen.append(own_gateway_stop_begun())
        runner._stop_task = None
        await adapter.disconnect()

    asyncio.run(lifecycle())
    assert seen == [False, True, ("disconnect", True, False)]


def test_a_platform_that_cannot_host_says_why_in_hermes_logs(
    loaded: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside ``hermes gateway run`` our loguru records reach hermes' ``logging`` (its gateway.log)."""
    import logging

    from gateway.config import PlatformConfig
    from gateway.platform_registry import platform_registry

    missing = tmp_path / "no-such-root"
    config = PlatformConfig(enabled=True, extra={"runner": "demo", "root": str(missing)})
    adapter = platform_registry.create_adapter(plugin.PLATFORM_NAME, config)
    with caplog.at_level(logging.INFO, logger="hermes_plugins"):
        assert asyncio.run(adapter.connect()) is False
    # under hermes_plugins.*: the prefix hermes' gateway.log filter passes
    errors = [r for r in caplog.records
              if r.name.startswith("hermes_plugins.hermes_actors") and r.levelno == logging.ERROR]
    assert errors, "the failure to host was logged nowhere hermes writes"
    assert "could not host the actors of" in errors[0].getMessage() and str(missing) in errors[0].getMessage()


def test_a_bot_chat_model_request_carries_the_teammate_roster_and_no_other_does(loaded: Any, hermes_root: Path) -> None:
    """hermes 0.19 has no Bot Mode roster in its prompt; the schema tells the model to pick from it."""
    from hermes_actors.hermes.teammates import HEADING

    def apply(request: dict[str, Any], session_id: str) -> dict[str, Any]:  # as hermes' request middleware does
        answers = loaded.invoke_middleware("llm_request", request=request, original_request=request,
                                           session_id=session_id, platform="cli", api_call_count=1)
        return answers[-1]["request"] if answers else request

    assert plugin.teammates_middleware in loaded._middleware.get("llm_request", [])
    ids = _sessions(hermes_root / "profiles" / "alice")  # hermes runs as alice (HERMES_HOME)
    request = {"model": "fake", "messages": [{"role": "system", "content": "You are alice."},
                                             {"role": "user", "content": "Message from 🤖 bob (@bob): hi"}]}
    for session in (ids["bot"], ids["bot_continued"]):
        out = apply(request, session)
        system = out["messages"][0]["content"]
        assert system.startswith("You are alice.\n\n" + HEADING)
        assert "- @bob" in system and "- @carol" in system and "- @hermes" in system and "@alice" not in system
        assert out["messages"][1] == request["messages"][1]  # the DM itself is untouched
    for session in (ids["other"], ids["cont"], "no-such-session", ""):
        assert apply(request, session) == request
