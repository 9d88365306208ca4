"""Pure parts of the hermes-agent integration: flag detection, reply reading, error mapping, discovery."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.api_client import ApiServer
from hermes_actors.hermes.api_runner import pick_titled_session
from hermes_actors.hermes.cli_output import clean_reply, failure_of, reply_or_failure, session_id_of
from hermes_actors.hermes.cli_runner import MAX_ARGV_TEXT_BYTES, HermesCliRunner
from hermes_actors.hermes.gateway_api import GatewayApiServer, gateway_api_server
from hermes_actors.hermes.install import ChatFlags, cli_profile_name, parse_chat_help, profile_home, root_of_home
from hermes_actors.hermes.retry import (
    RESEND,
    REWIND,
    SKIP,
    RetryPlan,
    plan_retry,
    plan_take_back,
    prepare_bot_chat_retry,
    take_back_unanswered,
)
from hermes_actors.local.runners import CliResult
from hermes_actors.messages import Turn

# The options block of `hermes chat --help` from hermes-agent 0.19.0 (abridged, verbatim lines).
HELP_0_19 = """usage: hermes chat [-h] [-q QUERY] [--image IMAGE] [-m MODEL] [-t TOOLSETS]
                   [--resume SESSION_ID] [--no-restore-cwd]
                   [--continue [SESSION_NAME]] [--worktree] [--accept-hooks]
                   [--pass-session-id] [--ignore-user-config] [--ignore-rules]
  -Q, --quiet           Quiet mode for programmatic use: suppress banner,
  --no-restore-cwd      Don't cd into a resumed session's recorded working
  --ignore-user-config  Ignore ~/.hermes/config.yaml and fall back to built-in
"""
HELP_NEWER = HELP_0_19 + """  --in DIR              Run in DIR
  --create-if-missing   Create the titled session when missing
  --query-file FILE     Read the query from FILE
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HELP_0_19, ChatFlags(no_restore_cwd=True)),
        (HELP_NEWER, ChatFlags(query_file=True, create_if_missing=True, in_dir=True, no_restore_cwd=True)),
        ("", ChatFlags()),
        ("  --input X  --ignore-rules --query-files", ChatFlags()),  # only whole option words count
    ],
)
def test_parse_chat_help(text: str, expected: ChatFlags) -> None:
    assert parse_chat_help(text) == expected


def make_runner(flags: ChatFlags) -> HermesCliRunner:
    return HermesCliRunner("/bin/sh", flags=flags)


def test_argv_for_0_19_passes_text_as_one_query_value() -> None:
    turn = Turn(profile="bob", content="-starts with a dash", delivery_id="d1")
    argv = make_runner(ChatFlags(no_restore_cwd=True)).argv(turn, None)
    assert argv[1:] == ["-p", "bob", "chat", "-c", "Bot Chat", "-Q", "--no-restore-cwd",
                        "--query=-starts with a dash"]


def test_argv_for_newer_release_uses_its_flags(tmp_path) -> None:
    flags = ChatFlags(query_file=True, create_if_missing=True, in_dir=True, no_restore_cwd=True)
    argv = make_runner(flags).argv(Turn(profile="bob", content="x", delivery_id="d1"), tmp_path / "q")
    assert argv[1:] == ["-p", "bob", "chat", "--in", "~", "-c", "Bot Chat", "--create-if-missing", "-Q",
                        "--no-restore-cwd", "--query-file", str(tmp_path / "q")]


