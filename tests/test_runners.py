"""Runners: as_runner, CallableRunner, resolve_cli and CommandRunner against a fake ``hermes``."""

from __future__ import annotations

import functools
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from roots import assert_gone, write_fake_cli

from hermes_actors.errors import TurnFailed
from hermes_actors.facade.args import MAX_WAIT, checked_hop
from hermes_actors.local import runners
from hermes_actors.local.runners import CallableRunner, CommandRunner, TurnRunner, as_runner, resolve_cli
from hermes_actors.local.turns import attempt_turn
from hermes_actors.messages import Turn
from hermes_actors.transports.redis.io import ClaimGuard
from hermes_actors.transports.redis.store import RedisSettings

ID = "0123456789abcdef0123456789abcdef"
ID2 = "fedcba9876543210fedcba9876543210"
BUSY_TEXT = (
    "Delivery failed: @bob's Bot Chat is open on another surface right now, "
    "so your message was NOT delivered. Try again later."
)

# The fake CLI: records what it was given into $FAKE_HERMES_RECORD, then
# behaves as $FAKE_HERMES_MODE says.
FAKE_HERMES = """
import json, os, stat, subprocess, sys, time

argv = sys.argv[1:]
record = {"argv": argv, "pid": os.getpid()}
st, dn = os.fstat(0), os.stat("/dev/null")
record["stdin_devnull"] = stat.S_ISCHR(st.st_mode) and st.st_rdev == dn.st_rdev
record["env"] = {k: os.environ.get(k) for k in (
    "HERMES_RESUME_UNANSWERED_TURN", "HERMES_COMPRESS_BEFORE_TURN", "HERMES_TURN_AUTHOR",
    "HERMES_HOME", "FAKE_EXTRA")}
qf = argv[argv.index("--query-file") + 1] if "--query-file" in argv else None
if qf:
    record["query_file"] = qf
    with open(qf, encoding="utf-8") as f:
        record["query"] = f.read()
    record["file_mode"] = stat.S_IMODE(os.stat(qf).st_mode)
    record["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(qf)).st_mode)
mode = os.environ.get("FAKE_HERMES_MODE", "reply")
if mode == "hang_child":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    record["child_pid"] = child.pid
path = os.environ["FAKE_HERMES_RECORD"]
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)

if mode == "reply":
    sys.stdout.write("Hi from bob 🤖\\n\\n")
elif mode == "reply_ws":
    sys.stdout.write("  indented reply  \\n")
elif mode == "not_owned":
    sys.stderr.write("some log line\\nhermes-refusal-reason: SESSION_NOT_OWNED\\nsession refused\\n")
    sys.exit(1)
elif mode == "prose_owner":
    sys.stderr.write("error: session 'Bot Chat' already has a live owner (desktop)\\n")
    sys.exit(1)
elif mode == "other_marker":
    sys.stderr.write("hermes-refusal-reason: SESSION_ARCHIVED\\nalready has a live owner\\n")
    sys.exit(1)
elif mode == "rate_limit":
    sys.stderr.write("Traceback noise\\n\\nprovider error: 429 rate limit exceeded\\n\\n")
    sys.exit(1)
elif mode == "stdout_only":
    sys.stdout.write("only stdout explains: model not found\\n")
    sys.exit(3)
elif mode == "silent_fail":
    sys.exit(2)
elif mode == "long":
    sys.stderr.write("\\n".join("line %04d " % i + "x" * 90 for i in range(100)) + "\\n")
    sys.exit(1)
elif mode in ("hang", "hang_child"):
    time.sleep(120)
"""


@pytest.fixture
def fake_cli(tmp_path: Path) -> Path:
    return write_fake_cli(tmp_path, f"#!{sys.executable}\n{FAKE_HERMES}")


def dm_base(tmp_path: Path) -> Path:
    base = tmp_path / "tmp"
    base.mkdir(exist_ok=True)
    return base


@pytest.fixture
def stdin_is_a_pipe() -> Iterator[None]:
    """Put a pipe on our fd 0 so a child that inherited stdin would notice (pytest gives /dev/null)."""
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)


