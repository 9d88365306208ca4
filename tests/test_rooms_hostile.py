"""Hostile room files: refused and quarantined (never followed), the valid rooms still load and work."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from hostile_files import kind_param, place
from roots import LogCapture, RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.hermes.submit_client import request
from hermes_actors.messages import Turn
from hermes_actors.rooms.remote import HostRooms
from hermes_actors.rooms.store import ROOM_MAX_BYTES, RoomFiles

KINDS = [
    "non-json", "json-array", "huge", "symlink", "bad-name", "id-mismatch", "group-writable", "other-uid", "socket",
    "directory", "bad-member", "running-stranger", "bad-version", "empty-queue", "entry-round", "entry-status",
    "entry-author",
]
# a transcript entry the RoomActor could have posted; the entry-* kinds spoil one field (shown as
# "[-3] bob [{'a': 1}]: t" before entries were checked beyond their types)
GOOD_ENTRY = {"message_id": "b" * 32, "author": "bob", "text": "t", "at": 1.0, "round": 1, "status": "said"}
BAD_ENTRY = {"entry-round": {"round": -3}, "entry-status": {"status": {"a": 1}}, "entry-author": {"author": "mallory"}}


def plant(kind: str, rooms: Path, valid: dict[str, Any], staging: Path) -> tuple[str, Path | None]:
    """Put a hostile room file into ``rooms``; returns its name and, for a symlink, the file it points to."""
    file_id = uuid.uuid4().hex
    record = {**valid, "room_id": file_id, "name": f"evil-{kind}"}
    name = f"{file_id}.json"
    mode = 0o600
    if kind == "json-array":
        record = [record]  # type: ignore[assignment]
    elif kind == "bad-name":
        name = f"{file_id.upper()}.json"
    elif kind == "id-mismatch":
        record = {**record, "room_id": uuid.uuid4().hex}
    elif kind == "group-writable":
        mode = 0o666
    elif kind == "bad-member":
        record = {**record, "members": ["alice", "alice"]}
    elif kind == "running-stranger":
        record = {**record, "running": {"member": "mallory", "turn_id": uuid.uuid4().hex, "upto": 0}}
    elif kind == "bad-version":
        record = {**record, "version": 99}
    elif kind in BAD_ENTRY:
        record = {**record, "transcript": [GOOD_ENTRY, {**GOOD_ENTRY, "message_id": "c" * 32, **BAD_ENTRY[kind]}]}
    elif kind == "empty-queue":  # killed its RoomActor (IndexError) instead of being refused
        record = {**record, "state": "busy", "active": {"send": "a" * 32, "round": 1, "queue": [], "said": 0,
                                                        "posted": 0, "mentioned": [], "needs_you": False}}
    body = b"{this is not json" if kind == "non-json" else json.dumps(record).encode()
    target = place(kind, body, rooms / name, staging, mode=mode,
                   sparse_size=ROOM_MAX_BYTES + 1 if kind == "huge" else None)
    return name, target


@pytest.mark.parametrize("kind", [kind_param(k) for k in KINDS])
def test_hostile_room_file_is_quarantined_and_the_valid_room_still_works(
    tmp_path: Path, logs: LogCapture, kind: str
) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with Gateway(root, runner=lambda turn: "[SILENT]") as gw:
        room = gw.create_room("good", ["alice", "bob"])
    rooms = root / "bot_relay" / "rooms"
    valid = json.loads((rooms / f"{room['room_id']}.json").read_text())
    name, target = plant(kind, rooms, valid, tmp_path / "staging")
    target_bytes = target.read_bytes() if target else None

    with Gateway(root, runner=lambda turn: "[SILENT]") as gw:
        assert [{k: r[k] for k in room} | {"state": r["state"]} for r in gw.list_rooms()] == [{**room, "state": "idle"}]
        assert gw.room_send("good", "user", "still here?")["status"] == "queued"
        assert gw.wait_room_idle("good", timeout=10) == "idle"
        with pytest.raises(KeyError):
            gw.room_transcript(f"evil-{kind}")
    assert not os.path.lexists(rooms / name), "the hostile file was left in rooms/"
    assert sorted((root / "bot_relay" / "quarantine").glob(f"{name}.*.quarantined")), "not quarantined"
    assert logs.matching("quarantined", name)
    if target is not None:  # never followed: the file it pointed to is untouched and still outside
        assert target.read_bytes() == target_bytes


def test_a_rooms_directory_swapped_while_the_gateway_runs_is_refused_and_dms_still_flow(tmp_path: Path) -> None:
    """Swapped at runtime: never written through (one swapped before a start is put back by it:
    tests/test_start_puts_back.py)."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    rooms = root / "bot_relay" / "rooms"
    with Gateway(root, runner=lambda turn: "pong") as gw:
        os.rename(rooms, tmp_path / "rooms.moved")
        os.symlink(elsewhere, rooms)
        # refused as room_send refuses it (a HostileFileError, a ValueError, before: the CLI's "bad argument")
        with pytest.raises(RuntimeError, match=rf"^room 'plan' could not record the room durably \(.*its directory "
                                               rf"{re.escape(str(rooms))} is a symlink.*\); it was NOT created$"):
            gw.create_room("plan", ["alice", "bob"])
        ack = gw.message_agent(sender="alice", target="bob", message="ping")
        assert gw.wait_outcome(ack["delivery_id"], timeout=10)["reply"] == "pong"
    assert list(elsewhere.iterdir()) == []  # nothing was written through the symlink