def test_text_too_long_for_the_command_line_fails_clearly(tmp_path) -> None:
    runner = make_runner(ChatFlags(no_restore_cwd=True))
    turn = Turn(profile="bob", content="é" * (MAX_ARGV_TEXT_BYTES // 2 + 1), delivery_id="d1", home=tmp_path)
    with pytest.raises(TurnFailed, match="at most 102400 bytes") as caught:
        runner.run_turn(turn)
    assert caught.value.reason == "unknown"


@pytest.mark.parametrize("name", ["Bob", "a b", "-x", "é", ""])
def test_profile_names_hermes_rejects(name: str) -> None:
    with pytest.raises(ValueError, match="lowercase"):
        cli_profile_name(name)


def test_profile_home_round_trip(tmp_path) -> None:
    assert profile_home(tmp_path, "default") == tmp_path
    assert profile_home(tmp_path, "bob") == tmp_path / "profiles" / "bob"
    assert root_of_home(tmp_path / "profiles" / "bob") == tmp_path
    assert root_of_home(tmp_path) == tmp_path


@pytest.mark.parametrize(
    ("stdout", "reply"),
    [
        ("hello\n", "hello"),
        ("↪ restored workspace dir: /tmp/x\nhello\nworld\n", "hello\nworld"),
        ("  \x1b[2m⚠ tirith security scanner enabled but not available — x\x1b[0m\n\nreply\n", "reply"),
        ("⚠ session's recorded dir is gone (/gone); staying in /h\nok\n", "ok"),
        ("line one\n↪ restored workspace dir: /x\n", "line one\n↪ restored workspace dir: /x"),  # only leading
        ("", ""),
    ],
)
def test_clean_reply(stdout: str, reply: str) -> None:
    assert clean_reply(stdout) == reply


def test_session_id_on_stderr() -> None:
    assert session_id_of("\nsession_id: 20260101_000000_abcdef\n") == "20260101_000000_abcdef"
    assert session_id_of("nothing") == ""


@pytest.mark.parametrize(
    ("stdout", "stderr", "reason", "fragment"),
    [
        ("", "hermes-refusal-reason: SESSION_NOT_OWNED\n", "target_busy", "open on another surface"),
        ("", "session already has a live owner", "target_busy", "NOT delivered"),
        ("No session found matching 'Bot Chat'.\nUse 'hermes sessions list'\n", "", "runtime_offline",
         "was not found"),
        ("", "Error: HTTP 429 Too Many Requests\n", "provider_rate_limit", "429"),
        ("", "Error: 401 invalid api key\n", "provider_auth_or_access", "invalid api key"),
        ("", "something odd\n", "unknown", "something odd"),
        # hermes-agent 0.19, provider answering 500 three times: the error is on stdout, chatter on stderr
        ("API call failed after 3 retries: HTTP 500: fake script failed\n",
         "Session 20261205_201250_583d2b found but has no messages. Starting fresh.\n"
         "session_id: 20261205_201250_583d2b\n", "provider_server_error", "HTTP 500"),
        ("API call failed after 3 retries: HTTP 429: slow down\n", "\nsession_id: x\n", "provider_rate_limit",
         "after 3 retries"),
        ("API call failed after 3 retries: HTTP 500: down\n↻ Resumed session 20261205_205910_3a7158 \"Bot Chat\" "
         "(3 user messages, 8 total messages)\n", "", "provider_server_error", "HTTP 500: down"),
    ],
)
def test_failure_mapping(stdout: str, stderr: str, reason: str, fragment: str) -> None:
    failure = failure_of(CliResult(stdout, stderr, 1), "bob")
    assert failure.reason == reason
    assert fragment in failure.text
    assert "session_id" not in failure.text and "Starting fresh" not in failure.text
    assert "Resumed session" not in failure.text


# hermes-agent 0.19's CLI on a profile with no model: its setup wizard, whose commands lack `-p NAME`
_WIZARD = """It looks like Hermes isn't configured yet -- no API keys or providers found.
  Run:  hermes setup
  Configure Hermes using environment variables or config commands:
    hermes config set model.provider custom
    hermes config set model.default your-model-name
"""


@pytest.mark.parametrize(("config", "says"), [
    ("{}\n", "@carol has no model: {home}/config.yaml names none, so hermes cannot run its turns (set model.default "
              "and its provider there) — hermes exited with status 1: It looks like Hermes isn't configured yet -- "
              "no API keys or providers found."),
    # a profile that names a model: hermes' own words stand (no guess at what else is missing)
    ("model: {provider: custom, default: m}\n", "hermes exited with status 1: It looks like Hermes isn't configured"),
], ids=["no-model", "a-model"])
def test_a_cli_turn_of_a_bot_without_a_model_names_its_config_yaml_as_a_warm_turn_does(
    tmp_path: Path, config: str, says: str
) -> None:
    """Regression (journey review): a CLI turn of a bot with no model failed `missing_config` with hermes' setup
    wizard, `hermes config set model.provider custom …` without `-p carol`: run as printed, it edits the root
    profile. The warm path names the bot's own config.yaml (api_runner); the CLI path now says the same."""
    home = tmp_path / "profiles" / "carol"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(config, encoding="utf-8")
    cli = tmp_path / "hermes"
    cli.write_text(f"#!/bin/sh\ncat <<'EOF'\n{_WIZARD}EOF\nexit 1\n", encoding="utf-8")
    cli.chmod(0o700)
    flags = ChatFlags(query_file=True, create_if_missing=True, in_dir=True, no_restore_cwd=True)
    runner = HermesCliRunner(str(cli), flags=flags, dm_base=tmp_path, timeout=60)
    turn = Turn(profile="carol", content="hi", delivery_id="c" * 32, root=tmp_path, home=home)
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(turn)
    assert caught.value.reason == "missing_config"
    assert caught.value.text.startswith(says.format(home=home)), caught.value.text
    assert ("hermes config set" in caught.value.text) == (says.startswith("hermes exited")), caught.value.text


def test_exit_zero_without_reply_but_with_error_is_a_failure() -> None:
    with pytest.raises(TurnFailed, match="overloaded") as caught:
        reply_or_failure(CliResult("", "Error: provider overloaded\n\nsession_id: x\n", 0), "bob")
    assert caught.value.reason == "provider_server_error"
    assert reply_or_failure(CliResult("", "\nsession_id: x\n", 0), "bob") == ""  # silence stays silence


def test_pick_titled_session_follows_hermes_resolution() -> None:
    rows = [
        {"id": "a", "title": "Bot Chat", "started_at": 1},
        {"id": "b", "title": "Bot Chat #2", "started_at": 2},
        {"id": "c", "title": "Bot Chat #3", "started_at": 3},
        {"id": "d", "title": "Bot Chatter", "started_at": 4},
    ]
    assert pick_titled_session(rows, "Bot Chat") == "c"
    assert pick_titled_session(rows[:1] + rows[3:], "Bot Chat") == "a"
    assert pick_titled_session(rows[3:], "Bot Chat") is None


KEY = "k" * 32


MUX = {"gateway": {"multiplex_profiles": True}}
ON = {"platforms": {"api_server": {"enabled": True}}}


@pytest.mark.parametrize(
    ("config", "legacy", "dotenv", "environ", "expected"),
    [
        # config.yaml's block, the key from the environment (the adapter's own fallback, read multiplexing or not)
        ({**MUX, "platforms": {"api_server": {"enabled": True, "extra": {"port": 9000}}}}, {}, {},
         {"API_SERVER_KEY": KEY}, ApiServer("127.0.0.1", 9000, KEY)),
        # the environment's port does not replace extra's when only the block enables the platform
        ({**MUX, "platforms": {"api_server": {"enabled": True, "extra": {"host": "0.0.0.0", "key": KEY,
                                                                          "port": 9000}}}}, {}, {},
         {"API_SERVER_PORT": "9001"}, ApiServer("127.0.0.1", 9000, KEY)),
        # ... it is the fallback when extra has none
        ({**MUX, **ON}, {}, {}, {"API_SERVER_KEY": KEY, "API_SERVER_PORT": "9001"}, ApiServer("127.0.0.1", 9001, KEY)),
        ({"gateway": {"multiplex_profiles": True, "platforms": {"api_server": {"enabled": True}}}}, {}, {},
         {"API_SERVER_KEY": KEY}, ApiServer("127.0.0.1", 8642, KEY)),
        # multiplexing off: /p/<profile>/ would be ignored, so no warm turns
        (ON, {}, {}, {"API_SERVER_KEY": KEY}, None),
        ({**MUX, **ON}, {}, {}, {"API_SERVER_KEY": "short"}, None),
        ({**MUX, **ON}, {}, {}, {"API_SERVER_KEY": "your_api_key_here"}, None),  # a placeholder: hermes refuses it
        ({**MUX, "platforms": {"api_server": {"enabled": False}}}, {}, {}, {}, None),
        (ON, {}, {}, {"API_SERVER_KEY": KEY, "GATEWAY_MULTIPLEX_PROFILES": "1"}, ApiServer("127.0.0.1", 8642, KEY)),
        (ON, {}, {"GATEWAY_MULTIPLEX_PROFILES": "1"}, {"API_SERVER_KEY": KEY}, ApiServer("127.0.0.1", 8642, KEY)),
        # multiplexing: the variables that enable it, and their port and host, are read from the root's .env only
        (MUX, {}, {}, {"API_SERVER_KEY": KEY, "API_SERVER_ENABLED": "true"}, None),
        (MUX, {}, {"API_SERVER_KEY": KEY, "API_SERVER_PORT": "9002"}, {}, ApiServer("127.0.0.1", 9002, KEY)),
        (MUX, {}, {"API_SERVER_ENABLED": "yes"}, {"API_SERVER_KEY": KEY, "API_SERVER_PORT": "9003"},
         ApiServer("127.0.0.1", 9003, KEY)),  # enabled by .env: key and port from the process (the adapter's own)
        ({**MUX, "platforms": {"api_server": {"enabled": True, "extra": {"port": 9000}}}}, {},
         {"API_SERVER_KEY": KEY, "API_SERVER_PORT": "9004"}, {}, ApiServer("127.0.0.1", 9004, KEY)),
        # .env is loaded over the environment hermes started with
        ({**MUX, **ON}, {}, {"API_SERVER_PORT": "9005"}, {"API_SERVER_KEY": KEY, "API_SERVER_PORT": "9006"},
         ApiServer("127.0.0.1", 9005, KEY)),
        # the legacy gateway.json is the base layer, config.yaml's keys win over it
        (MUX, {"platforms": {"api_server": {"enabled": True, "extra": {"key": KEY, "port": 9007}}}}, {}, {},
         ApiServer("127.0.0.1", 9007, KEY)),
        ({**MUX, "platforms": {"api_server": {"extra": {"port": 9008}}}},
         {"platforms": {"api_server": {"enabled": True, "extra": {"key": KEY, "port": 9007}}}}, {}, {},
         ApiServer("127.0.0.1", 9008, KEY)),
        ({**MUX, "platforms": {"api_server": {"enabled": False}}},
         {"platforms": {"api_server": {"enabled": True, "extra": {"key": KEY}}}}, {}, {}, None),
        (ON, {"multiplex_profiles": True}, {}, {"API_SERVER_KEY": KEY}, ApiServer("127.0.0.1", 8642, KEY)),
        # gateway.json's multiplex_profiles wins over config.yaml's nested one (hermes reads that one only when unset)
        ({**MUX, **ON}, {"multiplex_profiles": False}, {}, {"API_SERVER_KEY": KEY}, None),
        # a top-level api_server: block's enabled wins over the platform blocks'
        ({**MUX, **ON, "api_server": {"enabled": False}}, {}, {}, {"API_SERVER_KEY": KEY}, None),
        ({**MUX, "platforms": {"api_server": {"enabled": False}}, "api_server": {"enabled": "on"}}, {}, {},
         {"API_SERVER_KEY": KEY}, ApiServer("127.0.0.1", 8642, KEY)),
        ({**MUX, **ON, "api_server": {"port": 9009}}, {}, {}, {"API_SERVER_KEY": KEY},
         ApiServer("127.0.0.1", 8642, KEY)),  # only its enabled is read
    ],
)
def test_the_api_server_hermes_starts(
    config: dict, legacy: dict, dotenv: dict, environ: dict, expected: ApiServer | None
) -> None:
    assert gateway_api_server(config, legacy, dotenv, environ).server() == expected


@pytest.mark.parametrize(
    ("config", "dotenv", "environ", "says"),
    [
        (MUX, {}, {"API_SERVER_KEY": KEY, "API_SERVER_ENABLED": "true"},
         "API_SERVER_ENABLED and API_SERVER_KEY are set in the environment but not in the root's .env"),
        (MUX, {"API_SERVER_ENABLED": "false"}, {"API_SERVER_KEY": KEY}, "API_SERVER_KEY is set in the environment"),
        ({**MUX, **ON, "api_server": {"enabled": False}}, {}, {"API_SERVER_KEY": KEY},
         "config.yaml's top-level api_server: block says enabled: false"),
        (MUX, {}, {"API_SERVER_ENABLED": "false"}, ""),  # nothing asks for one
        ({}, {}, {"API_SERVER_KEY": KEY}, ""),  # not multiplexing: hermes reads the environment, and starts it
        ({**MUX, **ON}, {}, {"API_SERVER_KEY": KEY}, ""),  # it starts
    ],
)
def test_why_hermes_starts_no_api_server(config: dict, dotenv: dict, environ: dict, says: str) -> None:
    planned = gateway_api_server(config, {}, dotenv, environ)
    assert (says in planned.why) if says else planned.why == "", planned


def test_an_api_server_enabled_without_a_usable_key_is_a_missing_key() -> None:
    assert gateway_api_server({**MUX, **ON}, {}, {}, {}) == GatewayApiServer(True, "127.0.0.1", 8642, "", True)
    assert gateway_api_server({**MUX, **ON}, {}, {}, {}).key_missing
    assert not gateway_api_server({**MUX, **ON}, {}, {}, {"API_SERVER_KEY": KEY}).key_missing
    assert not gateway_api_server(ON, {}, {}, {}).key_missing  # not multiplexing: no warm turns to miss


@pytest.mark.parametrize(("config", "dotenv", "linked", "expected"), [
    # hermes follows a symlinked .env (dotfiles, a secrets mount): so do we
    (MUX, f"API_SERVER_ENABLED=true\nAPI_SERVER_KEY={KEY}\n", True, ApiServer("127.0.0.1", 8642, KEY)),
    (MUX, f"API_SERVER_ENABLED=true\nAPI_SERVER_KEY={KEY}\n", False, ApiServer("127.0.0.1", 8642, KEY)),
    # GATEWAY_MULTIPLEX_PROFILES is read from the environment python-dotenv filled: a comment after it is cut ...
    ({}, f"GATEWAY_MULTIPLEX_PROFILES=true  # multiplex\nAPI_SERVER_KEY={KEY}\n", False,
     ApiServer("127.0.0.1", 8642, KEY)),
    ({}, f"GATEWAY_MULTIPLEX_PROFILES='true' # x\nAPI_SERVER_KEY={KEY}\n", True, ApiServer("127.0.0.1", 8642, KEY)),
    ({}, f"MUX=on\nGATEWAY_MULTIPLEX_PROFILES=${{MUX}}\nAPI_SERVER_KEY={KEY}\n", False,
     ApiServer("127.0.0.1", 8642, KEY)),
    # ... while the API server's own variables keep hermes' secret-scope reading, comment and all
    ({**MUX, "platforms": {"api_server": {"extra": {"key": KEY}}}}, "API_SERVER_ENABLED=true # on\n", False, None),
    (MUX, f"GATEWAY_MULTIPLEX_PROFILES=false # x\nAPI_SERVER_KEY={KEY}\n", False, None),
], ids=["symlink", "file", "mux-comment", "mux-quoted-comment", "mux-expanded", "enabled-comment", "mux-off-comment"])
def test_the_root_env_is_read_as_hermes_reads_it(
    tmp_path: Path, config: dict, dotenv: str, linked: bool, expected: ApiServer | None
) -> None:
    """Regression: a symlinked root .env was not read (every turn on the CLI, with a wrong "set in the
    environment" warning), and GATEWAY_MULTIPLEX_PROFILES=true with a comment after it read as unknown (CLI,
    silently), while hermes, checked in a subprocess, started the multiplexed API server both times."""
    from hermes_actors.hermes.gateway_api import read_gateway_api_server

    root = tmp_path / "root"
    root.mkdir()
    real = tmp_path / "secrets" / "hermes.env" if linked else root / ".env"
    real.parent.mkdir(exist_ok=True)
    real.write_text(dotenv, encoding="utf-8")
    real.chmod(0o600)
    if linked:
        (root / ".env").symlink_to(real)
    planned = read_gateway_api_server(root, config, {})
    assert planned.server() == expected
    assert planned.why == ""


@pytest.mark.parametrize(("kind", "says"), [
    ("world-writable", "is writable by every user (mode 0666)"),
    ("fifo", "is not a regular file"),
    ("directory", "is not a regular file"),
    ("huge", "is over 256 KiB"),
])
def test_a_root_env_we_refuse_is_named_where_the_api_server_is_said_to_start_none(
    tmp_path: Path, kind: str, says: str
) -> None:
    """A symlinked .env is followed only to a file you or root control; a refused one is never read (a FIFO
    never blocks the read) and the reason replaces the "set in the environment" guess."""
    import os

    from hermes_actors.hermes.gateway_api import read_gateway_api_server

    root = tmp_path / "root"
    root.mkdir()
    target = tmp_path / "elsewhere"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    else:
        target.write_text(f"API_SERVER_KEY={KEY}\n" + ("#" * 300 * 1024 if kind == "huge" else ""))
        target.chmod(0o666 if kind == "world-writable" else 0o600)
    (root / ".env").symlink_to(target)
    planned = read_gateway_api_server(root, MUX, {"API_SERVER_KEY": KEY})
    assert planned.server() is None
    assert f"does not read the root's .env, which {says}" in planned.why, planned.why
    assert not planned.key_missing  # the key may well be in that .env: the refusal is what is said


@pytest.mark.parametrize(("mode", "uid", "size", "says"), [
    (0o100600, 1000, 10, ""),
    (0o100644, 0, 10, ""),  # root's (a secrets mount)
    (0o100664, 1000, 10, ""),  # group-writable: a user private group's umask
    (0o100600, 1001, 10, "is owned by uid 1001, neither ours (1000) nor root's"),
    (0o100646, 1000, 10, "is writable by every user (mode 0646)"),
    (0o010600, 1000, 0, "is not a regular file"),  # a FIFO
    (0o040700, 1000, 4096, "is not a regular file"),
    (0o100600, 1000, 256 * 1024, ""),
    (0o100600, 1000, 256 * 1024 + 1, "is over 256 KiB (262145 bytes)"),
])
def test_dotenv_refusal(mode: int, uid: int, size: int, says: str) -> None:
    from hermes_actors.hermes.gateway_api import dotenv_refusal

    assert dotenv_refusal(mode, uid, size, our_uid=1000) == says


@pytest.mark.parametrize(("uid", "our_uid", "root_owner", "says"), [
    (1000, 0, 1000, ""),  # run as root on a user's root: the user's own .env
    (1000, 2000, 1000, ""),  # the Hermes root's owner's (the user hermes runs as, who writes its config.yaml)
    (1000, 0, 0, "is owned by uid 1000, neither ours (0) nor root's"),
    (1001, 0, 1000, "is owned by uid 1001, neither ours (0), the Hermes root's owner's (1000) nor root's"),
    (1001, 1000, None, "is owned by uid 1001, neither ours (1000) nor root's"),
])
def test_dotenv_refusal_reads_the_hermes_roots_owners_file(
    uid: int, our_uid: int, root_owner: int | None, says: str
) -> None:
    """Regression: run as root, the .env of a user's Hermes root (the user's file, which hermes reads) was
    refused, and the API server hermes starts there said unknown."""
    from hermes_actors.hermes.gateway_api import dotenv_refusal

    assert dotenv_refusal(0o100600, uid, 10, our_uid=our_uid, root_owner=root_owner) == says


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_run_as_root_a_users_root_env_is_read(tmp_path: Path) -> None:
    """Regression: run as root, a user's Hermes root whose .env (the user's, which hermes reads) enables the API
    server was said to start none ("does not read the root's .env, which is owned by uid 1000")."""
    from hermes_actors.hermes.gateway_api import read_gateway_api_server

    root = tmp_path / "root"
    root.mkdir()
    (root / ".env").write_text(f"API_SERVER_KEY={KEY}\n")
    (root / ".env").chmod(0o600)
    for path in (root, root / ".env"):
        os.chown(path, 1000, 1000)
    planned = read_gateway_api_server(root, MUX, {})
    assert planned.server() == ApiServer("127.0.0.1", 8642, KEY), planned.why
    assert planned.why == ""


@pytest.mark.parametrize(("config", "server", "says"), [
    (MUX, None, "the root's .env is not valid UTF-8"),  # enabled by the .env alone: hermes' scope reads nothing
    ({**MUX, **ON}, ApiServer("127.0.0.1", 8642, KEY), ""),  # enabled by config.yaml, key from python-dotenv's load
    ({}, None, ""),  # not multiplexing: the environment python-dotenv loaded (latin-1), no warm turns
], ids=["mux-env-only", "mux-config-enabled", "no-mux"])
def test_a_root_env_not_utf8_gives_hermes_secret_scope_nothing(
    tmp_path: Path, config: dict, server: ApiServer | None, says: str
) -> None:
    """Regression: a root .env with a latin-1 byte (in a comment) was decoded with replacement characters and
    its API_SERVER_KEY read, so turns waited for an API server hermes, whose secret scope reads a file that is
    not UTF-8 as empty, never started."""
    from hermes_actors.hermes.gateway_api import read_gateway_api_server, read_root_dotenv

    root = tmp_path / "root"
    root.mkdir()
    (root / ".env").write_bytes(b"# caf\xe9 (latin-1)\nAPI_SERVER_KEY=" + KEY.encode() + b"\n")
    (root / ".env").chmod(0o600)
    read = read_root_dotenv(root / ".env")
    assert (read.scope, read.loaded, read.not_utf8) == ({}, {"API_SERVER_KEY": KEY}, True)
    planned = read_gateway_api_server(root, config, {})
    assert planned.server() == server
    assert (says in planned.why) if says else planned.why == "", planned.why
    assert not planned.key_missing or not says


@pytest.mark.parametrize(("text", "scope", "loaded"), [
    ("A=1 # c\n", {"A": "1 # c"}, {"A": "1"}),
    ("export A='x' # c\n", {"A": "'x' # c"}, {"A": "x"}),
    ('A="x y"\n', {"A": "x y"}, {"A": "x y"}),
    ("S=v\nA=${S}\n", {"S": "v", "A": "${S}"}, {"S": "v", "A": "v"}),
    ("# A=1\nNOVALUE\n", {}, {}),
])
def test_a_dotenv_text_both_ways_hermes_reads_it(text: str, scope: dict, loaded: dict) -> None:
    """hermes' secret scope (agent/secret_scope.load_env_file) and its environment (python-dotenv) read the same
    .env differently; the fallback without python-dotenv agrees on these."""
    from hermes_actors.hermes import gateway_api

    assert gateway_api.parse_dotenv(text) == scope
    assert gateway_api.load_dotenv_values(text) == loaded
    if "${" not in text:
        assert {k: gateway_api._plain_value(v) for k, v in gateway_api.parse_dotenv(text).items()} == loaded


def test_hermes_true_is_hermes_reading_of_a_switch() -> None:
    from hermes_actors.hermes.gateway_api import hermes_true

    assert [hermes_true(v) for v in (True, "yes", " On ", 1, "true")] == [True] * 5
    assert [hermes_true(v) for v in (False, "no", "off", "false", "0", 0, None, "maybe", "")] == [False] * 9


def test_an_api_server_is_named_by_its_address_and_never_shows_its_key() -> None:
    server = ApiServer("127.0.0.1", 8642, KEY)
    assert str(server) == "127.0.0.1:8642"  # logs and doctor: "the hermes API server 127.0.0.1:8642 ..."
    assert KEY not in str(server) and KEY not in repr(server)


DM = "Message from 🤖 alice (@alice): please build it"


@pytest.mark.parametrize(
    ("stored", "action", "message_id"),
    [
        ([], RESEND, None),  # the attempt failed before hermes stored anything
        ([(7, "user", DM)], REWIND, 7),  # exactly the DM: taken back, then resent
        ([(7, "user", "something else")], SKIP, None),  # not ours: never taken back
        ([(7, "user", DM), (8, "assistant", None)], SKIP, None),  # the model answered (tool call)
        ([(7, "user", DM), (8, "assistant", "partial"), (9, "tool", "done")], SKIP, None),
        ([(7, "assistant", "hello")], SKIP, None),
        ([(7, "user", [{"type": "text", "text": DM}])], SKIP, None),  # content parts: not the text we sent
    ],
)
def test_plan_retry(stored: list[tuple[int, str, object]], action: str, message_id: int | None) -> None:
    assert plan_retry(stored, DM) == RetryPlan(action, message_id)


@pytest.fixture
def session_db() -> type:
    return pytest.importorskip("hermes_state", reason="needs hermes-agent (the [hermes] extra)").SessionDB


def _bot_chat_with(session_db: type, home: Path, rows: list[tuple[str, str]], at: float) -> str:
    db = session_db(db_path=home / "state.db")
    try:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "Bot Chat")
        for role, content in rows:
            db.append_message("s1", role, content)
        with db._lock:  # the test dates the rows: hermes stamps them with time.time()
            db._conn.execute("UPDATE messages SET timestamp = ?", (at,))
            db._conn.commit()
    finally:
        db.close()
    return "s1"


def _active(session_db: type, home: Path) -> list[tuple[str, object]]:
    db = session_db(db_path=home / "state.db", read_only=True)
    try:
        return [(m["role"], m["content"]) for m in db.get_messages("s1")]
    finally:
        db.close()


def test_prepare_retry_takes_back_the_unanswered_dm_in_hermes_state_db(session_db: type, tmp_path: Path) -> None:
    earlier = [("user", "an older DM"), ("assistant", "answered")]
    _bot_chat_with(session_db, tmp_path, earlier, at=1000.0)
    db = session_db(db_path=tmp_path / "state.db")
    try:
        db.append_message("s1", "user", DM)  # what the failed attempt stored, stamped now
    finally:
        db.close()
    assert prepare_bot_chat_retry(tmp_path, "Bot Chat", DM, since=2000.0) is True
    assert _active(session_db, tmp_path) == earlier  # the DM is soft-deleted: the retry sends it once


def test_prepare_retry_refuses_when_the_model_already_acted(session_db: type, tmp_path: Path) -> None:
    _bot_chat_with(session_db, tmp_path, [], at=0.0)
    db = session_db(db_path=tmp_path / "state.db")
    try:
        db.append_message("s1", "user", DM)
        db.append_message("s1", "assistant", "on it")
    finally:
        db.close()
    assert prepare_bot_chat_retry(tmp_path, "Bot Chat", DM, since=1000.0) is False
    assert _active(session_db, tmp_path) == [("user", DM), ("assistant", "on it")]


def test_prepare_retry_ignores_rows_older_than_the_attempt(session_db: type, tmp_path: Path) -> None:
    """The same text answered by an earlier turn is not this attempt's: nothing is taken back."""
    _bot_chat_with(session_db, tmp_path, [("user", DM), ("assistant", "done before")], at=1000.0)
    assert prepare_bot_chat_retry(tmp_path, "Bot Chat", DM, since=2000.0) is True
    assert _active(session_db, tmp_path) == [("user", DM), ("assistant", "done before")]
    assert prepare_bot_chat_retry(tmp_path / "nowhere", "Bot Chat", DM, since=0.0) is True  # no state.db yet


OTHER_DM = "Message from 🤖 carol (@carol): another lost DM"


@pytest.mark.parametrize(
    ("tail", "first"),
    [
        ([], None),  # an empty session
        ([(1, "user", DM), (2, "assistant", "done")], None),  # answered
        ([(1, "user", DM), (2, "assistant", "done"), (3, "user", DM)], 3),  # one DM a dead turn left
        ([(1, "assistant", "hi"), (4, "user", DM), (6, "user", OTHER_DM)], 4),  # two: both go, from the first
        ([(1, "user", DM), (2, "assistant", None), (3, "tool", "ok")], None),  # died in a tool step: left
        ([(5, "user", DM)], 5),
        ([(1, "assistant", "hi"), (2, "user", "a person typing")], None),  # a person's: maybe a live turn's
        ([(1, "user", DM), (2, "user", "a person typing")], None),  # it ends the session: nothing after it goes
        ([(1, "user", "a person typing"), (2, "user", DM)], 2),  # only the DMs after it
        ([(1, "user", None)], None),
        # a wake-up turn that died is never run again: its text stays for the bot's next turn to read, or
        # the bot would never learn the outcome (and a DM before it stays too: the rewind takes all after it)
        ([(1, "assistant", "ok"), (2, "user", "Reply from @bob: done")], None),
        ([(1, "user", DM), (2, "user", "Delivery to @bob failed [reason: unknown]: x")], None),
        ([(1, "user", "Reply from @bob: done"), (2, "user", DM)], 2),  # only the DM after the wake-up goes
        ([(1, "user", "Reply from my mom: call her")], None),  # a person's words, not an outcome
    ],
)
def test_plan_take_back(tail: list[tuple[int, str, object]], first: int | None) -> None:
    assert plan_take_back(tail) == first


def test_take_back_unanswered_soft_deletes_the_dms_a_dead_turn_left(session_db: type, tmp_path: Path) -> None:
    answered = [("user", "an older DM"), ("assistant", "answered")]
    _bot_chat_with(session_db, tmp_path, [*answered, ("user", DM), ("user", OTHER_DM)], at=1000.0)
    assert take_back_unanswered(tmp_path, "Bot Chat") == 2
    assert _active(session_db, tmp_path) == answered
    assert take_back_unanswered(tmp_path, "Bot Chat") == 0  # nothing more: answered sessions are left alone
    assert _active(session_db, tmp_path) == answered
    assert take_back_unanswered(tmp_path, "Group: launch") == 0  # no such session
    assert take_back_unanswered(tmp_path / "nowhere", "Bot Chat") == 0  # no state.db yet


def test_take_back_unanswered_leaves_a_persons_message_alone(session_db: type, tmp_path: Path) -> None:
    """A person chatting in Bot Chat is outside our turn lock: their message may be a live turn's."""
    rows = [("user", DM), ("assistant", "answered"), ("user", "what are you up to?")]
    _bot_chat_with(session_db, tmp_path, rows, at=1000.0)
    assert take_back_unanswered(tmp_path, "Bot Chat") == 0
    assert _active(session_db, tmp_path) == rows


def test_take_back_unanswered_leaves_an_unreadable_database_alone(tmp_path: Path, warnings: list[str]) -> None:
    (tmp_path / "state.db").write_bytes(b"not a database" * 100)
    assert take_back_unanswered(tmp_path, "Bot Chat") == 0
    assert any("cannot read" in w for w in warnings), warnings


def test_argv_for_0_19_shows_a_nul_as_a_replacement_character() -> None:
    """exec refuses a NUL in an argument ("embedded null byte"): the DM would fail after its ack."""
    turn = Turn(profile="bob", content="a\x00b", delivery_id="d1")
    argv = make_runner(ChatFlags(no_restore_cwd=True)).argv(turn, None)
    assert argv[-1] == "--query=a\ufffdb"


@pytest.mark.parametrize(("mapping", "expected"), [
    ({"hermes_actors": 1, "api_server": 2}, ["api_server", "hermes_actors"]),
    ({"hermes_actors": 1, "telegram": 3, "api_server": 2, "slack": 4},
     ["telegram", "api_server", "hermes_actors", "slack"]),  # just after it; the others keep their order
    ({"api_server": 2, "hermes_actors": 1}, None),  # in order already
    ({"hermes_actors": 1}, None),  # nothing to follow
    ({"api_server": 2}, None),
], ids=["swapped", "between-others", "in-order", "no-api-server", "no-block-of-ours"])
def test_key_moved_after(mapping: dict[str, int], expected: list[str] | None) -> None:
    from hermes_actors.hermes.recorded_edits import key_moved_after

    before = dict(mapping)
    moved = key_moved_after(mapping, "hermes_actors", "api_server")
    assert (None if moved is None else list(moved)) == expected
    assert mapping == before and (moved is None or moved == mapping)  # same keys and values; the input untouched


_HA, _API = {"enabled": True, "extra": {"host_actors": True}}, {"enabled": True}


@pytest.mark.parametrize(("config", "api", "ours"), [
    ({}, ["platforms", "api_server"], ["platforms", "hermes_actors"]),
    ({"platforms": {"api_server": _API}}, ["platforms", "api_server"], ["platforms", "hermes_actors"]),
    ({"gateway": {"platforms": {"telegram": {}}}}, ["platforms", "api_server"], ["platforms", "hermes_actors"]),
    ({"gateway": {"platforms": {"api_server": _API}}},
     ["gateway", "platforms", "api_server"], ["gateway", "platforms", "hermes_actors"]),
    ({"gateway": {"platforms": {"hermes_actors": _HA}}},
     ["gateway", "platforms", "api_server"], ["gateway", "platforms", "hermes_actors"]),
    ({"gateway": {"platforms": {"api_server": _API}}, "platforms": {"api_server": _API}},
     ["platforms", "api_server"], ["platforms", "hermes_actors"]),  # the top level's block wins
    ({"gateway": {"platforms": {"hermes_actors": _HA}}, "platforms": {"api_server": _API}},
     ["platforms", "api_server"], ["gateway", "platforms", "hermes_actors"]),  # each where it is
    ({"gateway": "junk", "platforms": {"hermes_actors": _HA}},
     ["platforms", "api_server"], ["platforms", "hermes_actors"]),
    # a block that is no mapping is skipped, as hermes skips it: the real one under gateway.platforms is edited
    ({"gateway": {"platforms": {"api_server": _API}}, "platforms": {"api_server": None}},
     ["gateway", "platforms", "api_server"], ["gateway", "platforms", "hermes_actors"]),
], ids=["empty", "top", "nested-others-only", "nested-api", "nested-ours", "both-api", "split", "junk-gateway",
        "top-null"])
def test_platform_block_keys(config: dict[str, Any], api: list[str], ours: list[str]) -> None:
    """hermes 0.19 reads platform blocks under gateway.platforms too: enable edits a block where it is, and puts a
    new one of ours beside the other one when that is under gateway.platforms only (else at the top level)."""
    from hermes_actors.hermes.setup import platform_block_keys

    assert platform_block_keys(config, "api_server", "hermes_actors") == api
    assert platform_block_keys(config, "hermes_actors", "api_server") == ours


@pytest.mark.parametrize(("config", "order"), [
    ({}, []),
    ({"platforms": {"hermes_actors": _HA, "api_server": _API}}, ["hermes_actors", "api_server"]),
    ({"gateway": {"platforms": {"hermes_actors": _HA}}, "platforms": {"api_server": _API}},
     ["hermes_actors", "api_server"]),  # gateway.platforms first
    ({"gateway": {"platforms": {"api_server": _API}}, "platforms": {"hermes_actors": _HA, "api_server": _API}},
     ["api_server", "hermes_actors"]),  # a block in both keeps its nested place
    ({"platforms": {"telegram": "junk", "api_server": _API}}, ["api_server"]),  # no mapping: hermes skips it
], ids=["empty", "top", "nested-first", "merged", "not-a-mapping"])
def test_connect_order(config: dict[str, Any], order: list[str]) -> None:
    """The order hermes 0.19's loader (gateway/config.py) gives the platforms; the real one agrees in
    test_hermes_cli.py::test_enable_gateway_lists_the_api_server_first_when_the_platforms_are_under_gateway."""
    from hermes_actors.hermes.setup import connect_order

    assert connect_order(config) == order


# ── state.db opened read-only, whatever its path ────────────────────────────


@pytest.mark.parametrize(("path", "uri"), [
    ("/h/state.db", "file:/h/state.db?mode=ro"),
    ("/h/a?b/state.db", "file:/h/a%3Fb/state.db?mode=ro"),
    ("/h/a#b/state.db", "file:/h/a%23b/state.db?mode=ro"),
    ("/h/100%/state.db", "file:/h/100%25/state.db?mode=ro"),
    ("/h/a b/state.db", "file:/h/a%20b/state.db?mode=ro"),
    ("/h/\udcff/state.db", "file:/h/%FF/state.db?mode=ro"),  # a name that is not UTF-8, byte for byte
])
def test_read_only_uri_quotes_the_path(path: str, uri: str) -> None:
    from hermes_actors.hermes.sessions import read_only_uri

    assert read_only_uri(Path(path)) == uri


@pytest.mark.parametrize("odd", ["a?b", "a#b", "a%3Fb", "a?mode=rw#x%"])
def test_state_db_under_a_path_with_uri_characters_is_read_read_only(tmp_path: Path, odd: str) -> None:
    """Regression (hostile paths): the URI was built unquoted, so ``final_answer_since(Path('/x/a?b/profiles/
    alice'), …)`` created an empty file ``/x/a`` (the ``?`` cut ``mode=ro`` off and sqlite opened what came
    before it read-write); ``#`` likewise, and a ``%`` was read as an escape. The database there is read now,
    and a missing one is created nowhere."""
    import sqlite3

    from hermes_actors.hermes.sessions import final_answer_since

    home = tmp_path / odd / "profiles" / "alice"
    home.mkdir(parents=True)
    assert final_answer_since(home, "s1", 0.0) == (False, None)  # no state.db: nothing made, anywhere
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd]
    assert not (home / "state.db").exists()
    conn = sqlite3.connect(home / "state.db")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT, "
                 "tool_calls TEXT, timestamp REAL, active INTEGER)")
    conn.execute("INSERT INTO messages (session_id, role, content, tool_calls, timestamp, active) "
                 "VALUES ('s1', 'assistant', 'the answer', NULL, 5.0, 1)")
    conn.commit()
    conn.close()
    before = sorted(p.name for p in home.iterdir())
    assert final_answer_since(home, "s1", 1.0) == (True, "the answer")
    assert sorted(p.name for p in home.iterdir()) == before and sorted(p.name for p in tmp_path.iterdir()) == [odd]