def make_runner(fake_cli: Path, tmp_path: Path, mode: str, **kwargs: Any) -> CommandRunner:
    env = {"FAKE_HERMES_MODE": mode, "FAKE_HERMES_RECORD": str(tmp_path / "record.json")}
    return CommandRunner(str(fake_cli), dm_base=dm_base(tmp_path), env=env, **kwargs)


def record(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "record.json").read_text())
    return data


def turn(**kwargs: Any) -> Turn:
    fields: dict[str, Any] = {"profile": "bob", "content": "Message from 🤖 Alice (@alice): hi", "delivery_id": ID}
    fields.update(kwargs)
    return Turn(**fields)


def dm_files(tmp_path: Path) -> list[Path]:
    directory = tmp_path / "tmp" / f"hermes-dm-{os.getuid()}"
    return sorted(directory.iterdir()) if directory.exists() else []


# ── as_runner / CallableRunner ──────────────────────────────────────────────


def test_as_runner_wraps_a_callable() -> None:
    runner = as_runner(lambda t: f"echo {t.profile}")
    assert isinstance(runner, CallableRunner)
    assert isinstance(runner, TurnRunner)
    assert runner.run_turn(turn()) == "echo bob"


def test_as_runner_passes_objects_with_run_turn_through() -> None:
    class Mine:
        def run_turn(self, t: Turn) -> str:
            return "mine"

        def __call__(self, t: Turn) -> str:
            return "called"

    obj = Mine()
    assert as_runner(obj) is obj
    assert as_runner(obj).run_turn(turn()) == "mine"


@pytest.mark.parametrize("bad", [None, 42, "hermes", object()])
def test_as_runner_refuses_anything_else(bad: object) -> None:
    with pytest.raises(TypeError, match=r"runner must be .* got "):
        as_runner(bad)


def test_callable_runner_propagates_turn_failed_and_checks_the_type() -> None:
    def fail(t: Turn) -> str:
        raise TurnFailed("nope", reason="agent_blocked")

    with pytest.raises(TurnFailed) as info:
        CallableRunner(fail).run_turn(turn())
    assert info.value.reason == "agent_blocked"
    with pytest.raises(TypeError, match="expected str"):
        CallableRunner(lambda t: None).run_turn(turn())  # type: ignore[arg-type,return-value]


class RawReply:
    """A runner object returning ``value`` as it is."""

    def __init__(self, value: object) -> None:
        self.value = value

    def run_turn(self, t: Turn) -> Any:
        return self.value

    def __repr__(self) -> str:
        return "RawReply()"


def test_a_redis_guarded_runner_is_named_by_the_runner_it_wraps_when_its_reply_is_not_a_str() -> None:
    """With a Redis transport every runner is wrapped (the claim guard): a reply that is not a str named the wrapper
    (``<…_GuardedRunner object at 0x…>``), not the runner the user gave."""
    settings = RedisSettings(url="redis://127.0.0.1:6390/0", claim_idle_seconds=60, max_stream_len=1000,
                             heartbeat_seconds=1, prefix="hermes", block_ms=200, connection_label="")
    guarded = ClaimGuard(settings).wrap(RawReply(None))  # a local DM: nothing is claimed, Redis is never asked
    result, may_retry = attempt_turn(guarded, turn())
    assert (result.reply, result.error, result.reason) == (None, "runner RawReply returned NoneType, expected str",
                                                           "unknown")
    assert not may_retry  # unknown, never retried


@dataclass
class ApiBot:
    """A runner whose repr holds a secret, a 5 KB prompt and the words a provider error holds."""

    api_key: str = "sk-live-SECRET123"
    system_prompt: str = "x" * 5000
    rate_limit: int = 5
    timeout: float = 600

    def run_turn(self, t: Turn) -> Any:
        return None


def rate_limited_reply(t: Turn) -> Any:
    return None


def _named(name: str) -> Any:
    """An instance of a class called ``name``."""
    return type(name, (), {})()


def _wraps(inner: Any) -> Any:
    @functools.wraps(inner)
    def wrapper(t: Turn) -> Any:
        return inner(t)

    return wrapper