@pytest.mark.parametrize("ref", ["../../etc/passwd", "a" * 32 + "/../x", "A" * 32, "", None, 5])
def test_path_tricks_in_room_references_name_no_room(tmp_path: Path, ref: Any) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with Gateway(root, runner=lambda turn: "[SILENT]") as gw:
        gw.create_room("plan", ["alice", "bob"])
        with pytest.raises(KeyError, match="no room"):
            gw.room_transcript(ref)
        refused = gw.room_send(ref, "user", "hi")
        assert refused["error"].startswith("no room")


def test_a_symlinked_rooms_owner_lock_is_quarantined_under_its_own_name(tmp_path: Path, logs: LogCapture) -> None:
    """The rooms reuse the turn lock's code for ``rooms/.owner.lock``: its quarantine said "the turn lock is a
    symlink", sending the reader to ``locks/``. It names the rooms owner lock now, and the rooms still work."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    (root / "bot_relay" / "rooms").mkdir(mode=0o700, parents=True)
    os.symlink(victim, root / "bot_relay" / "rooms" / ".owner.lock")
    with Gateway(root, runner=lambda turn: "[SILENT]") as gw:
        assert gw.create_room("good", ["alice", "bob"])["name"] == "good"
    assert logs.matching("quarantined", ".owner.lock", "the rooms owner lock is a symlink"), logs.lines
    assert not logs.matching("turn lock")
    assert victim.read_text() == "not yours"


def test_two_room_files_of_the_same_name_in_another_case_keep_the_older(tmp_path: Path, logs: LogCapture) -> None:
    # Regression: both loaded, so the name (unique, case-insensitive) named two rooms.
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with Gateway(root, runner=lambda turn: "[SILENT]") as gw:
        older = gw.create_room("plan", ["alice", "bob"])
    rooms = root / "bot_relay" / "rooms"
    copy = json.loads((rooms / f"{older['room_id']}.json").read_text())
    twin = uuid.uuid4().hex
    copy |= {"room_id": twin, "name": "PLAN", "created_at": copy["created_at"] + 1}
    (rooms / f"{twin}.json").write_text(json.dumps(copy))
    (rooms / f"{twin}.json").chmod(0o600)

    with Gateway(root, runner=lambda turn: "[SILENT]") as gw:
        assert [r["room_id"] for r in gw.list_rooms()] == [older["room_id"]]
        assert gw.room_send("Plan", "user", "hi")["room_id"] == older["room_id"]
    assert not (rooms / f"{twin}.json").exists()
    assert sorted((root / "bot_relay" / "quarantine").glob(f"{twin}.json.*.quarantined"))
    assert logs.matching("like the older room", older["room_id"])


def swap_for_copy(directory: Path, copy: Path) -> Path:
    """Replace ``directory`` by a symlink to a copy of it at ``copy``; returns where the real one went."""
    shutil.copytree(directory, copy, symlinks=True)
    real = directory.with_name(directory.name + ".real")
    os.rename(directory, real)
    os.symlink(copy, directory)
    return real


def put_back(directory: Path, real: Path) -> None:
    os.unlink(directory)
    os.rename(real, directory)


def test_a_room_whose_file_cannot_be_written_is_not_created_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (docs review, repro_room_create_full_disk.sh): on a full disk `create_room` raised the store's
    StoreError, which the host answered without `error_type` (HostRooms: "the host refused the room request") after
    logging ERROR "submit handler failed" with a traceback. It raises RuntimeError as room_send does, naming the
    file and saying the room was NOT created, through the API, the host and the command alike; nothing is left."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    rooms, tmp = root / "bot_relay" / "rooms", root / ".bot_relay_tmp"
    real_write = os.write

    def full(fd: int, data: Any) -> int:  # the disk is full for room files only
        if bytes(data[:22]) == b'{"version":1,"room_id"':
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    refused = (rf"^room 'plan' could not record the room durably \(cannot write {re.escape(str(rooms))}/[0-9a-f]{{32}}"
               r"\.json: No space left on device \(ENOSPC\); free space on its filesystem\); it was NOT created$")
    with Gateway(root, runner=lambda turn: "[SILENT]", serve_submit=True) as gw:
        monkeypatch.setattr(os, "write", full)
        # the command (through the host): one line, exit 1; from here on the host's log goes where the CLI's does
        assert main(["room", "create", "plan", "alice", "bob", "--root", str(root)]) == 1
        err = capsys.readouterr().err.strip()
        assert re.match(refused, err.removeprefix("error: ")), err
        for create in (gw.create_room, HostRooms(root).create_room):
            with pytest.raises(RuntimeError, match=refused):
                create("plan", ["alice", "bob"])
        answer = request(root, {"op": "room", "action": "create", "name": "plan", "members": ["alice", "bob"]})
        assert (answer["error_type"], answer["reason"]) == ("RuntimeError", "unknown"), answer
        assert re.match(refused, answer["error"]), answer
        assert gw.list_rooms() == []
        assert list(rooms.glob("*.json")) == [] and list(tmp.glob(".*.json.*.tmp")) == []  # no file, no temp
        monkeypatch.undo()
        assert gw.create_room("plan", ["alice", "bob"])["name"] == "plan"  # the name stayed free
    logged = capsys.readouterr().err
    assert "submit handler failed" not in logged and "Traceback" not in logged, logged


def file_states(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.json"))}


def test_a_disband_through_a_swapped_rooms_directory_deletes_nothing_outside_and_keeps_the_room(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (hostile review): `room disband` through a running host deleted `<room_id>.json` by path, so with
    `rooms/` swapped for a symlink it deleted the file of that name outside the root and answered "disbanded", exit 0,
    while the real room file stayed (the room came back once `rooms/` was put back). Now the disband is refused
    naming the directory, logged, nothing is deleted, the room goes on, and it is disbanded once its directory is
    back."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    rooms = root / "bot_relay" / "rooms"
    refused = (rf"^room 'plan' is not disbanded: its file {re.escape(str(rooms))}/[0-9a-f]{{32}}\.json could not be "
               rf"deleted \({re.escape(str(rooms))} is a symlink or not a directory; refusing to use it\); nothing was "
               r"deleted and the room stays\. Put this user's real directory back in its place .*, then disband the "
               r"room again$")
    with Gateway(root, runner=lambda turn: "[SILENT]", serve_submit=True) as gw:
        room = gw.create_room("plan", ["alice", "bob"])
        real = swap_for_copy(rooms, tmp_path / "outside")  # the outside directory holds <room_id>.json too
        outside = file_states(tmp_path / "outside")
        assert f"{room['room_id']}.json" in outside
        with LogCapture() as logs, pytest.raises(RuntimeError, match=refused):
            gw.disband_room("plan")
        assert logs.matching("room plan: not disbanded", f"{rooms} is a symlink"), logs.lines
        # the command, through the host: one line, exit 1 (from here on the host's log goes where the CLI's does)
        assert main(["room", "disband", "plan", "--root", str(root), "--json"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and re.match(refused, err.strip().splitlines()[-1].removeprefix("error: ")), err
        assert file_states(tmp_path / "outside") == outside  # nothing deleted through the symlink
        assert [r["name"] for r in gw.list_rooms()] == ["plan"]
        put_back(rooms, real)
        assert gw.disband_room("plan")["state"] == "disbanded"
        assert gw.list_rooms() == []
    assert list(rooms.glob("*.json")) == []
    assert file_states(tmp_path / "outside") == outside


def test_a_send_whose_write_failed_leaves_no_trace_and_the_room_works_once_its_directory_is_back(
    tmp_path: Path, logs: LogCapture
) -> None:
    # Regression: the refused message stayed in the transcript, the room stayed "busy" and every later send
    # answered "gateway is not running" until a restart (the failed write halted the room for good).
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    runner = RecordingRunner(lambda turn: "[SILENT]")
    with Gateway(root, runner=runner) as gw:
        room = gw.create_room("plan", ["alice", "bob"])
        rooms = root / "bot_relay" / "rooms"
        real = swap_for_copy(rooms, tmp_path / "outside")
        outside = file_states(tmp_path / "outside")
        for text in ("lost @bob", "lost again @bob"):  # refused each time with the reason, nothing kept
            with pytest.raises(RuntimeError, match=r"could not record the message durably \(.*is a symlink\); "
                                                   r"it was NOT sent"):
                gw.room_send("plan", "user", text)
            assert gw.room_transcript("plan") == []
            assert [r["state"] for r in gw.list_rooms()] == ["idle"]
        # (the room's start may have met the swapped directory first: "could not write its file")
        assert logs.matching("room plan: could not", "symlink"), logs.lines
        put_back(rooms, real)

        ack = gw.room_send("plan", "user", "kept @bob")
        assert ack["status"] == "queued"
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        assert [(e["author"], e["text"]) for e in gw.room_transcript("plan")] == [("user", "kept @bob")]
        (turn,) = [t for t in runner.entered if t.session == "Group: plan"]
        assert "kept @bob" in turn.content and "lost" not in turn.content
    assert file_states(tmp_path / "outside") == outside  # nothing was written through the symlink
    on_disk = json.loads((rooms / f"{room['room_id']}.json").read_text())
    assert [e["text"] for e in on_disk["transcript"]] == ["kept @bob"]


def test_a_turn_result_whose_write_failed_is_written_at_the_next_send_and_no_turn_runs_twice(
    tmp_path: Path, logs: LogCapture
) -> None:
    # Regression: the room halted for good after the failed write (no further turn, every send refused
    # "gateway is not running"). Now the next send writes alice's reply with itself; bob's turn, never
    # recorded, starts then; alice's turn is not run again.
    root = make_root(tmp_path, {"alice": {}, "bob": {}, "carol": {}})
    rooms = root / "bot_relay" / "rooms"
    swapped: list[Path] = []

    def behave(turn: Turn) -> str:
        if turn.profile == "alice" and not swapped:  # the write after her turn finds rooms/ swapped
            swapped.append(swap_for_copy(rooms, tmp_path / "outside"))
            return "alice speaks"
        return "[SILENT]"

    runner = RecordingRunner(behave)
    with Gateway(root, runner=runner) as gw:
        gw.create_room("plan", ["alice", "bob", "carol"])
        assert gw.room_send("plan", "user", "go")["status"] == "queued"
        await_condition(lambda: logs.matching("room plan: could not record the turn of bob", "symlink"),
                        timeout=20, message="the failed write of bob's turn logged")
        assert [e["text"] for e in gw.room_transcript("plan")] == ["go"]  # what its file holds
        with pytest.raises(RuntimeError, match=r"could not record the message durably \(.*symlink"):
            gw.room_send("plan", "user", "refused")
        put_back(rooms, swapped[0])

        assert gw.room_send("plan", "user", "again")["status"] == "queued"
        assert gw.wait_room_idle("plan", timeout=20) == "idle"
        entries = gw.room_transcript("plan")
    assert [(e["author"], e["text"]) for e in entries] == [("user", "go"), ("alice", "alice speaks"),
                                                          ("user", "again")]
    turns = [t for t in runner.entered if t.session == "Group: plan"]
    # round 1 of "go": alice once, then bob and carol (recorded and started with "again"), who read her reply
    # and "again"; round 2: alice reads "again"; then nobody has news for the round of "again"
    assert [t.profile for t in turns] == ["alice", "bob", "carol", "alice"]
    assert all(text in turns[1].content for text in ("go", "alice speaks", "again"))
    assert all("refused" not in t.content for t in turns)
    assert not list((rooms / ".started").glob("*.json")), "a start mark was left behind"


def test_a_turn_result_never_written_before_a_restart_is_shown_interrupted_not_run_again(
    tmp_path: Path, logs: LogCapture
) -> None:
    # Exactly once across a failed write: the file still holds alice's turn as running (with its start mark),
    # so the next start shows it interrupted and goes on with bob; her turn never runs twice.
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    rooms = root / "bot_relay" / "rooms"
    swapped: list[Path] = []

    def behave(turn: Turn) -> str:
        if turn.profile == "alice" and not swapped:
            swapped.append(swap_for_copy(rooms, tmp_path / "outside"))
            return "alice speaks"
        return "[SILENT]"

    runner = RecordingRunner(behave)
    with Gateway(root, runner=runner) as gw:
        gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "go")
        await_condition(lambda: logs.matching("room plan: could not record the turn of bob"), timeout=20,
                        message="the failed write of bob's turn logged")
    put_back(rooms, swapped[0])
    with Gateway(root, runner=runner) as gw:
        assert gw.wait_room_idle("plan", timeout=20) == "idle"
        entries = gw.room_transcript("plan")
    assert [(e["author"], e["status"]) for e in entries] == [("user", "said"), ("alice", "interrupted")]
    assert [t.profile for t in runner.entered if t.session == "Group: plan"] == ["alice", "bob"]


def test_a_started_directory_swapped_for_a_symlink_is_quarantined_and_the_turns_run(
    tmp_path: Path, logs: LogCapture
) -> None:
    # Regression: every member turn failed "the start mark … was refused: …/.started is a symlink" (its text
    # saying "the DM was NOT delivered"), with no log line, until someone removed the symlink by hand.
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    started = root / "bot_relay" / "rooms" / ".started"
    outside = tmp_path / "outside"
    outside.mkdir()
    with Gateway(root, runner=lambda turn: f"{turn.profile} here") as gw:
        gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "first @alice")
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        os.rename(started, tmp_path / "started.real")
        os.symlink(outside, started)
        gw.room_send("plan", "user", "second @bob")
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        entries = gw.room_transcript("plan")
    second = [e["text"] for e in entries].index("second @bob")
    assert [e["status"] for e in entries] == ["said"] * len(entries)  # no turn failed
    assert (entries[second + 1]["author"], entries[second + 1]["text"]) == ("bob", "bob here")
    assert started.is_dir() and not started.is_symlink()
    assert sorted((root / "bot_relay" / "quarantine").glob(".started.*.quarantined"))
    assert logs.matching("quarantined", ".started", "start-mark directory"), logs.lines
    assert list(outside.iterdir()) == []  # no mark was written through the symlink


def test_a_symlinked_started_directory_at_start_is_never_followed(tmp_path: Path) -> None:
    # Regression: the start's sweep listed the symlink's target and unlinked every <32 hex>.json there,
    # outside the root; a running turn whose marks are out of reach counts as begun (never run twice).
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    files = RoomFiles(root, fsync=False).ensure()
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / f"{uuid.uuid4().hex}.json"
    victim.write_text("not yours")
    os.symlink(outside, files.directory / ".started")
    assert files.began(uuid.uuid4().hex)  # not looked into: counted as begun
    files.sweep_starts(set())
    assert victim.read_text() == "not yours"
    assert (files.directory / ".started").is_dir() and not (files.directory / ".started").is_symlink()
    assert not files.began(uuid.uuid4().hex)


@pytest.mark.parametrize("decoy", [True, False], ids=["decoy-room-file-outside", "nothing-outside"])
def test_a_member_turn_through_a_swapped_rooms_directory_is_refused_never_judged_by_a_file_outside(
    tmp_path: Path, decoy: bool
) -> None:
    # Regression (swapped directories): whether the room of a member turn was still there was looked up by path,
    # so through a rooms/ swapped for a symlink a file outside the root decided it, and with none there the turn
    # failed "room … was disbanded" though nobody disbanded it. Now rooms/ is looked into only through the
    # checked walk: refused, naming the symlink; the turn does not run either way.
    from hermes_actors.errors import StoreError
    from hermes_actors.rooms.store import RoomStartMarks

    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    files = RoomFiles(root, fsync=False).ensure()
    room_id = uuid.uuid4().hex
    outside = tmp_path / "outside"
    outside.mkdir()
    if decoy:
        (outside / f"{room_id}.json").write_text("{}")
    os.rename(files.directory, tmp_path / "rooms.real")
    os.symlink(outside, files.directory)
    with pytest.raises(StoreError) as raised:
        RoomStartMarks(root, room_id, fsync=False).append_durably({"t": "started", "id": uuid.uuid4().hex})
    assert "was refused" in str(raised.value) and f"{files.directory} is a symlink" in str(raised.value)
    assert sorted(os.listdir(outside)) == ([f"{room_id}.json"] if decoy else [])
