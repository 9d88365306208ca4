"""Group rooms through the host of a root: the submit endpoint's ``room`` op and the ``room`` commands using it."""

from __future__ import annotations

import argparse
import json
import shlex
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import RecordingRunner, make_root, start_gateway

from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.cli.room import _after, _wait_cut_short
from hermes_actors.errors import RoomStopped
from hermes_actors.hermes.submit_client import HostOffline, request
from hermes_actors.hermes.submit_protocol import RoomCall, parse_request, socket_path
from hermes_actors.messages import Turn
from hermes_actors.rooms.remote import HostRooms

# ── the op's parsing (pure) ─────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("payload", "call"),
    [
        ({"action": "create", "name": "plan", "members": ["alice", "bob"]},
         RoomCall("create", name="plan", members=("alice", "bob"))),
        ({"action": "send", "room": "plan", "text": "hi"}, RoomCall("send", room="plan", sender="user", text="hi")),
        ({"action": "send", "room": "plan", "sender": "alice", "text": ""},
         RoomCall("send", room="plan", sender="alice", text="")),  # an empty text is the room's refusal to make
        ({"action": "show", "room": "plan"}, RoomCall("show", room="plan")),
        ({"action": "list"}, RoomCall("list")),
        ({"action": "disband", "room": "plan"}, RoomCall("disband", room="plan")),
        ({"action": "wait", "room": "plan", "wait": 2}, RoomCall("wait", room="plan", wait=2.0)),
        ({"action": "wait", "room": "plan"}, RoomCall("wait", room="plan", wait=0.0)),
        ({"action": "create", "name": "solo", "members": ["alice"]},
         RoomCall("create", name="solo", members=("alice",))),  # 2 to 6: the room rules say it, in their words
    ],
)
def test_room_requests_parse(payload: dict[str, Any], call: RoomCall) -> None:
    assert parse_request(orjson.dumps({"op": "room", **payload})) == call


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({}, "unknown room action None (expected one of: create, disband, list, send, show, wait)"),
        ({"action": "shout"}, "unknown room action 'shout'"),
        ({"action": "list", "room": "plan"}, "unknown field(s) for room action 'list': room"),
        ({"action": "show", "room": "plan", "text": "x"}, "unknown field(s) for room action 'show': text"),
        ({"action": "show"}, "'room' must be a non-empty string of at most 256 chars, got None"),
        ({"action": "show", "room": "  "}, "'room' must be a non-empty string"),
        ({"action": "show", "room": "x" * 257}, "'room' must be a non-empty string of at most 256 chars"),
        ({"action": "disband", "room": 7}, "'room' must be a non-empty string of at most 256 chars, got 7"),
        ({"action": "create", "members": ["alice", "bob"]}, "'name' must be a non-empty string"),
        ({"action": "create", "name": "plan", "members": "alice bob"}, "'members' must be a list of at most 64 names"),
        ({"action": "create", "name": "plan", "members": ["alice", 3]}, "'members' must be a list"),
        ({"action": "create", "name": "plan", "members": ["alice", ""]}, "'members' must be a list"),
        ({"action": "create", "name": "plan", "members": ["a"] * 65}, "'members' must be a list of at most 64"),
        ({"action": "send", "room": "plan"}, "'text' must be a string, got NoneType"),
        ({"action": "send", "room": "plan", "text": ["hi"]}, "'text' must be a string, got list"),
        ({"action": "send", "room": "plan", "sender": "", "text": "hi"}, "'sender' must be a non-empty string"),
        ({"action": "wait", "room": "plan", "wait": -1}, "'wait' must be a number of seconds from 0 to 300"),
        ({"action": "wait", "room": "plan", "wait": 301}, "'wait' must be a number of seconds from 0 to 300"),
        ({"action": "wait", "room": "plan", "wait": True}, "'wait' must be a number of seconds"),
        ({"action": "wait", "room": "plan", "wait": "5"}, "'wait' must be a number of seconds"),
    ],
)
def test_bad_room_requests_say_what_is_wrong(payload: dict[str, Any], says: str) -> None:
    answer = parse_request(orjson.dumps({"op": "room", **payload}))
    assert isinstance(answer, dict) and answer["reason"] == "unknown"
    assert answer["error"].startswith("bad submit request: ") and says in answer["error"], answer["error"]


