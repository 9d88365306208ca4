"""The hermes-actors command: --help everywhere, roster, send, demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_actors.cli.main import build_parser, main
from hermes_actors.demo.bots import create_demo_root

COMMANDS = ["demo", "roster", "send", "room", "serve", "relay", "bench", "enable", "disable"]


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
                 "--runner", "demo"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    ack = json.loads(lines[0])
    assert ack["status"] == "queued" and ack["to"] == "@scout"
    assert lines[1].startswith("Reply from @scout: ")


def test_send_to_an_unknown_target_prints_the_refusal_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = create_demo_root(tmp_path / "root")
    code = main(["send", "--root", str(root), "--from", "hermes", "nobody", "hi", "--runner", "demo"])
    refusal = json.loads(capsys.readouterr().out.strip())
    assert code == 2
    assert refusal["error"].startswith("No teammate named 'nobody'")
    assert "scout" in refusal["teammates"]


def test_a_missing_root_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roster", "--root", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_demo_runs_its_script_and_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for needle in ("Reply from @scout", "target_busy", "intentional silence", "Invalid target",
                   "Reply from @dave on mini", "Summary"):
        assert needle in out


def test_room_commands_create_send_show_list_disband(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    base = ["--root", str(root), "--runner", "demo"]
    assert main(["room", "create", "launch", "hermes", "scout", "critic", *base]) == 0
    room = json.loads(capsys.readouterr().out)
    assert room["name"] == "launch" and room["members"] == ["hermes", "scout", "critic"]

    assert main(["room", "send", "launch", "What do we need for Friday?", *base, "--wait", "30"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[0])["status"] == "queued"
    assert lines[1].startswith("[1] hermes: ") and lines[-1] == "room is needs_you"
    assert any(line.startswith("[2] hermes: @user") for line in lines)

    assert main(["room", "show", "launch", *base]) == 0
    shown = capsys.readouterr().out.strip().splitlines()
    assert shown[0] == "[0] user: What do we need for Friday?" and shown[1:] == lines[1:-1]

    assert main(["room", "list", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out) == [{**room, "state": "needs_you"}]

    assert main(["room", "disband", "launch", *base]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "disbanded"
    assert main(["room", "list", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_room_command_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = create_demo_root(tmp_path / "root")
    base = ["--root", str(root), "--runner", "demo"]
    assert main(["room", "create", "solo", "hermes", *base]) == 2
    assert "a room has 2 to 6 members, not 1" in capsys.readouterr().err
    assert main(["room", "show", "nowhere", *base]) == 2
    assert "no room 'nowhere'" in capsys.readouterr().err
    assert main(["room", "create", "duo", "hermes", "scout", *base]) == 0
    capsys.readouterr()
    assert main(["room", "send", "duo", "   ", *base]) == 2
    assert "text is required" in json.loads(capsys.readouterr().out.splitlines()[0])["error"]
