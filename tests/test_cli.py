"""The hermes-actors command: --help everywhere, roster, send, demo."""

from __future__ import annotations

import errno
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, held_on, make_root, write_fake_cli

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import build_parser, main
from hermes_actors.demo.bots import DemoRunner, create_demo_root
from hermes_actors.messages import ProfileInfo, RemoteAgent, Turn
from hermes_actors.ops.remote_roster import RemoteRoster
from hermes_actors.store.relay_files import write_roster
from hermes_actors.store.relay_paths import RelayPaths

COMMANDS = ["demo", "roster", "send", "outcome", "status", "doctor", "room", "serve", "relay", "bench", "enable",
            "disable"]


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in COMMANDS])
def test_help_is_available_everywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: hermes-actors" in out
    if len(argv) == 2:
        assert argv[0] in out


def test_every_subcommand_is_wired() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)  # type: ignore[attr-defined]


def test_roster_lists_the_demo_bots_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    assert main(["roster", "--root", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["handle"] for r in rows} == {"hermes", "scout", "scribe", "critic"}
    assert all(r["online"] is True and r["connection_id"] is None for r in rows)


def test_send_waits_for_the_reply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    code = main(["send", "--root", str(root), "--from", "hermes", "scout", "what changed?", "--wait", "10",
                 "--runner", "demo", "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    ack = json.loads(lines[0])
    assert ack["status"] == "queued" and ack["to"] == "@scout"
    assert json.loads(lines[1])["text"].startswith("Reply from @scout: ")


def test_send_prints_human_lines_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    code = main(["send", "--root", str(root), "--from", "hermes", "scout", "what changed?", "--runner", "demo"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert lines[0].startswith("queued for @scout: delivery ") and "hermes-actors outcome --root" in lines[0]
    assert lines[1].startswith("Reply from @scout: ")  # no host: the DM ran in this command, which waited for it


def test_send_to_an_unknown_target_prints_one_refusal_line_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = create_demo_root(tmp_path / "root")
    code = main(["send", "--root", str(root), "--from", "hermes", "nobody", "hi", "--runner", "demo"])
    out = capsys.readouterr().out
    assert code == 1
    assert out == "refused [unknown]: no teammate named 'nobody' — teammates: @critic, @scout, @scribe\n"


def test_send_json_prints_the_raw_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    code = main(["send", "--root", str(root), "--from", "hermes", "nobody", "hi", "--runner", "demo", "--json"])
    refusal = json.loads(capsys.readouterr().out.strip())
    assert code == 1
    assert refusal["error"].startswith("No teammate named 'nobody'")
    assert "scout" in refusal["teammates"]


def test_a_failed_turn_exits_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    failing = tmp_path / "failing-hermes"
    failing.write_text("#!/bin/sh\nexit 3\n", encoding="utf-8")
    failing.chmod(0o755)
    code = main(["send", "--root", str(root), "--from", "hermes", "scout", "hi", "--cli", str(failing),
                 "--runner", "command", "--wait", "30"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 1
    assert lines[-1].startswith("failed [") and "@scout" in lines[-1]


@pytest.mark.parametrize("command", [
    ["serve"],
    ["send", "--from", "hermes", "scout", "hi", "--runner", "command"],
    ["send", "--from", "hermes", "scout", "hi", "--runner", "hermes"],
    ["doctor"],  # was: exit 1, "[block] hermes CLI: no `hermes` executable found", never naming the value
    ["doctor", "--json"],
])
def test_a_cli_that_is_no_executable_is_a_usage_error_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """`--cli /usr/bin/hermse` (a typo) was taken: serve ran, and every turn failed (--runner command) or the
    hermes runner passed it over for another hermes found beside python or on PATH, saying nothing."""
    root = create_demo_root(tmp_path / "root")
    missing = tmp_path / "no-such-hermes"
    assert main([command[0], "--root", str(root), *command[1:], "--cli", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --cli {missing}: no executable file by that path or name on PATH; give the "
                          "hermes executable's path, or leave --cli out"), err
    assert not (root / "bot_relay" / "journal").exists() or not any((root / "bot_relay" / "journal").iterdir())


@pytest.mark.parametrize("argv", [
    ["serve", "--root", "R", "--runner", "demo"],
    ["room", "create", "--root", "R", "plan", "alice", "bob", "--runner", "demo"],
    ["room", "create", "--root", "R", "plan", "alice", "bob"],
    ["room", "send", "--root", "R", "plan", "hi", "--runner", "demo"],
    ["room", "disband", "--root", "R", "plan"],
], ids=["serve --runner demo", "room create --runner demo", "room create", "room send --runner demo", "room disband"])
def test_every_command_taking_cli_refuses_one_that_names_no_executable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """Regression (CLI review): with `--runner demo`, `serve` and `room create|send` took a `--cli /nonexistent`
    (exit 0), while `send … --runner demo --cli /nonexistent` is refused (exit 2) as operations.md's exit-code
    table says: one rule now, whatever --runner says."""
    served: list[object] = []
    monkeypatch.setattr("hermes_actors.cli.serve.serve", lambda *args, **kwargs: served.append(args) or 0)
    root = make_root(tmp_path)
    missing = tmp_path / "no-such-hermes"
    assert main([str(root) if arg == "R" else arg for arg in argv] + ["--cli", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"error: --cli {missing}: no executable file by that path or name on PATH; give the "
                            "hermes executable's path, or leave --cli out (it is then found beside python, then on "
                            "PATH)\n")
    assert captured.out == "" and served == []
    assert not (root / "bot_relay").exists()  # nothing started, no room made


@pytest.mark.parametrize("extra", [[], ["--gateway"]])
@pytest.mark.parametrize("kind", ["missing", "not executable"])
def test_enable_refuses_a_cli_that_is_no_executable_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], kind: str
) -> None:
    """Regression: `enable --cli /nonexistent` passed the value over silently (a "Bot Chat" session was then made
    with another hermes, or none, "install hermes-agent"), where `doctor --cli` refuses it: now exit 2 naming it,
    before anything is written."""
    root = create_demo_root(tmp_path / "root")
    cli = tmp_path / "no-such-hermes"
    if kind == "not executable":
        cli.write_text("#!/bin/sh\n", encoding="utf-8")
        cli.chmod(0o644)
    before = {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}
    assert main(["enable", "--root", str(root), *extra, "--cli", str(cli)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: --cli {cli}: no executable file by that path or name on PATH"), captured
    assert captured.out == ""
    assert {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))} == before


def test_an_empty_cli_means_the_default_as_it_always_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--cli "$HERMES_CLI"` with the variable unset passes "": the default hermes, not a refusal (review: the
    --cli check refused it as `error: --cli : no executable …`)."""
    root = create_demo_root(tmp_path / "root")
    assert main(["send", "--root", str(root), "--from", "hermes", "scout", "hi", "--runner", "demo", "--cli", "",
                 "--wait", "30"]) == 0
    assert "--cli" not in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["send", "--root"])
    assert exit_info.value.code == 2


# Each subcommand with the arguments it requires (parsed only: an unknown option is refused before any runs).
_VALID_ARGV = {
    "demo": ["demo"], "roster": ["roster", "--root", "R"], "send": ["send", "--root", "R", "--from", "a", "b", "hi"],
    "outcome": ["outcome", "--root", "R", "0" * 32], "status": ["status", "--root", "R"],
    "doctor": ["doctor", "--root", "R"], "serve": ["serve", "--root", "R"], "relay": ["relay", "--root", "R"],
    "enable": ["enable", "--root", "R"], "disable": ["disable", "--root", "R"], "bench": ["bench", "--quick"],
    "room create": ["room", "create", "--root", "R", "x", "a", "b"], "room send": ["room", "send", "--root", "R", "x",
                                                                                "hi"],
    "room show": ["room", "show", "--root", "R", "x"], "room list": ["room", "list", "--root", "R"],
    "room disband": ["room", "disband", "--root", "R", "x"],
}


def test_every_subcommand_has_its_valid_argv_listed() -> None:
    assert sorted({name.split()[0] for name in _VALID_ARGV}) == sorted(COMMANDS)


@pytest.mark.parametrize(("name", "extra"), [(name, extra) for name in _VALID_ARGV for extra in (["--bogus"], ["stray"])
                                              if (name, extra) != ("room create", ["stray"])],  # one more member
                         ids=lambda value: value if isinstance(value, str) else value[0])
def test_an_unknown_argument_shows_the_usage_of_its_subcommand(
    name: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `send ... --bogus` printed the top-level usage (argparse leaves a subcommand's unknown
    words to the top-level parser), where every other argument error shows the subcommand's."""
    with pytest.raises(SystemExit) as exit_info:
        main([*_VALID_ARGV[name], *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: hermes-actors {name} "), err
    assert f"hermes-actors {name}: error: unrecognized arguments: {extra[0]}" in err


def _help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The --help text of ``argv``'s command, on one line (argparse wraps it to the terminal)."""
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_room_disband_help_says_runner_and_cli_are_unused(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (CLI review): `room disband --help` described --runner and --cli as "how turns run …", though
    disband runs no turn (operations.md: it takes them and uses neither)."""
    text = _help_of(["room", "disband"], capsys)
    unused = ("taken and unused: room disband runs no member turn (it asks the host or deletes the room's file); kept "
              "for older scripts that pass it")
    assert f"--runner {{hermes,command,demo}} {unused} --cli CLI {unused}" in text, text
    assert "how turns run" not in text and "how turns run" in _help_of(["room", "create"], capsys)


def test_outcome_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (CLI review): `outcome`'s help listed exit codes 0 and 1, not 2 (a malformed id is exit 2), and
    `outcome --help` showed none."""
    says = ("the outcome of a delivery the root knows (exit 0 replied or silent, 1 failed, ambiguous, pending or "
            "unknown, 2 a malformed id or another usage error)")
    assert says in _help_of(["outcome"], capsys) and says in _help_of([], capsys)


@pytest.mark.parametrize("argv", [["-v", "status"], ["status", "-v"], ["status", "-vv"], ["-v", "status", "-v"]])
def test_verbose_is_accepted_anywhere(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    assert main([*argv, "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["running"] is False


@pytest.mark.parametrize(("argv", "count"), [
    (["room", "-v", "create"], 1),  # was 0: room create's own count replaced it
    (["room", "create", "-v"], 1),
    (["-v", "room", "create"], 1),
    (["-v", "room", "-v", "create", "-vv"], 4),
    (["room", "-vv", "create", "-v"], 3),
    (["room", "create"], 0),
])
def test_verbose_counts_wherever_it_is_given_room_subcommands_included(
    argv: list[str], count: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI review): `room -v create …` logged no INFO line (docs/quickstart.md: -v works anywhere on
    the line, and `room --help` shows [-v]): argparse copies a nested subcommand's namespace over its parent's,
    and `create`'s -v count, 0, replaced room's 1."""
    levels: list[int] = []
    # the module (hermes_actors.cli's `main` is the function)
    monkeypatch.setattr(importlib.import_module("hermes_actors.cli.main"), "_enable_logging", levels.append)
    # no root there: the command ends at once (exit 2), after the logging was set up
    assert main([*argv, "--root", str(tmp_path / "none"), "plan", "alice", "bob"]) == 2
    assert levels == [count]


@pytest.mark.parametrize(("argv", "line"), [
    (["room", "--root", "R", "list"],
     "hermes-actors room: error: --root goes after the command, not before it: hermes-actors room list --root …"),
    (["--root", "R", "status"],
     "hermes-actors: error: --root goes after the command, not before it: hermes-actors status --root …"),
    (["room", "--root", "R"],
     "hermes-actors room: error: --root goes after the command, not before it: hermes-actors room COMMAND --root …, "
     "COMMAND one of create, send, show, list, disband"),
    ([], "hermes-actors: error: a command is required: hermes-actors COMMAND …, COMMAND one of demo, roster, send, "
         "outcome, status, doctor, room, serve, relay, enable, disable, bench (hermes-actors --help says what each "
         "does)"),
    (["room"], "hermes-actors room: error: a command is required: hermes-actors room COMMAND …, COMMAND one of create, "
               "send, show, list, disband (hermes-actors room --help says what each does)"),
    (["room", "-v", "lst"], "hermes-actors room: error: 'lst' is not a command of hermes-actors room: choose one of "
                            "create, send, show, list, disband"),
], ids=["room --root R list", "--root R status", "room --root R", "nothing", "room", "room -v lst"])
def test_a_missing_or_misplaced_command_is_refused_naming_what_to_type(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI review): `room --root x list` said `argument room_command: invalid choice: 'x'` (argparse's
    dest, never --root), `hermes-actors` alone `the following arguments are required: command`."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == line


def test_roster_shows_peers_and_says_when_the_install_is_not_managed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_root(tmp_path, {"alice": {}}, managed=False, config={"bot_peers": {"mini": {}}})
    assert main(["roster", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "peers: mini" in out
    assert "not Bot-Mode-managed" in out and f"hermes-actors enable --root {root}" in out


def test_roster_pads_titles_as_they_are_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (diff review): `roster` padded a title, then escaped it: `Lead\u202eX` (its bidi override shown as
    six characters) pushed its connection column five places right of the header's."""
    root = make_root(tmp_path, {"alice": {"title": "Lead\u202eX"}, "bob": {}})
    assert main(["roster", "--root", str(root)]) == 0
    header, *lines = capsys.readouterr().out.split("\npeers:", 1)[0].split("\n")
    column = header.index("connection")
    assert "Lead\\u202eX " in lines[[line.startswith("@alice ") for line in lines].index(True)], lines
    assert [line[column:].split(" ", 1)[0] for line in lines] == ["local"] * len(lines), [header, *lines]


_BOT = {"handle": "alice", "profile": "alice", "title": "", "connection_id": None, "online": True}


@pytest.mark.parametrize(("fields", "cells"), [
    ({}, ["@alice", "alice", "", "local", "yes"]),
    ({"title": "Lead\u202eX"}, ["@alice", "alice", "Lead\\u202eX", "local", "yes"]),
    ({"title": "t" * 30}, ["@alice", "alice", "t" * 19 + "…", "local", "yes"]),
    ({"title": "\x1b" * 10}, ["@alice", "alice", ("\\x1b" * 5)[:19] + "…", "local", "yes"]),  # cut as shown
    ({"handle": "b\x07b", "profile": "p\x07p", "connection_id": "c\x07c", "online": None},
     ["@b\\x07b", "p\\x07p", "", "c\\x07c", "unknown"]),
], ids=["plain", "bidi-title", "long-title", "escaped-long-title", "escaped-names"])
def test_roster_table_pads_each_value_as_shown(fields: dict[str, Any], cells: list[str]) -> None:
    from hermes_actors.cli.render import roster_table

    header, line = roster_table([{**_BOT, **fields}]).split("\n")
    assert header == f"{'handle':<20} {'profile':<20} {'title':<20} {'connection':<16} online"
    assert line == f"{cells[0]:<20} {cells[1]:<20} {cells[2]:<20} {cells[3]:<16} {cells[4]}"


def test_send_on_an_unmanaged_install_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal is the tool's text for a model ("not Bot-Mode-managed … Do not retry"): a person gets the fix."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, managed=False)
    assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi", "--runner", "demo"]) == 1
    captured = capsys.readouterr()
    assert "not Bot-Mode-managed" in captured.out
    assert f"fix: hermes-actors enable --root {root}" in captured.err


class _RealHermesLike:
    """A runner that says its turns run on the real Hermes: the roster then leaves off what hermes cannot run."""

    real_hermes = True

    def run_turn(self, turn: Turn) -> str:
        return "ok"


@pytest.mark.parametrize("hosted", [True, False], ids=["through-a-host", "without-a-host"])
def test_a_dm_refused_as_unmanaged_names_the_fix_host_or_not(
    hosted: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the fix note came from a second read of the root's files, not from the refusal: a gateway
    that saw the install unmanaged (here: its only managed profile, UPPER, is one hermes cannot run) refused
    every DM and the command printed the model's text alone, naming no fix."""
    root = make_root(tmp_path, {"alice": {"managed": False}, "bob": {"managed": False}, "UPPER": {"managed": True}},
                     managed=False)
    argv = ["send", "--root", str(root), "--from", "alice", "bob", "hi"]
    if hosted:
        with Gateway(root, runner=_RealHermesLike(), durable=False, serve_submit=True):
            code = main(argv)
    else:
        monkeypatch.setattr("hermes_actors.cli.gateway_options.runner_for", lambda *args: _RealHermesLike())
        code = main(argv)
    assert code == 1
    captured = capsys.readouterr()
    assert "refused [unknown]: This install is not Bot-Mode-managed" in captured.out
    assert f"fix: hermes-actors enable --root {root}" in captured.err
    assert ("no host serves" in captured.err) is not hosted


def test_a_send_without_a_host_says_the_sender_is_not_woken(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (acceptance run): `send --wait` with no host printed the reply and woke nobody (the journal had
    finished+delivered, no wake), while the same command through a host woke the sender, and nothing said so."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    monkeypatch.setattr("hermes_actors.cli.gateway_options.runner_for", lambda *args: _RealHermesLike())
    assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi", "--wait", "30"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "Reply from @bob: ok"
    assert "this command runs the DM itself and prints its outcome: alice is not woken with it" in captured.err
    assert "only a host wakes senders" in captured.err


def test_roster_says_when_no_host_serves_the_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Local profiles are listed online either way; without a host the bots' own DMs are refused, and it says so."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    assert main(["roster", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"note: no host serves {root}" in out and "runtime_offline" in out
    assert f"hermes-actors serve --root {root}" in out
    with Gateway(root, runner=RecordingRunner(), durable=False, serve_submit=True):
        assert main(["roster", "--root", str(root)]) == 0
        out = capsys.readouterr().out
    assert "@bob" in out and "no host serves" not in out


def test_roster_without_a_host_runs_none_of_the_dms_journaled_for_the_next_host(tmp_path: Path) -> None:
    """Regression (archrev): `roster` with no host started a whole gateway on the root to list it, with a runner
    answering "": the DMs a stopped host left journaled ran there, answered silent (`@bob … chose not to
    reply`) though bob never saw them. It now starts no gateway: they stay for the next host, which runs them."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    release = threading.Event()
    runner = RecordingRunner(held_on("blocker", release))
    host = Gateway(root, runner=runner, durable=True)
    host.subscribe(lambda outcome: release.set() if outcome["status"] == "ambiguous" else None)
    host.start()
    try:
        host.message_agent(sender="alice", target="bob", message="blocker")
        runner.wait_entered(1)
        queued = host.message_agent(sender="alice", target="bob", message="queued")["delivery_id"]
    finally:
        host.stop(timeout=0.3)  # the blocked turn ends ambiguous; the one queued behind it stays journaled
        release.set()
    assert main(["roster", "--root", str(root), "--json"]) == 0
    with pytest.raises(TimeoutError, match="the next gateway on"):  # still journaled, not run
        Gateway(root, runner=RecordingRunner(), durable=True).wait_outcome(queued, timeout=0)
    next_runner = RecordingRunner()
    with Gateway(root, runner=next_runner, durable=True) as next_host:
        assert next_host.wait_outcome(queued, timeout=20)["reply"] == "ok: queued"
    assert next_runner.bodies() == ["queued"]


def _remote(connection: str, profile: str, online: bool | None) -> RemoteAgent:
    return RemoteAgent(profile=profile, handle=profile, connection_id=connection, title=profile.title(), online=online)


_LOCAL = [ProfileInfo(profile="alice", handle="alice", home=Path("/r/profiles/alice"), display_name="Alice",
                      title="Researcher")]
_ROWS = (_remote("mini", "scout", True), _remote("mini", "quill", False), _remote("mini", "nib", None))


@pytest.mark.parametrize(("reading", "online"), [
    (RemoteRoster("file", "roster.json", _ROWS, 10.0), [True, False, None]),  # fresh: as each row says
    (RemoteRoster("file", "roster.json", _ROWS, 700.0), [None, None, None]),  # stale (> 600 s): unknown
    (RemoteRoster("file", "roster.json"), []),  # no roster.json
    (RemoteRoster("redis", "redis://h:6379/0", _ROWS, 0.0), [True, False, None]),  # read now
    (RemoteRoster("redis", "redis://h:6379/0", _ROWS[:1], None, error="TimeoutError: ..."), [False]),
    (RemoteRoster("redis", "redis://h:6379/0", error="ConnectionError: refused"), []),
])
def test_roster_rows_without_a_gateway_are_a_gateways_rows(reading: RemoteRoster, online: list[bool | None]) -> None:
    from hermes_actors.ops.remote_roster import roster_rows_read  # here: the CLI tests run on any version

    rows = roster_rows_read(_LOCAL, reading, now=1_000_000.0)
    assert rows[0] == {"profile": "alice", "handle": "alice", "display_name": "Alice", "title": "Researcher",
                       "description": "", "connection_id": None, "online": True}
    assert [(r["connection_id"], r["online"]) for r in rows[1:]] == [("mini", value) for value in online]
    assert [r["display_name"] for r in rows[1:]] == [r.title for r in reading.agents]


def test_roster_without_a_host_lists_what_a_gateway_on_the_root_lists(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path, {"alice": {"title": "Researcher"}, "bob": {}}, config={"bot_peers": {"mini": {}}})
    write_roster(RelayPaths.from_root(root), [
        {"profile": "scout", "handle": "scout", "connection_id": "mini", "title": "Scout", "online": True},
        {"profile": "quill", "handle": "quill", "connection_id": "mini", "online": False},
    ], now=time.time())
    assert main(["roster", "--root", str(root), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    with Gateway(root, runner=RecordingRunner(), durable=False) as gw:
        assert listed == gw.roster()
    remote = sorted((r["handle"], r["online"]) for r in listed if r["connection_id"])
    assert remote == [("quill", False), ("scout", True)]


def test_a_missing_root_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roster", "--root", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


_MAIN = "from hermes_actors.cli.main import main; raise SystemExit(main())"

# The demo in a child process whose TMPDIR is the test's, paused (until a signal) where argv[1] says: after the
# heading of its first step, its gateway running ("step"); with two of the four fan-in senders started, waiting at
# their barrier ("fan-in start"); with the four past it, their sends held until the gateway stops ("fan-in send");
# in the removal of its temporary root ("removal").
_PAUSED_DEMO = """
import shutil, signal, sys, threading, time
from pathlib import Path
from hermes_actors.demo import script

def pause():
    print("paused", file=sys.stderr, flush=True)
    signal.pause()

where = sys.argv[1]
if where == "step":
    said = script._Transcript.say
    def say(self, text):
        said(self, text)
        if text.startswith("\\n1."):
            pause()
    script._Transcript.say = say
elif where == "fan-in start":
    start, senders = threading.Thread.start, []
    def started(self):
        start(self)
        if getattr(self._target, "__name__", "") == "fire":
            senders.append(self)
            if len(senders) == 2:
                pause()
    threading.Thread.start = started
elif where == "fan-in send":
    send, first = script._send, threading.Lock()
    def sent_once_stopped(gw, t, sender, target, message):
        if threading.current_thread() is not threading.main_thread():
            if first.acquire(blocking=False):
                print("paused", file=sys.stderr, flush=True)
            deadline = time.monotonic() + 60
            while gw.running and time.monotonic() < deadline:
                time.sleep(0.01)
        return send(gw, t, sender, target, message)
    script._send = sent_once_stopped
else:
    removed, paused = shutil.rmtree, []
    def rmtree(path, *args, **kwargs):
        if not paused and Path(path).name.startswith("hermes-actors-demo-"):
            paused.append(path)
            pause()
        removed(path, *args, **kwargs)
    shutil.rmtree = rmtree
from hermes_actors.cli.main import main
raise SystemExit(main(["demo"]))
"""


@pytest.mark.parametrize(("where", "sig"), [("step", signal.SIGTERM), ("step", signal.SIGHUP),
                                            ("fan-in start", signal.SIGTERM), ("fan-in send", signal.SIGINT),
                                            ("removal", signal.SIGTERM)])
def test_the_demo_stopped_by_a_signal_removes_its_root(tmp_path: Path, where: str, sig: signal.Signals) -> None:
    """Regression (CLI exit-code review): SIGTERM or SIGHUP killed `hermes-actors demo` outright (Ctrl-C stopped it),
    leaving its temporary root with its gateway's heartbeat (bot_relay/gateways/<pid>.json); a signal in the middle
    of the removal (Ctrl-C's too) left the rest. Either now stops it as Ctrl-C does: the root is removed and the
    exit code is the signal's (128 + its number). One during the fan-in (Ctrl-C's too) left senders waiting at
    their barrier for ever, the process never exiting, or printed their tracebacks (`gateway is not running`)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_DEMO, where], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "paused\n"
        assert [p.name.startswith("hermes-actors-demo-") for p in tmp.iterdir()] == [True]  # its root, as it runs
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err, err
    assert list(tmp.iterdir()) == []


def test_the_demo_whose_stdout_reader_left_removes_its_root(tmp_path: Path) -> None:
    """Regression (CLI exit-code review): with stdout a pipe whose reader had left and PYTHONUNBUFFERED=1, the demo's
    first line failed (BrokenPipeError) before the code that removes its temporary root, which stayed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run([sys.executable, "-c", _MAIN, "demo"], stdin=subprocess.DEVNULL, stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert list(tmp.iterdir()) == []


# The console script as pip writes it for pyproject's entry point, in a child process whose import of the module
# argv[1] names waits for a signal: a Ctrl-C that lands while the command line is still loading. The child takes
# SIGINT as a command a terminal runs in the foreground does: a test run started in the background (a CI job, `&`)
# ignores SIGINT, its children inherit that, and the held import then never ended (the stress run's failure).
_CONSOLE_SCRIPT = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class HeldImport:
    def find_spec(self, name, path=None, target=None):
        if name == held:
            print("importing", name, file=sys.stderr, flush=True)
            signal.pause()
        return None

held = sys.argv.pop(1)
sys.meta_path.insert(0, HeldImport())
from {module} import {function}
sys.exit({function}())
"""


@pytest.mark.parametrize("held", ["actors", "hermes_actors.cli.room"])
def test_a_ctrl_c_while_the_command_line_loads_exits_130_without_a_traceback(tmp_path: Path, held: str) -> None:
    """Regression (CLI exit-code review): a Ctrl-C in the first quarter second of `hermes-actors …`, while it imports
    the command line (the actor toolkit: `actors`) or parses its arguments (the room commands' module), printed a
    KeyboardInterrupt traceback and the process died of SIGINT; a later one exits 130 without a word. Both now
    exit 130 without a word."""
    import tomllib

    entry = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text(encoding="utf-8"))
    module, function = entry["project"]["scripts"]["hermes-actors"].split(":")
    script = _CONSOLE_SCRIPT.format(module=module, function=function)
    root = make_root(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", script, held, "status", "--root", str(root)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == f"importing {held}\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out, err) == (130, "", "")


def test_the_demo_runs_its_script_and_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for needle in ("Reply from @scout", "target_busy", "intentional silence", "Invalid target",
                   "Reply from @dave on mini", "Summary"):
        assert needle in out
    assert "[reason: " not in out and "target_busy: another" not in out  # the reason is said once
    assert "refused [unknown]: no teammate named 'nobody'" in out


@pytest.mark.parametrize(
    ("request_text", "answer"),
    [("Shorten para 2.", "Shortened para 2"), ("Draft the intro.", "intro"), ("And a title, please.", "Title:"),
     ("Add the EU numbers.", "EU numbers")],
)
def test_the_demo_writer_answers_the_request_it_got(request_text: str, answer: str) -> None:
    runner = DemoRunner(delays={"scribe": 0.0})
    turn = Turn(profile="scribe", content=f"Message from 🤖 Critic (@critic): {request_text}", delivery_id="c" * 32)
    assert answer in runner.run_turn(turn)


def test_room_commands_create_send_show_list_disband(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    base = ["--root", str(root), "--runner", "demo"]
    assert main(["room", "create", "launch", "hermes", "scout", "critic", *base]) == 0  # a human line by default
    created = capsys.readouterr().out.strip()
    assert main(["room", "show", "launch", *base[:2]]) == 0  # no message yet: said on stderr, stdout stays empty
    empty = capsys.readouterr()
    assert (empty.out, empty.err) == ("", "room launch has no messages yet\n")
    assert main(["room", "list", "--json", *base[:2]]) == 0
    [room] = [{k: r[k] for k in ("room_id", "name", "members")} for r in json.loads(capsys.readouterr().out)]
    assert room["name"] == "launch" and room["members"] == ["hermes", "scout", "critic"]
    assert created == f"room launch created ({room['room_id']}): @hermes, @scout, @critic"

    assert main(["room", "send", "launch", "What do we need for Friday?", *base, "--wait", "30"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("queued in room launch: message ") and len(lines[0].split()[-1]) == 32
    assert lines[1].startswith("[1] hermes: ") and lines[-1] == "room is needs_you"
    assert any(line.startswith("[2] hermes: @user") for line in lines)

    assert main(["room", "show", "launch", *base[:2]]) == 0
    shown = capsys.readouterr().out.strip().splitlines()
    assert shown[0] == "[0] user: What do we need for Friday?" and shown[1:] == lines[1:-1]

    assert main(["room", "list", "--json", *base[:2]]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{**room, "state": "needs_you", "messages": len(shown), "last_activity": rows[0]["last_activity"]}]

    assert main(["room", "disband", "launch", *base]) == 0  # --runner still taken (older scripts), unused
    assert capsys.readouterr().out.strip() == (f"room launch disbanded ({room['room_id']}); its members' sessions "
                                               "stay")
    assert main(["room", "list", "--json", *base[:2]]) == 0
    assert json.loads(capsys.readouterr().out) == []


_ROW = {"room_id": "a" * 32, "state": "idle", "messages": 3, "members": ["alice", "bob"]}


@pytest.mark.parametrize(("names", "width"), [
    ([], 24), (["plan"], 24), (["x" * 24], 24),
    (["project-alpha-discussion-one", "project-alpha-discussion-two"], 28), (["p" * 64, "q"], 64),
], ids=["none", "short", "24", "two-long", "64"])
def test_room_list_shows_names_whole(names: list[str], width: int) -> None:
    """Regression (CLI fuzz): `room list` cut names at 24 characters without a mark, so
    `project-alpha-discussion-one` and `…-two` looked the same. Names are shown whole, the column as wide as the
    longest (a room is addressed by its name, as a bot by its handle on the roster)."""
    from hermes_actors.cli.render import rooms_table

    header, *lines = rooms_table([{**_ROW, "name": name} for name in names]).split("\n")
    assert header == f"{'name':<{width}} {'room_id':<32} {'state':<10} {'messages':>8}  members"
    assert lines == [f"{name:<{width}} {'a' * 32} idle       {3:>8}  @alice, @bob" for name in names]


def test_room_list_pads_names_as_they_are_shown() -> None:
    """Regression (CLI review): `room list` padded a name, then escaped it: `plän ☕ \u202ex` (its bidi override
    shown as six characters) pushed its room_id five columns right of the others'."""
    from hermes_actors.cli.render import rooms_table

    header, *lines = rooms_table([{**_ROW, "name": name} for name in ("plän ☕ \u202ex", "plan")]).split("\n")
    assert lines[0].startswith("plän ☕ \\u202ex ")
    assert [line.index("a" * 32) for line in lines] == [header.index("room_id")] * 2, [header, *lines]


def test_room_list_prints_the_whole_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    base = ["--root", str(root), "--runner", "demo"]
    for name in ("project-alpha-discussion-one", "project-alpha-discussion-two"):
        assert main(["room", "create", name, "scout", "critic", *base]) == 0
    capsys.readouterr()
    assert main(["room", "list", *base[:2]]) == 0
    assert sorted(line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]) == [
        "project-alpha-discussion-one", "project-alpha-discussion-two"]


def test_room_command_errors_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    base = ["--root", str(root), "--runner", "demo"]
    assert main(["room", "create", "solo", "hermes", *base]) == 2
    assert "a room has 2 to 6 members, not 1" in capsys.readouterr().err
    assert main(["room", "show", "nowhere", *base[:2]]) == 2
    err = capsys.readouterr().err
    assert "no room 'nowhere'" in err and "hermes-actors room list" in err  # a CLI user is told a command
    assert main(["room", "create", "duo", "hermes", "scout", *base]) == 0
    capsys.readouterr()
    assert main(["room", "send", "duo", "   ", *base]) == 1  # a refusal (docs/operations.md, exit codes)
    assert capsys.readouterr().out.startswith("refused [unknown]: text is required")


def test_send_to_a_missing_root_says_only_that(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["send", "--root", str(missing), "--from", "alice", "bob", "hi"]) == 2
    err = capsys.readouterr().err
    assert f"Hermes root {str(missing)!r} does not exist" in err
    assert "no host serves" not in err  # not the misleading "running this DM inside this command" note
    assert not missing.exists()  # and nothing was created there


@pytest.mark.parametrize("command", [["status"], ["roster"], ["doctor"], ["enable"], ["send", "--from", "a", "b", "x"]])
def test_a_profile_home_passed_as_the_root_is_refused_naming_the_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    root = make_root(tmp_path, {"alice": {}}, config={"bot_mode": {}})
    home = root / "profiles" / "alice"
    before = sorted(p.name for p in home.iterdir())
    assert main([command[0], "--root", str(home), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert f"is the home of profile 'alice' of the Hermes root {str(root)!r}" in err and f"--root {root}" in err
    assert sorted(p.name for p in home.iterdir()) == before  # nothing (no bot_relay/) was created in it


@pytest.mark.parametrize("command", [["status"], ["roster"], ["doctor"], ["enable"], ["send", "--from", "a", "b", "x"]])
def test_a_directory_that_is_no_hermes_root_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    somewhere = tmp_path / "home"  # e.g. a mistyped --root ~
    somewhere.mkdir()
    (somewhere / "notes.txt").write_text("mine\n", encoding="utf-8")
    assert main([command[0], "--root", str(somewhere), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert f"{str(somewhere)!r} does not look like a Hermes root" in err and "HERMES_HOME" in err
    assert sorted(p.name for p in somewhere.iterdir()) == ["notes.txt"]  # no bot_relay/, config.yaml, state.db


@pytest.mark.parametrize("command", [["room", "list"], ["room", "show", "plan"], ["room", "disband", "plan"]])
def test_room_commands_refuse_a_directory_that_is_no_hermes_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    somewhere = tmp_path / "home"
    somewhere.mkdir()
    assert main([*command[:2], "--root", str(somewhere), *command[2:]]) == 2
    assert f"{str(somewhere)!r} does not look like a Hermes root" in capsys.readouterr().err
    assert list(somewhere.iterdir()) == []


ROOT_COMMANDS = [["status"], ["roster"], ["doctor"], ["outcome", "0" * 32], ["send", "--from", "a", "b", "x"],
                 ["room", "list"], ["enable"], ["disable"], ["serve", "--runner", "demo"], ["relay"]]


def _with_root(command: list[str], root: str) -> list[str]:
    head = 2 if command[0] == "room" else 1
    return [*command[:head], "--root", root, *command[head:]]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize("command", ROOT_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_root_of_another_user_is_refused_naming_its_owner_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Regression (ops review): another user got `error: [Errno 13] Permission denied: '<root>/config.yaml'` (or
    `.../bot_relay/run`, or an ERROR to move a symlink aside that was not there); root went on and wrote root's
    files into it, which the owner's own gateway then refuses as another uid's."""
    root = make_root(tmp_path)
    (root / "bot_relay" / "run").mkdir(parents=True, mode=0o700)  # a root its owner has served
    for path in [root, *root.rglob("*")]:
        os.chown(path, 65534, 65534)
    before = sorted(p.name for p in root.iterdir())
    assert main(_with_root(command, str(root))) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: Hermes root {str(root)!r} belongs to uid 65534, not to you (uid {os.getuid()}): run hermes-actors "
        "as the user who owns it (the one hermes runs as), e.g. sudo -u <that user> hermes-actors ...")
    assert sorted(p.name for p in root.iterdir()) == before  # no bot_relay/, nothing written


@pytest.mark.parametrize("command", ROOT_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("given", ["x" * 100_000, "/" + "a" * 256 + "/r"], ids=["huge", "a name too long"])
def test_a_root_longer_than_a_path_can_be_is_a_usage_error_that_does_not_repeat_it(
    capsys: pytest.CaptureFixture[str], command: list[str], given: str
) -> None:
    """Regression (ops review): `--root <100,000 characters>` failed with exit 1 and
    `error: [Errno 36] File name too long: '<all 100,000 of them>'`."""
    with pytest.raises(SystemExit) as exited:
        main(_with_root(command, given))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "is longer than a path can be (under 4,096 bytes, at most 255 per name); pass its directory" in err, err
    assert len(err) < 1000


_NO_USER = "~hermes-actors-no-such-user"  # no account is named so


@pytest.mark.parametrize("command", ROOT_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_root_under_a_user_that_does_not_exist_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Regression (CLI fuzz): `status --root '~nosuchuser/x'` died with a traceback (RuntimeError: Could not
    determine home directory., exit 1) while the other commands said `Hermes root './~nosuchuser/x' does not
    exist` (the value read as a folder of the working directory): one rule, exit 2 naming the value."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / _NO_USER / "x").mkdir(parents=True)  # not taken for it either
    with pytest.raises(SystemExit) as exited:
        main(_with_root(command, f"{_NO_USER}/x"))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (f"error: argument --root: '{_NO_USER}/x': cannot expand '{_NO_USER}' (no user '{_NO_USER[1:]}'); "
            "write the path out, or start it with ./ for a name in the current directory") in err, err
    assert sorted(p.name for p in (tmp_path / _NO_USER / "x").iterdir()) == []


@pytest.mark.parametrize("argv", [["bench", "--out", f"{_NO_USER}/r"], ["enable", "--root", "R", "--cli", _NO_USER],
                                  ["send", "--root", "R", "--cli", _NO_USER, "--from", "a", "b", "x"]],
                         ids=["bench --out", "enable --cli", "send --cli"])
def test_every_path_option_expands_a_user_home_by_the_one_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path) if a == "R" else a for a in argv])
    assert exited.value.code == 2
    option = next(a for a in argv if a.startswith("--") and a != "--root")
    assert f"error: argument {option}: '{_NO_USER}" in capsys.readouterr().err


def test_a_root_under_the_home_is_expanded_once_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_root(tmp_path / "home", name="hermes-root")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["status", "--root", "~/hermes-root", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["root"] == str(tmp_path / "home" / "hermes-root")


@pytest.mark.parametrize("command", ROOT_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_root_that_is_not_utf8_is_refused_naming_the_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Regression (CLI fuzz): `--root $'\\xff\\xfe'` was echoed as '\\udcff\\udcfe'; an existing root of that name
    was served while its host could answer nothing (orjson refused the root's name: `status --json` died with a
    TypeError). Refused as every other non-UTF-8 argument is, naming the byte."""
    root = os.fsdecode(os.fsencode(str(tmp_path)) + b"/r\xff")
    os.mkdir(root)
    with pytest.raises(SystemExit) as exited:
        main(_with_root(command, root))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (f"error: argument --root: is not valid UTF-8 text (byte 0xff at character {len(root) - 1}); pass it in "
            "UTF-8") in err, err
    assert "\\udcff" not in err and os.listdir(root) == []


@pytest.mark.parametrize(("argv", "code", "line"), [
    (["serve", "--root", "R", "--http", ":" + "1" * 100_000], 2,
     f"error: --http ':{'1' * 58}…' (100,001 characters): the port '{'1' * 59}…' (100,000 characters) is out of "
     "range (0-65535)"),
    (["serve", "--root", "R", "--http", ":\u00b2"], 2,
     "error: --http ':\u00b2': the port '\u00b2' is not a number (e.g. 127.0.0.1:9464, :9464 or [::1]:9464)"),
    (["roster", "--root", "R", "--redis", "redis://h:" + "1" * 100_000 + "/0", "--connection-id", "a"], 2,
     f"has port '{'1' * 59}…' (100,000 characters): a port is a whole number from 1 to 65535"),
    (["roster", "--root", "R", "--redis", "redis://h:6379/" + "1" * 100_000, "--connection-id", "a"], 2,
     f"has database index '{'1' * 59}…' (100,000 characters): the /N at its end is a database number"),
    (["roster", "--root", "R", "--redis", "redis://h:6379/0?db=" + "1" * 100_000, "--connection-id", "a"], 2,
     f"has database index '{'1' * 59}…' (100,000 characters) (db=): a database is a whole number"),
    (["bench", "--sustained-seconds", "1" * 100_000], 2,
     f"hermes-actors bench: error: argument --sustained-seconds: '{'1' * 59}…' (100,000 characters): the sustained "
     "run must last more than 0 and at most 86,400 seconds"),
], ids=["--http port", "--http port '\u00b2'", "--redis port", "--redis /db",
        "--redis ?db=", "bench --sustained-seconds"])
def test_a_number_of_100000_digits_is_refused_naming_its_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, line: str
) -> None:
    """Regression (CLI fuzz): `serve --http :<100,000 digits>` said `error: Exceeds the limit (4300 digits) for
    integer string conversion …; use sys.set_int_max_str_digits()`, naming no option and giving Python's own
    advice; `--http :²` said `invalid literal for int() with base 10: '²'`; a --redis port was repeated whole
    (100,000 characters), a --redis database of 100,000 digits passed (the client's int() failed at the first
    connection); `bench --sustained-seconds <100,000 digits>` read infinity and held its load for ever."""
    root = make_root(tmp_path)
    got, out = _exit_and_output([str(root) if a == "R" else a for a in argv], capsys)
    assert got == code, out[-500:]
    assert line in out and "set_int_max_str_digits" not in out, out[-500:]
    assert len(out) < 1500, out[-500:]
    assert not (root / "bot_relay").exists()  # refused before anything started


@pytest.mark.parametrize("command", [["enable"], ["disable"]])
def test_enable_and_disable_refuse_an_empty_root_as_every_command_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Regression (ops review): `enable --root ''` was read as the current directory (`'/home/me/src' does not
    look like a Hermes root`), and would have edited it had it been one."""
    monkeypatch.chdir(make_root(tmp_path))
    with pytest.raises(SystemExit) as exited:
        main([*command, "--root", ""])
    assert exited.value.code == 2
    assert "the Hermes root is empty; pass its directory" in capsys.readouterr().err
    assert not (tmp_path / "hermes-root" / "bot_relay").exists()


# (id, argv with V for the value, exit code, the line naming it: {q} as repr names it, {bare} as it is typed,
# {quoted} as the seed's '<value>')
VALUE_ERRORS = [
    ("outcome id", ["outcome", "--root", "R", "V"], 2,
     "error: {q} is not a delivery id (32 hexadecimal characters, as `send` prints)"),
    ("outcome --wait", ["outcome", "--root", "R", "0" * 32, "--wait", "V"], 2,
     "error: argument --wait: {q} is not a number of seconds"),
    ("roster --connection-id", ["roster", "--root", "R", "--connection-id", "V"], 2,
     "error: connection id {q} must be 1-64 letters, digits, '_' or '-' (starting with a letter or digit)"),
    ("relay --name", ["relay", "--root", "R", "--name", "V"], 2,
     ": connection id {q} must be 1-64 letters, digits, '_' or '-' (starting with a letter or digit)"),
    ("roster --redis", ["roster", "--root", "R", "--redis", "V"], 2,
     "error: --redis {q} is not a redis://, rediss:// or unix:// URL (e.g. redis://127.0.0.1:6379/0), nor 'redis' "
     "to read REDIS_URL"),
    ("serve --http", ["serve", "--root", "R", "--http", "V"], 2,
     "error: --http {q}: the port {q} is not a number (e.g. 127.0.0.1:9464, :9464 or [::1]:9464)"),
    ("enable --profiles", ["enable", "--root", "R", "--profiles", "V"], 2,
     "error: no such profile on R: {bare} (known: default, alice, bob, carol)"),
    ("disable --profiles", ["disable", "--root", "R", "--profiles", "V"], 2,
     "error: no such profile on R, nor in what enable recorded: {bare} (known: alice, bob, carol, default)"),
    ("room show", ["room", "show", "--root", "R", "V"], 2,
     "error: no room {q}: pass the id or name of an existing room (Gateway.list_rooms(); on the command line: "
     "hermes-actors room list)"),
    # Regression (acceptance review): an unknown room was a refused send (exit 1, `refused [unknown]: no room …`)
    ("room send", ["room", "send", "--root", "R", "--runner", "demo", "V", "hi"], 2,
     "error: no room {q}: pass the id or name of an existing room (Gateway.list_rooms(); on the command line: "
     "hermes-actors room list)"),
    ("room disband", ["room", "disband", "--root", "R", "--runner", "demo", "V"], 2,
     "error: no room {q}: pass the id or name of an existing room (Gateway.list_rooms(); on the command line: "
     "hermes-actors room list)"),
    ("room create member", ["room", "create", "--root", "R", "x", "alice", "V"], 2,
     "error: unknown member {q}: no local profile with that name"),
    ("send --from", ["send", "--root", "R", "--runner", "demo", "--from", "V", "bob", "hi"], 1,
     "refused [unknown]: Unknown sender {q}: no profile with that name on this install — teammates: @hermes, "
     "@alice, @bob, @carol"),
    ("send target", ["send", "--root", "R", "--runner", "demo", "--from", "alice", "V", "hi"], 1,
     "refused [unknown]: Invalid target: {q} — teammates: @hermes, @bob, @carol"),
    ("send target@connection", ["send", "--root", "R", "--runner", "demo", "--from", "alice", "bob@V", "hi"], 1,
     "refused [unknown]: no teammate named {quoted} — teammates: @hermes, @bob, @carol"),
    # argparse's own refusals
    ("a subcommand", ["V"], 2, "hermes-actors: error: {q} is not a command of hermes-actors: choose one of demo, "),
    ("a room subcommand", ["room", "V"], 2,
     "hermes-actors room: error: {q} is not a command of hermes-actors room: choose one of create, send, show, list, "
     "disband"),
    ("serve --runner", ["serve", "--root", "R", "--runner", "V"], 2,
     "error: argument --runner: invalid choice: {q} (choose from 'hermes', 'command', 'demo')"),
    ("enable --port", ["enable", "--root", "R", "--gateway", "--port", "V"], 2,
     "error: argument --port: invalid int value: {q}"),
    ("status --connection-id", ["status", "--root", "R", "--connection-id", "V"], 2,
     "hermes-actors status: error: unrecognized arguments: --connection-id {bare}"),
    ("bench --scenario", ["bench", "--scenario", "V"], 2, "error: unknown scenario(s) {q}; known: local-roundtrip, "),
    ("bench --sustained-seconds", ["bench", "--sustained-seconds", "V"], 2,
     "hermes-actors bench: error: argument --sustained-seconds: {q} is not a number of seconds"),
]


def _exit_and_output(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exited:  # argparse's usage errors
        code = int(exited.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(("argv", "code", "line"), [c[1:] for c in VALUE_ERRORS], ids=[c[0] for c in VALUE_ERRORS])
@pytest.mark.parametrize("size", ["huge", "at the bound"])
def test_an_error_names_a_huge_value_cut_with_its_length_and_a_normal_one_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, line: str, size: str
) -> None:
    """Regression (CLI fuzz): each of these errors repeated a 100,000-character argument whole (the port of
    --http twice). Up to 200 characters a value is named as before; past that, its first words and its length."""
    root = str(make_root(tmp_path))
    affix = next(a.replace("V", "") for a in argv if "V" in a)  # 'bob@V': the value typed is 'bob@<value>'
    typed = affix + "a" * ((100_000 if size == "huge" else 200) - len(affix))
    if size == "huge":
        q = bare = quoted = f"'{typed[:59]}…' ({len(typed):,} characters)"
    else:
        q, bare, quoted = repr(typed), typed, f"'{typed}'"
    given = [root if a == "R" else a.replace("V", "a" * (len(typed) - len(affix))) if "V" in a else a for a in argv]
    got, out = _exit_and_output(given, capsys)
    assert got == code, out[-500:]
    assert line.format(q=q, bare=bare, quoted=quoted).replace("on R", f"on {root}") in out, out[-500:]
    if size == "huge":
        assert len(out) < 1000 + len(root) * 2, out[-500:]


def test_bench_out_longer_than_a_name_can_be_is_a_usage_error_naming_it_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI fuzz): `bench --out <100,000 characters>` failed with exit 1 and `[Errno 36] File name too
    long: '<all of it>'` (Path.exists() raised it while the refusal was being worded)."""
    out = str(tmp_path / ("a" * 100_000))
    code, printed = _exit_and_output(["bench", "--out", out, "--no-progress"], capsys)
    assert code == 2
    assert (f"error: --out '{out[:59]}…' ({len(out):,} characters) must be a directory bench can create and write its "
            "results in (File name too long)") in printed
    assert len(printed) < 1000


@pytest.mark.parametrize(("url", "shown"), [("redis://[::1", "'redis://[::1'"),
                                            ("redis://me:s3cret@[::1:6379", "'redis://***@[::1:6379'")])
def test_a_redis_url_that_does_not_parse_is_named_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, shown: str
) -> None:
    """Regression (ops review): `--redis redis://[::1` said only `error: Invalid IPv6 URL` (the masking of the URL
    for the message failed on it): the option, the URL (its password masked) and the fix are named."""
    root = make_root(tmp_path)
    assert main(["roster", "--root", str(root), "--redis", url]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: --redis {shown} is not a valid URL (Invalid IPv6 URL; an IPv6 host goes in "
                           "brackets: redis://[::1]:6379/0)")
    assert "s3cret" not in err


def test_a_profile_home_of_a_fresh_hermes_root_is_refused_naming_the_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hermes-agent 0.19's `hermes profile create alice` leaves only profiles/ and logs/ in the root, and a .env
    in the profile's home: that home passed as --root was taken for a root (and enable made it one)."""
    root = tmp_path / "fresh"
    home = root / "profiles" / "alice"
    home.mkdir(parents=True)
    (root / "logs").mkdir()
    (home / ".env").write_text("", encoding="utf-8")
    assert main(["enable", "--root", str(home)]) == 2
    err = capsys.readouterr().err
    assert f"is the home of profile 'alice' of the Hermes root {str(root)!r}" in err
    assert sorted(p.name for p in home.iterdir()) == [".env"]


def test_ctrl_c_while_send_waits_says_where_the_outcome_will_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.gateway import Gateway

    root = make_root(tmp_path, {"alice": {}, "bob": {}})

    def interrupted(self: Gateway, delivery_id: str, timeout: float = 30) -> dict[str, object]:
        raise KeyboardInterrupt

    monkeypatch.setattr(Gateway, "wait_outcome", interrupted)
    assert main(["send", "--root", str(root), "--runner", "demo", "--from", "alice", "bob", "hi"]) == 130
    captured = capsys.readouterr()
    delivery_id = captured.out.split("delivery ")[1].split()[0]
    assert f"interrupted; the DM's outcome, once settled: hermes-actors outcome --root {root} {delivery_id}" in (
        captured.err
    )


def test_ctrl_c_while_send_waits_on_a_host_says_the_dm_stays_queued_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.hermes import submit_client

    root = make_root(tmp_path, {"alice": {}, "bob": {}})

    def interrupted(*args: object, **kwargs: object) -> dict[str, object]:
        raise KeyboardInterrupt

    with Gateway(root, runner=RecordingRunner(), durable=False, serve_submit=True):
        monkeypatch.setattr(submit_client, "fetch_outcome", interrupted)
        assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi", "--wait", "30"]) == 130
    captured = capsys.readouterr()
    delivery_id = captured.out.split("delivery ")[1].split()[0]
    assert (f"interrupted; the DM stays queued at the host; its outcome, once settled: hermes-actors outcome "
            f"--root {root} {delivery_id}") in captured.err


def test_roster_and_outcome_lines_never_pass_terminal_control_sequences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Titles and replies come from files and bots: an ESC or OSC would recolour, clear or retitle the terminal."""
    root = make_root(tmp_path, {"alice": {"title": "M\x1b[31mRED\x1b[2J"}, "bob": {"title": "\x1b]0;owned\x07x"}})
    assert main(["roster", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "M\\x1b[31mRED" in out  # shown, escaped, not dropped
    with Gateway(root, runner=RecordingRunner(lambda turn: "\x1b[2Jgotcha\u202e"), durable=False,
                 serve_submit=True) as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        gw.wait_outcome(ack["delivery_id"], timeout=10)
        assert main(["outcome", "--root", str(root), ack["delivery_id"]]) == 0
    out = capsys.readouterr().out
    assert out == "Reply from @bob: \\x1b[2Jgotcha\\u202e\n"


# A fake hermes whose turn has begun once ``started`` exists and ends only once the test creates ``release``
# (or fails after 60 s): the turn outlasts the send's --wait by construction, not by a sleep.
_HELD_TURN_CLI = """#!{python}
import os, sys, time
open({started!r}, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists({release!r}):
    if time.monotonic() > deadline:
        sys.exit("the test never released the turn")
    time.sleep(0.01)
print("late but here")
"""


def test_send_past_its_wait_still_prints_the_outcome_of_a_turn_that_finishes_while_it_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a host, the turn's grace at the stop let it finish: its reply was never printed (exit 1, 'pending').

    The turn is held until the stop waits for it: --wait runs out while it runs (it begins first), and it
    finishes within the stop's grace."""
    root = create_demo_root(tmp_path / "root")
    started, release = tmp_path / "turn-started", tmp_path / "turn-released"
    cli = write_fake_cli(tmp_path, _HELD_TURN_CLI.format(python=sys.executable, started=str(started),
                                                         release=str(release)))
    real_wait, real_stop = Gateway.wait_outcome, Gateway.stop
    stop_waited: list[int] = []

    def wait_outcome(gw: Gateway, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        if timeout > 0:  # the send's --wait: it runs out while the turn runs (a turn not begun would be cancelled)
            await_condition(started.exists, timeout=60, message="the turn began")
        return real_wait(gw, delivery_id, timeout)

    def stop(gw: Gateway, *args: Any, on_wait: Any = None, **kwargs: Any) -> Any:
        def waiting(running: int, grace: float) -> None:
            stop_waited.append(running)
            release.touch()  # the stop waits for the turn: it may finish now, within the grace
            if on_wait is not None:
                on_wait(running, grace)

        return real_stop(gw, *args, on_wait=waiting, **kwargs)

    monkeypatch.setattr(Gateway, "wait_outcome", wait_outcome)
    monkeypatch.setattr(Gateway, "stop", stop)
    code = main(["send", "--root", str(root), "--from", "hermes", "scout", "hi", "--cli", str(cli),
                 "--runner", "command", "--wait", "0.05"])
    captured = capsys.readouterr()
    assert stop_waited == [1], "the turn was not running when the stop began"
    assert "pending: " in captured.err and "stopping" in captured.err, captured.err
    assert captured.out.strip().splitlines()[-1] == "Reply from @scout: late but here", captured.out
    assert code == 0


@pytest.mark.parametrize("bad", ["../x", "a/b", "-lead", "x" * 65, "sp ace", "x\n", "."])
def test_a_bad_connection_id_is_refused_before_anything_runs(bad: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: a file-relay gateway accepted '../x' and wrote it into bot_relay/gateways/ and status."""
    root = make_root(tmp_path)
    with pytest.raises(ValueError, match=r"connection id .* must be 1-64 letters"):
        Gateway(root, runner="demo", connection_id=bad)
    assert main(["serve", "--root", str(root), "--runner", "demo", f"--connection-id={bad}"]) == 2
    assert "must be 1-64 letters" in capsys.readouterr().err
    assert not (root / "bot_relay" / "gateways").exists() or not any((root / "bot_relay" / "gateways").iterdir())
    Gateway(root, runner="demo", connection_id="alpha-1_B")  # a good one is taken as it is


@pytest.mark.parametrize(("option", "says"), [
    (["--connection-id", "bad id!"], "error: connection id 'bad id!' must be 1-64 letters"),
    (["--redis", "notaurl"], "error: --redis 'notaurl' is not a redis://, rediss:// or unix:// URL"),
    (["--redis", "http://u:secret@h/0"], "error: --redis 'http://u:***@h/0' is not a redis://"),
    # Regression (review): these passed, the note was printed, then redis-py's "Port out of range 0-65535" or
    # "Port could not be cast to integer value as 'abc'" (no option named); /abc silently meant database 0.
    (["--redis", "redis://:secret@127.0.0.1:99999/0"],
     "error: --redis 'redis://:***@127.0.0.1:99999/0' has port '99999': a port is a whole number from 1 to 65535"),
    (["--redis", "redis://127.0.0.1:abc/0"], "error: --redis 'redis://127.0.0.1:abc/0' has port 'abc'"),
    (["--redis", "redis://127.0.0.1:6379/abc"], "error: --redis 'redis://127.0.0.1:6379/abc' has database index 'abc'"),
])
@pytest.mark.parametrize("command", ["send", "roster"])
def test_a_bad_transport_option_is_the_only_thing_said(
    command: str, option: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: `send` printed "note: no host serves ...; this command runs the DM itself" before the error,
    and the --redis one named `bot_mode.transport`, a config key the user never typed."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    root = make_root(tmp_path)
    argv = ["send", "--root", str(root), "--from", "alice", "bob", "hi", "--runner", "demo"] if command == "send" \
        else ["roster", "--root", str(root)]
    assert main([*argv, *option]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [captured.err.strip()] and captured.err.startswith(says), captured.err
    assert "bot_mode.transport" not in captured.err and "secret" not in captured.err
    assert captured.out == ""
    assert not (root / "bot_relay" / "journal").exists()  # no gateway ran


def test_redis_read_from_a_redis_url_with_a_bad_port_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://u:secret@127.0.0.1:0/0")
    root = make_root(tmp_path)
    assert main(["serve", "--root", str(root), "--runner", "demo", "--redis", "redis"]) == 2
    assert capsys.readouterr().err == ("error: --redis redis reads REDIS_URL, and 'redis://u:***@127.0.0.1:0/0' has "
                                       "port 0: a port is a whole number from 1 to 65535 (e.g. "
                                       "redis://127.0.0.1:6379/0)\n")


def test_redis_read_from_an_unset_redis_url_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    root = make_root(tmp_path)
    assert main(["serve", "--root", str(root), "--runner", "demo", "--redis", "redis"]) == 2
    assert capsys.readouterr().err == "error: --redis redis reads the URL from REDIS_URL, which is not set\n"


@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
@pytest.mark.parametrize("command", [["serve", "--runner", "demo"], ["roster"],
                                     ["send", "--from", "alice", "bob", "hi", "--runner", "demo"]])
def test_an_empty_redis_is_refused_not_read_as_the_file_relay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str],
    value: str
) -> None:
    """Regression (CLI review): `serve --redis "" --connection-id laptop` (a `--redis "$REDIS"` with the variable
    unset) served on the FILE transport, exit 0, where an unset REDIS_URL behind `--redis redis` is refused."""
    served: list[object] = []
    monkeypatch.setattr("hermes_actors.cli.serve.serve", lambda *args, **kwargs: served.append(args) or 0)
    root = make_root(tmp_path)
    assert main([command[0], "--root", str(root), *command[1:], "--redis", value, "--connection-id", "laptop"]) == 2
    captured = capsys.readouterr()
    assert captured.err == ("error: --redis is empty: pass a redis://, rediss:// or unix:// URL (e.g. "
                            "redis://127.0.0.1:6379/0) or 'redis' to read REDIS_URL, or leave --redis out to use the "
                            "transport config.yaml sets\n")
    assert captured.out == "" and served == []
    assert not (root / "bot_relay" / "journal").exists()  # no gateway ran


@pytest.mark.parametrize(("names", "line"), [
    ([], "error: --root .: connection id '' must be 1-64 letters, digits, '_' or '-' (starting with a letter or "
         "digit); without --name a root's connection id is its folder name: give each --root a --name, in the same "
         "order"),
    (["--name", "alpha", "--name", "mi ni"], "error: --name 'mi ni' for --root .: connection id 'mi ni' must be 1-64 "
                                             "letters, digits, '_' or '-' (starting with a letter or digit)"),
], ids=["folder name", "--name"])
def test_relay_names_the_root_and_name_that_are_no_connection_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, names: list[str], line: str
) -> None:
    """Regression (CLI review): `relay --root $R --root .` said `error: connection id '' must match
    ^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}\\Z`, naming neither the root nor --name, with a `\\Z` where the docs write `$`."""
    root = make_root(tmp_path)
    monkeypatch.chdir(make_root(tmp_path, name="other"))
    assert main(["relay", "--root", str(root), "--root", ".", *names]) == 2
    assert capsys.readouterr().err == line + "\n"
    assert not (root / "bot_relay").exists()


def test_a_reader_leaving_the_pipe_early_gets_no_traceback(tmp_path: Path) -> None:
    """Regression: `hermes-actors status | head -3` printed a BrokenPipeError traceback."""
    import subprocess
    import sys

    from bench.roots import write_root

    root = tmp_path / "r"
    write_root(root, 3000)  # a listing far over a pipe's buffer: the writer is still writing when we leave
    proc = subprocess.Popen([sys.executable, "-m", "hermes_actors.cli.main", "roster", "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"handle")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "soon", "1e10", "1e300"])
def test_a_wait_that_is_not_zero_or_more_seconds_is_a_usage_error(value: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    for argv in (["send", "--root", str(root), "--from", "alice", "bob", "hi", "--runner", "demo"],
                 ["outcome", "--root", str(root), "0" * 32], ["room", "send", "--root", str(root), "r", "hi"]):
        with pytest.raises(SystemExit) as exited:
            main([*argv, f"--wait={value}"])
        assert exited.value.code == 2
        assert f"argument --wait: '{value}'" in capsys.readouterr().err


def test_send_without_a_host_returns_after_the_ack_of_a_relayed_dm_and_the_next_host_reads_its_reply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: with no host, `send` to another machine waited for the reply (turn wait + timeout + 10 s),
    though nothing runs here: the envelope is on the relay and the next host resumes waiting for it."""
    import time

    from relay_helpers import remote_row, seed_write_json, write_roster_file

    root = make_root(tmp_path, name="alpha",
                     config={"bot_mode": {"turn_wait_seconds": 1, "turn_timeout_seconds": 1}})
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    code = main(["send", "--root", str(root), "--from", "alice", "moxie", "hi", "--runner", "demo",
                 "--connection-id", "alpha", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    ack = json.loads(out.splitlines()[0])
    assert ack["status"] == "queued" and ack["to"] == "@moxie on mini"
    assert "queued on the relay" in err and f"hermes-actors outcome --root {root} {ack['delivery_id']}" in err
    assert (root / "bot_relay" / "outbox" / f"{ack['delivery_id']}.json").is_file()
    with Gateway(root, runner="demo", connection_id="alpha") as host:  # the next host resumes waiting for it
        seed_write_json(root / "bot_relay" / "replies" / f"{ack['delivery_id']}.json",
                        {"id": ack["delivery_id"], "at": int(time.time()), "reply": "hello back", "error": "",
                         "reason": ""})
        assert host.wait_outcome(ack["delivery_id"], timeout=10)["reply"] == "hello back"


def test_an_os_error_is_one_line_and_exit_1_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on a full disk: serve's start (adopting a journal) died with a raw ENOSPC traceback."""
    import errno

    def full_disk(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "journal"))

    monkeypatch.setattr("hermes_actors.cli.serve.serve", full_disk)
    root = make_root(tmp_path)
    assert main(["serve", "--root", str(root), "--runner", "demo"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: [Errno 28] No space left on device: '{tmp_path / 'journal'}'; "
                                        "free space on its filesystem"]


@pytest.mark.parametrize(("code", "says"), [
    (errno.ENOSPC, "No space left on device (ENOSPC); free space on its filesystem"),
    (errno.EROFS, "Read-only file system (EROFS); its filesystem is mounted read-only: remount it read-write"),
])
def test_serve_on_a_full_or_read_only_disk_names_the_journal_and_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, code: int, says: str
) -> None:
    """Regression (ops review): a start on a full or read-only disk said `error: [Errno 28] No space left on device`
    (naming no file, or a temp file by its bare relative name, `.j-<id>.log.new`) and nothing about what to do."""
    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner()) as gw:  # leaves a journal the next start adopts
        gw.message_agent(sender="alice", target="bob", message="hi")
    real_open, real_unlink = os.open, os.unlink

    def refused(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".log.new"):  # the journal's new file
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, *args, **kwargs)

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith(".log.new"):
            raise OSError(code, os.strerror(code), path)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "unlink", unlink)
    assert main(["serve", "--root", str(root), "--runner", "demo"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    journal = root / "bot_relay" / "journal"
    assert line.startswith(f"error: cannot open the delivery journal {journal}/j-") and line.endswith(says), line
    monkeypatch.setattr(os, "open", real_open)
    monkeypatch.setattr(os, "unlink", real_unlink)
    monkeypatch.setattr(os, "pwrite", refused)  # the file is made; writing the adopted records fails
    monkeypatch.setattr(os, "posix_fallocate", refused)
    assert main(["serve", "--root", str(root), "--runner", "demo"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: cannot write the adopted journals into {journal}/j-") and line.endswith(says), line


def _bench_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What `run_bench` is called with (it runs nothing)."""
    import bench.harness

    runs: list[tuple[Any, ...]] = []
    monkeypatch.setattr(bench.harness, "run_bench", lambda quick, scenarios, out, **kw: runs.append(
        (quick, scenarios, out, kw)))
    return runs


def test_bench_passes_its_options_through_no_progress_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the harness's own usage lists --no-progress, but `hermes-actors bench --no-progress` was refused."""
    runs = _bench_runs(monkeypatch)
    assert main(["bench", "--quick", "--scenario", "local-roundtrip", "--no-progress", "--sustained-seconds", "5",
                 "--out", str(tmp_path)]) == 0
    assert runs == [(True, ["local-roundtrip"], tmp_path, {"progress": False, "sustained_s": 5.0})]


@pytest.mark.parametrize(("argv", "code", "says"), [
    (["--out=-results"], 0, ""),  # was: `argument --out: expected one argument`, from the re-parse
    (["--scenario=-x"], 2, "error: unknown scenario(s) '-x'; known: local-roundtrip, "),  # was: the same
    (["--sustained-seconds=-3"], 2, "error: argument --sustained-seconds: '-3': the sustained run must last more "
                                    "than 0"),  # was: '-3.0'
    (["--sustained-seconds", "1e999"], 2, "error: argument --sustained-seconds: '1e999': the sustained"),  # 'inf'
    (["--sustained-seconds", "nan"], 2, "error: argument --sustained-seconds: 'nan': the sustained"),
    (["--out", ""], 2, "error: argument --out: is empty; pass a path, or leave the option out for its default"),
], ids=["--out=-results", "--scenario=-x", "--sustained-seconds=-3", "1e999", "nan", "--out ''"])
def test_bench_runs_the_values_it_parsed_not_a_reparse_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
    says: str
) -> None:
    """Regression (CLI review): `bench` wrote its parsed options back out as strings for bench's own parser:
    `--out=-results` and `--scenario=-x`, taken by the first, were refused by the second (`expected one
    argument`); `--sustained-seconds=-3` was named '-3.0', 1e999 'inf'; `--out ""` became '.' and ran there."""
    monkeypatch.chdir(tmp_path)
    runs = _bench_runs(monkeypatch)
    got, out = _exit_and_output(["bench", "--quick", "--no-progress", *argv], capsys)
    assert got == code, out
    assert says in out, out
    assert runs == ([(True, None, Path("-results"), {"progress": False, "sustained_s": None})] if code == 0 else [])
    assert os.listdir(tmp_path) == (["-results"] if code == 0 else [])


@pytest.mark.parametrize(("out", "reason"), [("results.txt", "it is a file, not a directory"),
                                             ("results.txt/run1", "Not a directory")])
def test_bench_refuses_an_out_it_cannot_write_before_running_anything(
    out: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``--out <a file>`` ran every scenario, then failed `[Errno 17] File exists` (exit 1), and
    ``--out /proc/nope`` `[Errno 2] No such file or directory` (exit 2): one message, exit 2, up front."""
    import bench.harness

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the scenarios ran")

    monkeypatch.setattr(bench.harness, "run_bench", must_not_run)
    (tmp_path / "results.txt").write_text("mine\n", encoding="utf-8")
    assert main(["bench", "--quick", "--scenario", "local-roundtrip", "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert f"error: --out '{tmp_path / out}' must be a directory bench can create and write its results in " \
           f"({reason})" in err, err
    assert (tmp_path / "results.txt").read_text(encoding="utf-8") == "mine\n"


def test_bench_creates_a_missing_out_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.harness

    seen: list[Path] = []
    monkeypatch.setattr(bench.harness, "run_bench", lambda quick, scenarios, out, **kw: seen.append(out))
    assert main(["bench", "--quick", "--scenario", "local-roundtrip", "--out", str(tmp_path / "a" / "b")]) == 0
    assert seen == [tmp_path / "a" / "b"] and seen[0].is_dir()


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["send", "--from", "alice", "bob", "z\udcff"], "message"),
        (["send", "--from", "alice", "b\udcffb", "hi"], "target"),
        (["send", "--from", "\udcff", "bob", "hi"], "--from"),
        (["room", "create", "pl\udcffan", "alice", "bob"], "name"),
        (["room", "create", "plan", "alice", "b\udcff"], "members"),
        (["room", "send", "plan", "z\udcff"], "text"),
        (["room", "show", "p\udcff"], "room"),
        # Regression (CLI fuzz): these were echoed in their refusal as '\udcff'
        (["serve", "--runner", "demo", "--http", "\udcff\udcfe:80"], "--http"),
        (["serve", "--runner", "demo", "--http", ":1", "--http-token", "t\udcff"], "--http-token"),
        (["roster", "--connection-id", "a\udcff"], "--connection-id"),
        (["roster", "--connection-id", "a", "--redis", "redis://h\udcff:6379/0"], "--redis"),
        (["relay", "--name", "a\udcff"], "--name"),
        (["enable", "--profiles", "a\udcff"], "--profiles"),
        (["disable", "--profiles", "a\udcff"], "--profiles"),
        (["outcome", "\udcff" * 32], "delivery_id"),
    ],
    ids=["send-message", "send-target", "send-from", "room-name", "room-member", "room-text", "room-show",
         "serve-http", "serve-http-token", "roster-connection-id", "roster-redis", "relay-name", "enable-profiles",
         "disable-profiles", "outcome-id"],
)
def test_an_argument_that_is_not_utf8_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], argument: str
) -> None:
    """Regression (review): ``$(printf 'z\\xff')`` reached the submit request as a lone surrogate and the CLI died
    with "TypeError: str is not valid UTF-8" from orjson; now exit 2 naming the argument and the byte."""
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(SystemExit) as exited:
        main([*argv[:2], "--root", str(root), *argv[2:]] if argv[0] == "room" else [argv[0], "--root", str(root),
                                                                                       *argv[1:]])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argument}" in err and "is not valid UTF-8 text (byte 0xff at character" in err, err


@pytest.mark.parametrize("command", [["room", "show", "plan"], ["room", "list"]])
@pytest.mark.parametrize("option", [["--runner", "demo"], ["--cli", "/bin/true"], ["--runner"]])
@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
def test_room_show_and_list_refuse_a_runner_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], option: list[str], before: bool
) -> None:
    """Regression (acceptance review): they accepted --runner and --cli, and no turn runs in them (they read the
    host's rooms or the files). Regression (uxbatch): refused as unknown, ``room show --runner demo plan`` took
    ``demo`` for the room and said "unrecognized arguments: --runner plan", naming the room; now the option is
    named, and why it does not apply, wherever it stands."""
    args = [*command[:2], *option, *command[2:]] if before else [*command, *option]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--root", str(make_root(tmp_path))])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: hermes-actors {' '.join(command[:2])} "), err
    assert (f"hermes-actors {' '.join(command[:2])}: error: argument {option[0]}: does not apply to "
            f"{' '.join(command[:2])}: it asks the host or works on the room files, and runs no member turn "
            "(--runner and --cli are for room create and send)\n") in err, err
    assert "unrecognized" not in err and "plan" not in err


_FOR_NO_HOST = "(they are for a send that runs the DM itself, on a root with no host)"


_SEND = {"does": "runs the DM", "without": "a send that runs the DM itself"}


@pytest.mark.parametrize(("options", "note"), [
    ({}, None),
    ({"runner": "demo"},
     f"note: --runner demo ignored: the host serving /r runs the DM with its own runner {_FOR_NO_HOST}"),
    ({"cli": "/bin/true"}, f"note: --cli /bin/true ignored: the host serving /r runs the DM with its own runner "
                           f"{_FOR_NO_HOST}"),
    ({"runner": "hermes", "cli": "/bin/true"}, "note: --runner hermes and --cli /bin/true ignored: the host serving /r "
                                               f"runs the DM with its own runner {_FOR_NO_HOST}"),
    ({"cli": ""}, None),  # an empty --cli is the default
    # Regression (CLI fuzz): through a host, --redis and --connection-id were dropped without a word
    ({"redis": "redis://u:secret@127.0.0.1:1/0", "connection_id": "zz"},
     "note: --redis redis://u:***@127.0.0.1:1/0 and --connection-id zz ignored: the host serving /r runs the DM with "
     f"its own transport and connection id {_FOR_NO_HOST}"),
    ({"runner": "demo", "redis": "redis"},
     "note: --runner demo and --redis redis ignored: the host serving /r runs the DM with its own runner and "
     f"transport {_FOR_NO_HOST}"),
    ({"runner": "demo", "cli": "/bin/true", "redis": "redis", "connection_id": "zz"},
     "note: --runner demo, --cli /bin/true, --redis redis and --connection-id zz ignored: the host serving /r "
     f"runs the DM with its own runner, transport and connection id {_FOR_NO_HOST}"),
], ids=["none", "runner", "cli", "both", "empty-cli", "transport", "runner-redis", "all"])
def test_the_host_ignored_note_names_the_options_given(options: dict[str, str], note: str | None) -> None:
    import argparse

    from hermes_actors.cli.gateway_options import given_gateway_options, host_ignored_note

    args = argparse.Namespace(**{"runner": None, "cli": None, "redis": None, "connection_id": None, **options})
    assert host_ignored_note("/r", given_gateway_options(args), **_SEND) == note


def test_send_through_a_host_says_its_transport_options_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI fuzz): through a host, `send --redis URL --connection-id zz` was queued (exit 0) without a
    note, while --runner and --cli got one."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with Gateway(root, runner=RecordingRunner(lambda turn: "ok"), durable=False, serve_submit=True):
        assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi", "--redis",
                     "redis://u:secret@127.0.0.1:1/0", "--connection-id", "zz"]) == 0
        captured = capsys.readouterr()
        assert captured.out.startswith("queued for @bob: delivery ")
        assert captured.err == (f"note: --redis redis://u:***@127.0.0.1:1/0 and --connection-id zz ignored: the host "
                                f"serving {root} runs the DM with its own transport and connection id "
                                f"{_FOR_NO_HOST}\n"), captured.err


@pytest.mark.parametrize("argv", [
    ["--from", "", "bob", "hi"], ["--from", "  ", "bob", "hi"], ["--from", "alice", "a" * 300, "hi"],
    ["--from", "a" * 300, "bob", "hi"], ["--from", "alice", "", "hi"],
], ids=["empty-sender", "blank-sender", "long-target", "long-sender", "empty-target"])
def test_a_host_refuses_a_send_in_the_words_used_without_one(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI fuzz): through a host, `send --from ""` was refused `bad submit request: 'sender' must be a
    non-empty string of at most 256 chars` (without one: `sender is required … teammates: …`), and a 300-character
    target `bad submit request: 'target' must be …`: the submit endpoint's own checks came before the gateway's."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    command = ["send", "--root", str(root), *argv, "--json"]
    assert main([*command, "--runner", "demo"]) == 1  # no host: the command's own gateway refuses it
    alone = json.loads(capsys.readouterr().out)
    with Gateway(root, runner=RecordingRunner(lambda turn: "ok"), durable=False, serve_submit=True):
        assert main(command) == 1
        captured = capsys.readouterr()
    assert json.loads(captured.out) == alone
    assert "bad submit request" not in alone["error"] and alone["reason"] == "unknown"


@pytest.mark.parametrize(("sender", "who"), [("alice", "alice"), ("", "the sender"), ("  ", "the sender"),
                                             ("a\x1b[2J", "a\\x1b[2J")])
def test_the_no_host_note_names_the_sender(sender: str, who: str) -> None:
    """Regression (CLI fuzz): `send --from ""` with no host said `prints its outcome:  is not woken` (no name)."""
    from hermes_actors.cli.send import no_host_note

    assert no_host_note("/r", sender) == ("note: no host serves /r (start one with `hermes-actors serve --root /r`); "
                                          f"this command runs the DM itself and prints its outcome: {who} is not "
                                          "woken with it in Bot Chat (only a host wakes senders)")


def test_roster_through_a_host_says_its_transport_options_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI fuzz): `roster --connection-id zz` through a host was ignored without a word."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with Gateway(root, runner=RecordingRunner(), durable=False, serve_submit=True):
        assert main(["roster", "--root", str(root), "--connection-id", "zz", "--json"]) == 0
        captured = capsys.readouterr()
        assert {r["handle"] for r in json.loads(captured.out)} >= {"alice", "bob"}
        assert captured.err == (f"note: --connection-id zz ignored: the host serving {root} lists the roster with its "
                                "own connection id (they are for a roster that reads the transport itself, on a root "
                                "with no host)\n"), captured.err
        assert main(["roster", "--root", str(root)]) == 0
        assert "ignored" not in capsys.readouterr().err  # nothing given, nothing said


def test_room_commands_through_a_host_say_their_runner_options_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`room create|send --runner demo` through a host ran the member turns on the host's runner without a word,
    as `send` did (one rule for the options a host does not take)."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with Gateway(root, runner=RecordingRunner(lambda turn: "[SILENT]"), durable=False, serve_submit=True):
        assert main(["room", "create", "plan", "alice", "bob", "--root", str(root), "--runner", "demo"]) == 0
        assert capsys.readouterr().err == (
            f"note: --runner demo ignored: the host serving {root} runs the rooms' member turns with its own runner "
            "(they are for a room create that runs a gateway of its own, on a root with no host)\n")
        assert main(["room", "send", "plan", "hi", "--root", str(root), "--wait", "30"]) == 0
        assert capsys.readouterr().err == ""


def test_send_through_a_host_says_its_runner_options_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (acceptance on hermes 0.19): `send --runner demo` (and `--cli`) through a host were ignored without
    a word: the real hermes answered a DM the user meant for the demo bots."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    host_runner = RecordingRunner(lambda turn: "the host's runner")
    with Gateway(root, runner=host_runner, durable=False, serve_submit=True):
        assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi", "--runner", "demo", "--cli",
                     "/bin/true", "--wait", "30"]) == 0
        captured = capsys.readouterr()
        assert captured.out.endswith("\nReply from @bob: the host's runner\n"), captured.out
        assert captured.err == (f"note: --runner demo and --cli /bin/true ignored: the host serving {root} runs the DM "
                                f"with its own runner {_FOR_NO_HOST}\n"), captured.err
        assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi again"]) == 0
        assert "ignored" not in capsys.readouterr().err  # nothing given, nothing said


def test_a_room_send_interrupted_after_its_room_settled_does_not_say_its_rounds_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (diffrev34): a Ctrl-C landing while the settled room's new lines were fetched said
    ``interrupted; the message is posted and its rounds go on …`` of a room already idle."""
    from hermes_actors import Gateway

    root = create_demo_root(tmp_path / "root")
    base = ["--root", str(root), "--runner", "demo"]
    assert main(["room", "create", "launch", "hermes", "scout", *base]) == 0
    settled: list[str] = []

    def interrupted(gw: Gateway, room: str) -> list[dict[str, object]]:
        settled.append(gw.wait_room_idle(room, timeout=30))  # the wait returned: the room is settled
        raise KeyboardInterrupt

    monkeypatch.setattr(Gateway, "room_transcript", interrupted)
    capsys.readouterr()
    assert main(["room", "send", "launch", "Ready?", *base, "--wait", "30"]) == 130
    assert settled and settled[0] != "busy"
    assert "rounds go on" not in capsys.readouterr().err