@pytest.mark.parametrize(("source", "name"), [
    (ApiBot(), "ApiBot"),
    (CommandRunner(cli=sys.executable, timeout=600), "CommandRunner"),
    (rate_limited_reply, "rate_limited_reply"),
    (lambda t: None, "<lambda>"),
    (ApiBot().run_turn, "ApiBot.run_turn"),
    (ApiBot, "ApiBot"),
    (_wraps(rate_limited_reply), "rate_limited_reply"),
    (_named("Bot" * 100), ("Bot" * 27)[:79] + "…"),
], ids=["object", "command-runner", "function", "lambda", "method", "class", "wrapped", "long-type-name"])
def test_a_runner_is_named_by_its_qualified_name_never_its_repr(source: Any, name: str) -> None:
    assert runners.runner_name(source).rsplit(".<locals>.", 1)[-1] == name


@pytest.mark.parametrize("runner", [
    ApiBot(), CallableRunner(rate_limited_reply), CallableRunner(ApiBot().run_turn, blocking=False),
    CommandRunner(cli="/x/hermes", timeout=600),
], ids=["object", "callable", "callable-method", "command-runner-repr"])
def test_a_reply_that_is_not_a_str_fails_unknown_never_classified_from_the_runner_s_name(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): the error's text, holding the runner's whole repr, was classified: a runner whose repr
    held ``rate_limit`` failed ``provider_rate_limit`` (retryable, its turn run twice), ``timeout`` or
    ``CommandRunner(cli='/x/hermes', timeout=600)`` ``delivery_timeout``; an ``api_key`` field and a 5 KB prompt
    went into the outcome, the journal and the CLI. The failure is ``unknown`` (never retried), the runner named
    by its qualified name."""
    if isinstance(runner, CommandRunner):
        monkeypatch.setattr(CommandRunner, "run_turn", lambda self, t: None)
    result, may_retry = attempt_turn(runner, turn())
    assert (result.reply, result.reason, may_retry) == (None, "unknown", False), result
    named = {ApiBot: "ApiBot", CommandRunner: "CommandRunner"}.get(type(runner))
    assert result.error == f"runner {named or runners.runner_name(runner.fn)} returned NoneType, expected str"
    assert "SECRET" not in result.error and len(result.error) < 200


# ── resolve_cli ─────────────────────────────────────────────────────────────


def test_resolve_cli_prefers_the_sibling_of_the_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    sibling = venv_bin / "hermes"
    sibling.write_text("#!/bin/sh\n")
    path_bin = tmp_path / "path-bin"
    path_bin.mkdir()
    on_path = path_bin / "hermes"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(path_bin))
    # one rule with find_hermes_cli (beside_interpreter): a file there that cannot be run is passed over for PATH
    assert resolve_cli() == str(on_path)
    sibling.chmod(0o755)
    assert resolve_cli() == str(sibling)
    assert CommandRunner().cli == str(sibling)


def test_resolve_cli_falls_back_to_path_then_bare_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "hermes").mkdir()  # a directory named hermes is not the CLI
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    path_bin = tmp_path / "path-bin"
    path_bin.mkdir()
    on_path = path_bin / "hermes"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setenv("PATH", str(path_bin))
    assert resolve_cli() == str(on_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert resolve_cli() == "hermes"
    assert resolve_cli("hermes-other") == "hermes-other"


# ── CommandRunner ───────────────────────────────────────────────────────────


def test_successful_turn_runs_the_bot_chat_command(
    fake_cli: Path, tmp_path: Path, stdin_is_a_pipe: None
) -> None:
    runner = make_runner(fake_cli, tmp_path, "reply")
    reply = runner.run_turn(turn())
    assert reply == "Hi from bob 🤖"
    rec = record(tmp_path)
    query_file = rec["query_file"]
    assert rec["argv"] == [
        "-p", "bob", "chat", "--in", "~", "-c", "Bot Chat", "--create-if-missing", "-Q",
        "--query-file", query_file,
    ]
    assert Path(query_file).name == f"dm-{ID}.txt"
    assert rec["query"] == "Message from 🤖 Alice (@alice): hi"
    assert rec["stdin_devnull"] is True
    assert rec["file_mode"] == 0o600
    assert rec["dir_mode"] == 0o700
    assert rec["env"]["HERMES_RESUME_UNANSWERED_TURN"] is None
    assert rec["env"]["HERMES_COMPRESS_BEFORE_TURN"] is None
    assert rec["env"]["HERMES_TURN_AUTHOR"] is None
    assert not Path(query_file).exists()  # removed after success
    assert runner.kept() == []


def test_a_room_turn_runs_in_its_group_session(fake_cli: Path, tmp_path: Path, stdin_is_a_pipe: None) -> None:
    # Regression: the command runner ran every turn in "Bot Chat", a room's member turns too.
    make_runner(fake_cli, tmp_path, "reply").run_turn(turn(session="Group: launch"))
    argv = record(tmp_path)["argv"]
    assert argv[argv.index("-c") + 1] == "Group: launch"


def test_only_trailing_newlines_are_stripped(fake_cli: Path, tmp_path: Path) -> None:
    assert make_runner(fake_cli, tmp_path, "reply_ws").run_turn(turn()) == "  indented reply  "


def test_turn_env_carries_author_home_and_constructor_env(
    fake_cli: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_RESUME_UNANSWERED_TURN", "1")  # inherited: must not leak into attempt 1
    monkeypatch.setenv("HERMES_TURN_AUTHOR", '{"stale":true}')
    runner = make_runner(fake_cli, tmp_path, "reply")
    runner.env["FAKE_EXTRA"] = "yes"
    author = {"kind": "bot", "id": "alice", "name": "Alice Ä"}
    home = tmp_path / "profiles" / "bob"
    runner.run_turn(turn(author=author, home=home))
    env = record(tmp_path)["env"]
    assert env["HERMES_TURN_AUTHOR"] == json.dumps(author, separators=(",", ":"))
    assert json.loads(env["HERMES_TURN_AUTHOR"]) == author
    assert ", " not in env["HERMES_TURN_AUTHOR"] and '": ' not in env["HERMES_TURN_AUTHOR"]
    assert env["HERMES_HOME"] == str(home)
    assert env["FAKE_EXTRA"] == "yes"
    assert env["HERMES_RESUME_UNANSWERED_TURN"] is None


@pytest.mark.parametrize(
    ("action", "compress"), [("resume", None), ("compress_then_resume", "1"), ("", None)]
)
def test_attempt_two_resumes_the_same_session(
    fake_cli: Path, tmp_path: Path, action: str, compress: str | None
) -> None:
    make_runner(fake_cli, tmp_path, "reply").run_turn(turn(attempt=2, retry_action=action))
    rec = record(tmp_path)
    assert rec["env"]["HERMES_RESUME_UNANSWERED_TURN"] == "1"
    assert rec["env"]["HERMES_COMPRESS_BEFORE_TURN"] == compress
    assert "Bot Chat" in rec["argv"]


@pytest.mark.parametrize("mode", ["not_owned", "prose_owner"])
def test_live_owner_refusal_is_target_busy(fake_cli: Path, tmp_path: Path, mode: str) -> None:
    runner = make_runner(fake_cli, tmp_path, mode)
    with pytest.raises(TurnFailed) as info:
        runner.run_turn(turn(handle="bob"))
    assert info.value.reason == "target_busy"
    assert info.value.text == BUSY_TEXT
    assert dm_files(tmp_path) == []  # final outcome: file removed
    assert runner.kept() == []


@pytest.mark.parametrize(("profile", "handle"), [("carol", ""), ("default", "hermes")])
def test_target_busy_names_the_profile_the_cli_ran_as_like_the_seed(
    fake_cli: Path, tmp_path: Path, profile: str, handle: str
) -> None:
    """The seed names the CLI's ``-p`` profile (``@default's``), not the handle (``@hermes's``)."""
    with pytest.raises(TurnFailed, match=rf"^Delivery failed: @{profile}'s Bot Chat is open"):
        make_runner(fake_cli, tmp_path, "not_owned").run_turn(turn(profile=profile, handle=handle))


def test_a_different_marker_code_wins_over_prose(fake_cli: Path, tmp_path: Path) -> None:
    with pytest.raises(TurnFailed) as info:
        make_runner(fake_cli, tmp_path, "other_marker").run_turn(turn())
    assert info.value.reason == ""
    assert info.value.text.startswith("hermes exited with status 1: ")
    assert "SESSION_ARCHIVED" in info.value.text


def test_other_failure_carries_the_last_lines_unclassified(fake_cli: Path, tmp_path: Path) -> None:
    runner = make_runner(fake_cli, tmp_path, "rate_limit")
    with pytest.raises(TurnFailed) as info:
        runner.run_turn(turn())
    assert info.value.reason == ""
    assert info.value.text == "hermes exited with status 1: Traceback noise\nprovider error: 429 rate limit exceeded"
    # attempt 1 failed retryably: the file is kept so attempt 2 replays it
    kept = dm_files(tmp_path)
    assert [p.name for p in kept] == [f"dm-{ID}.txt"]
    assert runner.kept() == [ID]
    first_path = record(tmp_path)["query_file"]
    with pytest.raises(TurnFailed):
        runner.run_turn(turn(attempt=2, retry_action="resume"))
    rec = record(tmp_path)
    assert rec["query_file"] == first_path
    assert rec["query"] == "Message from 🤖 Alice (@alice): hi"
    assert dm_files(tmp_path) == []  # attempt 2 is final
    assert runner.kept() == []


def test_release_removes_a_kept_file(fake_cli: Path, tmp_path: Path) -> None:
    runner = make_runner(fake_cli, tmp_path, "rate_limit")
    with pytest.raises(TurnFailed):
        runner.run_turn(turn())
    with pytest.raises(TurnFailed):
        runner.run_turn(turn(delivery_id=ID2))
    assert len(dm_files(tmp_path)) == 2
    runner.release(ID)
    assert [p.name for p in dm_files(tmp_path)] == [f"dm-{ID2}.txt"]
    runner.release(ID)  # unknown / already released: no-op
    runner.close()
    assert dm_files(tmp_path) == []


def test_failure_falls_back_to_stdout_then_to_a_bare_status(fake_cli: Path, tmp_path: Path) -> None:
    with pytest.raises(TurnFailed) as info:
        make_runner(fake_cli, tmp_path, "stdout_only").run_turn(turn())
    assert info.value.text == "hermes exited with status 3: only stdout explains: model not found"
    with pytest.raises(TurnFailed) as info:
        make_runner(fake_cli, tmp_path, "silent_fail").run_turn(turn(delivery_id=ID2))
    assert info.value.text == "hermes exited with status 2 (no output)"


def test_failure_text_is_bounded_to_the_last_2000_chars(fake_cli: Path, tmp_path: Path) -> None:
    with pytest.raises(TurnFailed) as info:
        make_runner(fake_cli, tmp_path, "long").run_turn(turn())
    prefix = "hermes exited with status 1: "
    detail = info.value.text.removeprefix(prefix)
    assert info.value.text.startswith(prefix)
    assert 1900 <= len(detail) <= 2000
    assert detail.endswith("line 0099 " + "x" * 90)
    assert "line 0000" not in detail


def test_hang_times_out_as_delivery_timeout(fake_cli: Path, tmp_path: Path) -> None:
    runner = make_runner(fake_cli, tmp_path, "hang", timeout=0.5)
    with pytest.raises(TurnFailed) as info:
        runner.run_turn(turn())
    assert info.value.reason == "delivery_timeout"
    assert "timed out after 0.5s" in info.value.text
    assert runner.kept() == [ID]  # retryable on attempt 1


def test_timeout_kills_the_whole_process_group(fake_cli: Path, tmp_path: Path) -> None:
    # Generous timeout: the fake must get to record its child's pid first.
    runner = make_runner(fake_cli, tmp_path, "hang_child", timeout=3)
    with pytest.raises(TurnFailed) as info:
        runner.run_turn(turn(attempt=2, retry_action="resume"))
    assert info.value.reason == "delivery_timeout"
    rec = record(tmp_path)
    assert_gone(rec["pid"])
    assert_gone(rec["child_pid"])
    assert dm_files(tmp_path) == []  # attempt 2: final


def test_missing_executable_is_runtime_offline(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "hermes"
    runner = CommandRunner(str(missing), dm_base=dm_base(tmp_path))
    with pytest.raises(TurnFailed) as info:
        runner.run_turn(turn())
    assert info.value.reason == "runtime_offline"
    # review: it said only "pass cli=...", the Python keyword; `--runner command` users need --cli PATH
    assert info.value.text == (f"hermes CLI not found at {missing} — install hermes-agent (pip install "
                               "'hermes-actors[hermes]'), or name the executable: --cli PATH (hermes-actors "
                               "commands) or cli='PATH' (Python)")


def test_non_executable_cli_is_runtime_offline(tmp_path: Path) -> None:
    cli = tmp_path / "hermes"
    cli.write_text("not a program")
    cli.chmod(stat.S_IRUSR | stat.S_IWUSR)
    if os.access(cli, os.X_OK):
        pytest.skip("cannot make a non-executable file here")
    with pytest.raises(TurnFailed) as info:
        CommandRunner(str(cli), dm_base=dm_base(tmp_path)).run_turn(turn())
    assert info.value.reason == "runtime_offline"
    assert info.value.text == (f"hermes CLI at {cli} is not executable — fix its permissions, or name another: "
                               "--cli PATH (hermes-actors commands) or cli='PATH' (Python)")


def test_bad_delivery_id_fails_before_running(fake_cli: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        make_runner(fake_cli, tmp_path, "reply").run_turn(turn(delivery_id="not-hex"))
    assert not (tmp_path / "record.json").exists()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        CommandRunner("hermes", timeout=0)


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    ({"timeout": "5"}, TypeError, "timeout must be a number of seconds above 0, not str ('5')"),
    ({"timeout": None}, TypeError, "timeout must be a number of seconds above 0, not NoneType"),
    ({"timeout": True}, TypeError, "timeout must be a number of seconds above 0, not bool"),
    ({"timeout": -1}, ValueError, "timeout must be > 0 seconds, got -1"),
    ({"timeout": float("nan")}, ValueError, "timeout must be > 0 seconds, got nan"),
    ({"env": {"A": 1}}, TypeError, "env['A'] must be a str, not int (1); pass str(value)"),
    ({"env": {"A": None}}, TypeError, "env['A'] must be a str, not NoneType"),
    ({"env": {1: "x"}}, TypeError, "env key 1 must be a str (a variable name), not int"),
    ({"env": {"A=B": "x"}}, ValueError, "env key 'A=B' is not a variable name"),
    ({"env": {"": "x"}}, ValueError, "env key '' is not a variable name"),
    ({"env": {"A": "a\0b"}}, ValueError, "env['A'] holds a NUL character"),
    ({"env": "A=1"}, TypeError, "env must be a dict of variable names to str values, not str"),
    ({"env": [("A", "1")]}, TypeError, "env must be a dict of variable names to str values, not list: str keys, str "
                                       "values ({'LANG': 'C.UTF-8'}); pass dict(pairs)"),
    ({"env": {b"A": "1"}}, TypeError, "env key b'A' must be a str (a variable name), not bytes; decode it: "
                                      "os.fsdecode(key)"),
    ({"env": {"A": b"1"}}, TypeError, "env['A'] must be a str, not bytes (b'1'); decode it: os.fsdecode(value)"),
    ({"timeout": "inf"}, TypeError, "timeout must be a number of seconds above 0, not str ('inf')"),
    ({"timeout": Decimal("-1")}, ValueError, "timeout must be > 0 seconds, got Decimal('-1')"),
    ({"timeout": Decimal("NaN")}, ValueError, "timeout must be > 0 seconds, got Decimal('NaN')"),
])
def test_bad_timeout_or_env_is_refused_by_the_constructor_naming_it(kwargs: dict[str, Any], error: type[Exception],
                                                                    needle: str) -> None:
    """Regression (review apisurface, p28.py): ``timeout="5"`` raised "'>' not supported between instances of
    'str' and 'int'", and ``env={"A": 1}`` was taken, then every turn failed ``unknown`` ("expected str, bytes or
    os.PathLike object, not int"). Now the constructor refuses them, naming the argument or the key."""
    with pytest.raises(error) as caught:
        CommandRunner("/bin/true", **kwargs)
    assert needle in str(caught.value)


@pytest.mark.parametrize(("hop", "expected"), [
    (0, 0), (3, 3), (0.0, 0), (2.0, 2), (-0.0, 0), (True, TypeError), (False, TypeError), (1.5, TypeError),
    (float("inf"), TypeError), (float("nan"), TypeError), ("1", TypeError), (None, TypeError),
    (Decimal("1"), TypeError), (-1, ValueError), (-2.0, ValueError),
])
def test_checked_hop_takes_whole_numbers_as_workers_does(hop: Any, expected: int | type[Exception]) -> None:
    """The one rule for whole numbers (``facade.args._whole``): anything ``operator.index`` takes or a whole float,
    never a bool. Regression (review apismall): ``0.0`` was refused (and ``numpy.int64``, in test_gateway)."""
    if isinstance(expected, type):
        with pytest.raises(expected, match="message_agent hop must be"):
            checked_hop(hop)
    else:
        assert (checked_hop(hop), type(checked_hop(hop))) == (expected, int)


class _BytesPath:
    """A path whose ``os.fspath`` is bytes (``os.PathLike[bytes]``)."""

    def __fspath__(self) -> bytes:
        return b"/bin/true"


@pytest.mark.parametrize("cli", [5, b"/bin/true", ["/bin/true"], _BytesPath()],
                         ids=["int", "bytes", "list", "bytes-path"])
@pytest.mark.parametrize("make", ["CommandRunner", "HermesCliRunner"])
def test_a_cli_that_is_no_str_nor_path_is_refused_by_the_constructor_naming_it(cli: Any, make: str) -> None:
    """Regression (review apismall): ``CommandRunner(cli=5)`` was taken, and every turn then failed ``unknown``
    ("expected str, bytes or os.PathLike object, not int"); ``HermesCliRunner(cli=5)`` likewise. Now the constructor
    refuses it, naming the argument."""
    from hermes_actors.hermes.cli_runner import HermesCliRunner

    runner_type = CommandRunner if make == "CommandRunner" else HermesCliRunner
    with pytest.raises(TypeError) as caught:
        runner_type(cli)
    assert str(caught.value).startswith("cli must be the hermes executable, a path or a name as a str")
    decodable = isinstance(cli, (bytes, _BytesPath))
    assert ("; decode it: os.fsdecode(cli)" in str(caught.value)) is decodable, caught.value


def test_a_cli_path_is_taken_as_its_str() -> None:
    assert CommandRunner(Path("/bin/true")).cli == "/bin/true"


@pytest.mark.parametrize("make", [
    lambda: 5, lambda: 5.0, lambda: Decimal("5"), lambda: Fraction(5),
    lambda: pytest.importorskip("numpy").int64(5), lambda: pytest.importorskip("numpy").float64(5),
], ids=["int", "float", "Decimal", "Fraction", "np.int64", "np.float64"])
def test_a_timeout_is_any_real_number_of_seconds(make: Callable[[], Any]) -> None:
    """Regression (diff review): ``Decimal("5")``, ``Fraction(5)`` and ``numpy.int64(5)`` were refused as "must be a
    number of seconds above 0" (they are), while ``numpy.float64(5)`` was taken. Any real number is taken, as a
    float."""
    runner = CommandRunner("/bin/true", timeout=make())
    assert (runner.timeout, type(runner.timeout)) == (5.0, float)


def test_an_endless_timeout_is_as_long_as_a_clock_can_count() -> None:
    runner = CommandRunner("/bin/true", timeout=float("inf"), env={"A": "1"})
    assert runner.timeout == MAX_WAIT and runner.env == {"A": "1"}


def test_refusal_detection_rules() -> None:
    refused = runners.refused_not_owned
    assert refused("x\nhermes-refusal-reason: SESSION_NOT_OWNED\n")
    assert refused("hermes-refusal-reason:  SESSION_NOT_OWNED  ")
    assert refused("Session already has a live owner")
    assert not refused("hermes-refusal-reason: OTHER\nalready has a live owner")
    assert not refused("  hermes-refusal-reason: SESSION_NOT_OWNED")  # must start the line
    assert not refused("rate limited")