def test_after_a_message_id_table() -> None:
    entries = [{"message_id": m} for m in ("a", "b", "c")]
    assert _after(entries, "a") == entries[1:]
    assert _after(entries, "c") == []
    assert _after(entries, "gone") == entries  # trimmed off: show everything there is


# ── through a host in this process ──────────────────────────────────────────


class Members:
    """A runner: in a room, alice answers once (``@user`` when told to), the others pass; ``hold`` blocks."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.answered: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, turn: Turn) -> str:
        if "hold" in turn.content:
            assert self.release.wait(30), "the test never released the held turn"
        with self.lock:
            if turn.profile != "alice" or not turn.session.startswith("Group: ") or "alice" in self.answered:
                return "[SILENT]"
            self.answered.add("alice")
        return "@user Friday works for me." if "ask me" in turn.content else "Friday works for me."


@pytest.fixture
def host(tmp_path: Path, gateways: list[Gateway]) -> tuple[Path, Gateway, Members, RecordingRunner]:
    root = make_root(tmp_path)
    members = Members()
    runner = RecordingRunner(members)
    return root, start_gateway(gateways, root, runner, serve_submit=True), members, runner


def test_every_room_command_goes_through_the_host(host: tuple[Path, Gateway, Members, RecordingRunner],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root, gw, _members, runner = host
    base = ["--root", str(root), "--runner", "demo"]  # the host's runner runs the turns, not the demo one
    assert main(["room", "create", "launch", "alice", "bob", *base, "--json"]) == 0
    room = json.loads(capsys.readouterr().out)
    assert room["members"] == ["alice", "bob"]
    assert [r["room_id"] for r in gw.list_rooms()] == [room["room_id"]]  # the host holds it

    assert main(["room", "send", "launch", "Friday? ask me", *base, "--wait", "30", "--json"]) == 0
    ack, *entries, end = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert ack["status"] == "queued" and ack["room_id"] == room["room_id"]
    assert [(e["author"], e["text"]) for e in entries] == [("alice", "@user Friday works for me.")]
    assert end == {"state": "needs_you"}
    assert {t.profile for t in runner.entered} == {"alice", "bob"}  # the host's runner ran the member turns
    assert all(t.session == "Group: launch" for t in runner.entered)

    assert main(["room", "show", "LAUNCH", *base[:2]]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        "[0] user: Friday? ask me", "[1] alice: @user Friday works for me."]
    assert main(["room", "show", "launch", "--json", *base[:2]]) == 0
    assert json.loads(capsys.readouterr().out) == gw.room_transcript("launch")

    assert main(["room", "list", "--json", *base[:2]]) == 0
    assert json.loads(capsys.readouterr().out) == gw.list_rooms()
    assert main(["room", "list", *base[:2]]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["name", "room_id", "state", "messages", "members"]
    assert row.split() == ["launch", room["room_id"], "needs_you", "2", "@alice,", "@bob"]

    assert main(["room", "disband", "launch", *base[:2], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "disbanded"
    assert gw.list_rooms() == []


def test_room_command_errors_through_the_host_keep_their_exit_codes(
        host: tuple[Path, Gateway, Members, RecordingRunner], capsys: pytest.CaptureFixture[str]) -> None:
    root, gw, _members, _runner = host
    base = ["--root", str(root)]
    assert main(["room", "create", "solo", "alice", *base]) == 2
    assert capsys.readouterr().err.strip() == "error: a room has 2 to 6 members, not 1"
    assert main(["room", "show", "nowhere", *base[:2]]) == 2
    assert "error: no room 'nowhere'" in capsys.readouterr().err
    assert main(["room", "disband", "nowhere", *base]) == 2
    assert "error: no room 'nowhere'" in capsys.readouterr().err
    for json_flag in ([], ["--json"]):  # Regression (acceptance review): a refused send, exit 1
        assert main(["room", "send", "nowhere", "hi", *base, *json_flag]) == 2
        out, err = capsys.readouterr()
        assert "error: no room 'nowhere': pass the id or name of an existing room" in err and out == ""
    gw.create_room("duo", ["alice", "bob"])
    assert main(["room", "create", "DUO", "alice", "carol", *base]) == 2
    assert "a room named 'DUO' exists already" in capsys.readouterr().err
    assert main(["room", "send", "duo", "   ", *base]) == 1  # a refusal: one human line
    assert capsys.readouterr().out.startswith("refused [unknown]: text is required")
    assert main(["room", "send", "duo", "hi", "--from", "mallory", *base]) == 1
    assert capsys.readouterr().out.startswith("refused [")
    assert gw.room_transcript("duo") == []  # nothing refused was posted


def test_room_send_wait_runs_out_in_slices_and_the_room_goes_on(
        host: tuple[Path, Gateway, Members, RecordingRunner], capsys: pytest.CaptureFixture[str]) -> None:
    root, gw, members, runner = host
    gw.create_room("slow", ["alice", "bob"])
    try:
        assert main(["room", "send", "slow", "hold on", "--root", str(root), "--wait", "0.3", "--json"]) == 1
        out, err = capsys.readouterr()
        assert json.loads(out.splitlines()[0])["status"] == "queued"  # acked before the wait ran out
        assert "did not become idle within 0.3s" in err and "room show" in err
        runner.wait_entered(1, timeout=30)
    finally:
        members.release.set()
    assert gw.wait_room_idle("slow", timeout=30) == "idle"
    assert [e["author"] for e in gw.room_transcript("slow")] == ["user", "alice"]


def test_host_rooms_raise_what_the_gateway_raises(host: tuple[Path, Gateway, Members, RecordingRunner]) -> None:
    root, gw, _members, _runner = host
    rooms = HostRooms.if_served(root)
    assert rooms is not None
    with pytest.raises(ValueError, match="member 'alice' is listed twice"):
        rooms.create_room("echo", ["alice", "alice"])
    with pytest.raises(KeyError, match="no room 'x'"):
        rooms.room_transcript("x")
    with pytest.raises(KeyError, match="no room 'x'"):
        rooms.wait_room_idle("x", timeout=1)
    room = rooms.create_room("pair", ["alice", "bob"])
    assert rooms.wait_room_idle("pair", timeout=1) == "idle"
    rows = rooms.list_rooms()
    assert rows == gw.list_rooms() == [{**room, "state": "idle", "messages": 0,
                                        "last_activity": rows[0]["last_activity"]}]
    answer = request(root, {"op": "room", "action": "show"})
    assert answer == {"error": "bad submit request: 'room' must be a non-empty string of at most 256 chars, "
                               "got None", "reason": "unknown"}
    # Regression (review): an empty name was refused by the submit protocol's 256-char check, not the room rule
    for name in ("", "  "):
        with pytest.raises(ValueError, match="room name is required"):
            rooms.create_room(name, ["alice", "bob"])
    with pytest.raises(ValueError, match=r"room name too long \(65 chars > 64\)"):
        rooms.create_room("x" * 65, ["alice", "bob"])


def test_without_a_host_the_commands_run_their_own_gateway(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    assert HostRooms.if_served(root) is None
    with pytest.raises(HostOffline):
        request(root, {"op": "room", "action": "list"})
    base = ["--root", str(root), "--runner", "demo"]
    assert main(["room", "create", "own", "alice", "bob", *base]) == 0
    capsys.readouterr()
    assert main(["room", "list", "--json", *base[:2]]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["own"]
    assert not socket_path(root).exists()  # no host was involved


def _pending_room(root: Path) -> tuple[dict[str, Any], Path]:
    """A room ``pending`` of alice and bob whose file holds an acked send whose round has not started (as a
    gateway that stopped right after the ack leaves it). Returns the room dict and its file."""
    with Gateway(root, runner=RecordingRunner(lambda turn: "[SILENT]")) as gw:
        room = gw.create_room("pending", ["alice", "bob"])
    path = root / "bot_relay" / "rooms" / f"{room['room_id']}.json"
    record = json.loads(path.read_text())
    entry = {"message_id": "a" * 32, "author": "user", "text": "@bob are you there?", "at": 1.0, "round": 0,
             "status": "said"}
    record |= {"transcript": [entry], "sends": [{"message_id": "a" * 32, "sender": "user", "mentioned": ["bob"]}],
               "state": "busy"}
    path.write_text(json.dumps(record))
    return room, path


def test_without_a_host_show_and_list_read_the_files_and_run_no_turn(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # Regression: a read-only command started a gateway of its own, which resumed the pending round (ran
    # bob's turn with the command's runner) and cut it short at its stop.
    root = make_root(tmp_path)
    room, path = _pending_room(root)
    before = path.read_bytes()
    base = ["--root", str(root), "--runner", "demo"]

    assert main(["room", "list", "--json", *base[:2]]) == 0
    assert json.loads(capsys.readouterr().out) == [{**room, "state": "busy", "messages": 1, "last_activity": 1.0}]
    assert main(["room", "show", "PENDING", *base[:2]]) == 0
    assert capsys.readouterr().out.strip().splitlines() == ["[0] user: @bob are you there?"]
    assert main(["room", "show", "nowhere", *base[:2]]) == 2
    assert "error: no room 'nowhere'" in capsys.readouterr().err
    assert path.read_bytes() == before, "a read-only command changed the room (it ran the pending round)"


def test_without_a_host_disband_runs_no_turn_of_the_room(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (uxbatch): with no host, ``room disband`` started a gateway of its own, whose start resumed the
    room's pending round: bob's member turn ran (with --runner's runner) before the disband reached the room, which
    docs/rooms.md says never happens to a queued turn of a disbanded room. It now deletes the room's file itself,
    under the rooms owner lock: no gateway starts, no turn runs, and nothing of the room resumes later."""
    from hermes_actors.cli import gateway_options
    from hermes_actors.rooms import rooms as rooms_module

    root = make_root(tmp_path)
    room, path = _pending_room(root)
    ran = threading.Event()
    runner = RecordingRunner(lambda turn: ran.set() or "[SILENT]")
    monkeypatch.setattr(gateway_options, "runner_for", lambda *args: runner)  # what a gateway of the command runs
    disband = rooms_module.Rooms.disband

    def late(self: Any, name: Any) -> dict[str, Any]:  # as on a loaded machine: the round's first turn came first
        ran.wait(30)
        return disband(self, name)

    monkeypatch.setattr(rooms_module.Rooms, "disband", late)
    assert main(["room", "disband", "PENDING", "--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == (f"room pending disbanded ({room['room_id']}); its members' sessions "
                                               "stay")
    assert runner.entered == [], "disband ran a member turn of the room"
    assert not path.exists()
    with Gateway(root, runner=runner) as gw:
        assert gw.list_rooms() == []
    assert runner.entered == []


def test_without_a_host_send_leaves_the_rooms_to_their_host(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (soak): a host-less ``hermes-actors send`` ran a gateway that took ``rooms/.owner.lock`` for as
    long as its DM ran, so a host starting meanwhile found its rooms unavailable (and the command resumed the
    pending rounds, to cut them short at its stop). It runs no room turn, so it drives no rooms now: the lock
    stays free while its DM runs, and the pending round is left for the host."""
    from hermes_actors.cli import gateway_options
    from hermes_actors.rooms.store import RoomFiles

    root = make_root(tmp_path)
    room, path = _pending_room(root)
    before = path.read_bytes()
    free_during_the_dm: list[bool] = []

    def behave(turn: Turn) -> str:
        if turn.session == "Bot Chat":  # what a host starting now would find
            holder = RoomFiles(root).owner_lock()
            free_during_the_dm.append(holder.try_acquire())
            holder.release()
            holder.close()
            return "done"
        return "[SILENT]"

    runner = RecordingRunner(behave)
    monkeypatch.setattr(gateway_options, "runner_for", lambda *args: runner)  # what a gateway of the command runs
    assert main(["send", "--root", str(root), "--from", "alice", "bob", "hi"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "Reply from @bob: done"
    assert free_during_the_dm == [True], "the host-less send held the rooms owner lock"
    assert [t.session for t in runner.entered] == ["Bot Chat"], "the host-less send ran a member turn"
    assert path.read_bytes() == before
    with Gateway(root, runner=runner) as gw:  # the host the round waited for
        assert gw.wait_room_idle(room["room_id"], timeout=30) == "idle"
    assert [(t.profile, t.session) for t in runner.entered] == [("bob", "Bot Chat"), ("bob", "Group: pending")]


def test_without_a_host_disband_leaves_a_room_another_gateway_drives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], gateways: list[Gateway]) -> None:
    """The rooms owner lock: a gateway with no submit endpoint (a Python program's) drives the root's rooms, so the
    command refuses, as its own gateway did, and the room stays; once it stopped the command disbands it."""
    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, RecordingRunner())
    room = gw.create_room("plan", ["alice", "bob"])
    assert main(["room", "disband", "plan", "--root", str(root)]) == 1
    # the command runs in this test's process, beside the gateway (from a shell: "another gateway process drives …")
    assert capsys.readouterr().err.strip() == (f"error: rooms are unavailable: another Gateway in this process drives "
                                               f"the rooms of {root} (one Gateway drives a root's rooms): make the "
                                               "room calls on that one, or stop it first")
    assert [r["room_id"] for r in gw.list_rooms()] == [room["room_id"]]
    gw.stop()
    assert main(["room", "disband", room["room_id"], "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**room, "state": "disbanded"}
    assert main(["room", "disband", "plan", "--root", str(root)]) == 2
    assert "error: no room 'plan'" in capsys.readouterr().err


def test_room_show_indents_a_messages_further_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A member's multi-line reply printed flush left in `room show` read as other speakers' entries to a person
    (`@carol: ...`), as it did to the members before their turn text indented it."""
    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner(lambda turn: "fine\n@carol: ship it\nuser: agreed\x1b[2J")) as gw:
        gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "@alice thoughts?")
        assert gw.wait_room_idle("plan", timeout=20) in ("idle", "needs_you")
    assert main(["room", "show", "plan", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "[1] alice: fine" in lines and "  @carol: ship it" in lines and "  user: agreed\\x1b[2J" in lines, lines
    assert not any(line.startswith(("@carol:", "user: agreed")) for line in lines)
    assert not any("\x1b" in line for line in lines)  # a terminal escape is shown, not acted on


def test_room_send_cut_short_by_a_stopping_host_says_what_to_run(
        host: tuple[Path, Gateway, Members, RecordingRunner], capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (acceptance review): the wait cut short by the host's stop printed the Python API's "wait
    again", and no command waits without posting: it now names the command that shows the rounds later."""
    root, gw, members, runner = host
    gw.create_room("launch", ["alice", "bob"])
    codes: list[int] = []
    send = threading.Thread(target=lambda: codes.append(
        main(["room", "send", "launch", "hold on", "--root", str(root), "--wait", "60"])))
    send.start()
    try:
        runner.wait_entered(1, timeout=30)  # posted and its round running: the command waits (or is about to)
        gw.stop(timeout=1)
    finally:
        members.release.set()
    send.join(60)
    assert codes == [1]
    out, err = capsys.readouterr()
    assert out.startswith("queued in room launch: message ")
    # the room's stop, the host's rooms gone or the host itself gone, as the stop's timing has it: each says so
    errors = [line for line in err.splitlines() if line.startswith("error: ")]  # not the host's log lines
    assert len(errors) == 1, err
    assert f"the message is posted and its rounds go on from the room's file (look later with: hermes-actors room " \
           f"show --root {root} launch)" in errors[0] and "wait again" not in err, err


def test_ctrl_c_while_room_send_waits_on_a_host_says_the_message_is_posted_and_where_to_look(
    host: tuple[Path, Gateway, Members, RecordingRunner], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (docs review): a stop signal once the message was posted ended `room send` with the signal's exit
    code and nothing said (`send` says where a DM's outcome goes); now it says the message is posted and where to
    look, as it does when its own gateway is stopped by one (tests/test_turn_stop.py)."""
    root, gw, _members, _runner = host
    gw.create_room("launch", ["alice", "bob"])

    def interrupted(self: HostRooms, room: str, timeout: float = 60) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(HostRooms, "wait_room_idle", interrupted)
    assert main(["room", "send", "launch", "Friday?", "--root", str(root)]) == 130
    out, err = capsys.readouterr()
    assert out.startswith("queued in room launch: message ")
    assert (f"interrupted; the message is posted and its rounds go on from the room's file (look later with: "
            f"hermes-actors room show --root {root} launch)") in err, err
    assert [e["text"] for e in gw.room_transcript("launch")][:1] == ["Friday?"]


@pytest.mark.parametrize("exc", [TimeoutError("room 'x' still busy after 5s"), RoomStopped("stopped"),
                                 RuntimeError("the host is stopping: its rooms are gone"), KeyboardInterrupt()])
def test_room_send_cut_short_names_a_command_that_runs_as_printed(exc: BaseException) -> None:
    """Regression (review diffrev12 of 7f85bf9): the "look later with:" command was built unquoted, so a room named
    "my team", or a root with a space, gave a command the shell splits into other arguments. Each word is quoted."""
    root, room = "/srv/my hermes", "it's my team"
    line = _wait_cut_short(exc, argparse.Namespace(root=root, room=room))
    command = line.split("(look later with: ", 1)[1].removesuffix(")")
    assert shlex.split(command) == ["hermes-actors", "room", "show", "--root", root, room], line
    plain = _wait_cut_short(exc, argparse.Namespace(root="/srv/hermes", room="launch"))
    assert plain.endswith("(look later with: hermes-actors room show --root /srv/hermes launch)")  # as before


# ── a room's name and another room's id ─────────────────────────────────────


def test_a_new_room_may_not_be_named_with_a_room_id(tmp_path: Path, gateways: list[Gateway],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (CLI fuzz): `room create R <id of room 'launch'> scout critic` printed "created"; `room disband R
    <that name>` then disbanded launch, and the new room could no longer be reached by its name. Refused now, by the
    API, the host and the command alike, and nothing is made."""
    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner(lambda turn: "[SILENT]")) as gw:
        launch = gw.create_room("launch", ["alice", "bob"])["room_id"]
        for name in (launch, launch.upper()):
            with pytest.raises(ValueError, match=r"has the form of a room id \(32 hex digits\)"):
                gw.create_room(name, ["alice", "carol"])
    says = f"error: room name {launch!r} has the form of a room id (32 hex digits), so it could be taken for another " \
           "room's id; choose another name\n"
    assert main(["room", "create", launch, "alice", "carol", "--root", str(root), "--runner", "demo"]) == 2  # no host
    assert capsys.readouterr().err == says
    host = start_gateway(gateways, root, RecordingRunner(lambda turn: "[SILENT]"), serve_submit=True)
    rooms = HostRooms.if_served(root)
    assert rooms is not None
    with pytest.raises(ValueError, match=r"has the form of a room id"):
        rooms.create_room(launch, ["alice", "carol"])
    assert main(["room", "create", launch, "alice", "carol", "--root", str(root)]) == 2  # through the host
    assert capsys.readouterr().err == says
    assert [r["name"] for r in host.list_rooms()] == ["launch"]
    assert main(["room", "disband", launch, "--root", str(root)]) == 0
    assert host.list_rooms() == []  # the id names launch, and only launch


def _clashing_rooms(root: Path) -> tuple[str, str]:
    """Rooms 'launch' and one named with launch's id, as a gateway before the name rule could make them.

    Returns:
        (launch's id, the other room's id).
    """
    with Gateway(root, runner=RecordingRunner(lambda turn: "[SILENT]")) as gw:
        launch = gw.create_room("launch", ["alice", "bob"])["room_id"]
        shadow = gw.create_room("shadow", ["alice", "carol"])["room_id"]
    path = root / "bot_relay" / "rooms" / f"{shadow}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "name": launch}))
    return launch, shadow


def _both_rooms_left(root: Path, launch: str, shadow: str) -> None:
    with Gateway(root, runner=RecordingRunner(lambda turn: "[SILENT]")) as gw:
        assert sorted((r["room_id"], r["name"]) for r in gw.list_rooms()) == sorted([(launch, "launch"),
                                                                                     (shadow, launch)])


def test_a_room_named_with_another_rooms_id_is_never_taken_for_it(tmp_path: Path, gateways: list[Gateway],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (CLI fuzz): a reference that is one room's id and another's name (a room named before names were
    checked) acted on the room of that id, whichever was meant. It names neither now: refused, naming both, and
    nothing is done; each room is still reached by what is only its own (launch by its name, the other by its id)."""
    root = make_root(tmp_path)
    launch, shadow = _clashing_rooms(root)
    ambiguous = f"room {launch!r} is ambiguous: it is the id of room 'launch' and the name of room {shadow}"
    # the API
    with Gateway(root, runner=RecordingRunner(lambda turn: "[SILENT]")) as gw:
        for call in (gw.room_transcript, gw.disband_room, lambda ref: gw.wait_room_idle(ref, timeout=1)):
            with pytest.raises(KeyError, match=ambiguous):
                call(launch)
        assert gw.room_send(launch, "user", "hi")["error"].startswith(ambiguous)
        assert gw.room_transcript("launch") == gw.room_transcript(shadow) == []  # nothing was posted
        assert gw.wait_room_idle("launch", timeout=5) == gw.wait_room_idle(shadow, timeout=5) == "idle"
    _both_rooms_left(root, launch, shadow)
    # the commands without a host (the room files), and the Gateway read before start()
    assert main(["room", "disband", launch, "--root", str(root)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {ambiguous}")
    assert main(["room", "show", launch, "--root", str(root)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {ambiguous}")
    with pytest.raises(KeyError, match=ambiguous):
        Gateway(root).room_transcript(launch)
    assert main(["room", "send", launch, "hi", "--root", str(root), "--runner", "demo"]) == 1
    assert capsys.readouterr().out.startswith(f"refused [unknown]: {ambiguous}")
    _both_rooms_left(root, launch, shadow)
    # through a host
    host = start_gateway(gateways, root, RecordingRunner(lambda turn: "[SILENT]"), serve_submit=True)
    rooms = HostRooms.if_served(root)
    assert rooms is not None
    with pytest.raises(KeyError, match=ambiguous):
        rooms.disband_room(launch)
    with pytest.raises(KeyError, match=ambiguous):
        rooms.wait_room_idle(launch, timeout=1)
    assert main(["room", "disband", launch, "--root", str(root)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {ambiguous}")
    assert main(["room", "send", launch, "hi", "--root", str(root)]) == 1
    assert capsys.readouterr().out.startswith(f"refused [unknown]: {ambiguous}")
    assert main(["room", "list", "--root", str(root)]) == 0
    assert {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]} == {"launch", launch}
    assert len(host.list_rooms()) == 2
    # each room by what is only its own
    assert main(["room", "disband", shadow, "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["room_id"] == shadow
    assert main(["room", "disband", "launch", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["room_id"] == launch
    assert host.list_rooms() == []


def test_a_garbage_host_answer_to_a_room_call_exits_1_never_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (left by cliedges): a host's answer to a room call that was no JSON object (an UnreadableAnswer, a
    ValueError) exited 2, a usage error ("nothing was done"), though the host took the call and may have created the
    room or queued the message: a script would repeat it. Now exit 1, saying to look before repeating it."""
    from hermes_actors.cli.room import _act
    from hermes_actors.hermes.submit_client import UnreadableAnswer

    def act(rooms: Any) -> int:
        raise UnreadableAnswer("the answer from /r/bot_relay/run/submit.sock is not a JSON object")

    assert _act(act, None) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the answer from /r/bot_relay/run/submit.sock is not a JSON object; "), err
    assert "may have acted on the request" in err and "before repeating it" in err
