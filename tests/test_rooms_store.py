"""Room files: what the writer writes, the reader accepts (file_budget.fit_room, RoomFiles, parse_room)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from roots import make_root

from hermes_actors.errors import ValidationError
from hermes_actors.rooms.file_budget import ROOM_WRITE_BUDGET, fit_room
from hermes_actors.rooms.room_record import RoomRecord, parse_room
from hermes_actors.rooms.store import ROOM_MAX_BYTES, RoomFiles, rooms_held_text

BIG = "\u4e2d" * 16_000  # a legal message (16,000 chars) of 48,000 bytes of UTF-8


def _entry(number: int, text: str) -> dict[str, Any]:
    return {"message_id": uuid.uuid4().hex, "author": "user", "text": f"{number} {text}", "at": time.time(),
            "round": 0, "status": "said"}


def _record(entries: int, text: str = BIG) -> RoomRecord:
    record = RoomRecord(uuid.uuid4().hex, "big", ["alice", "bob"], {"alice": "alice", "bob": "bob"}, time.time())
    record.transcript = [_entry(i, text) for i in range(entries)]
    return record


def test_a_room_of_many_big_messages_is_written_within_budget_and_loads_again(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    files = RoomFiles(root, fsync=False).ensure()
    record = _record(200)  # 9.6 MB of messages: more than the reader's bound was before
    record.seen = {"alice": 150, "bob": 199}
    files.write(record)
    size = files.path(record.room_id).stat().st_size
    assert size <= ROOM_WRITE_BUDGET < ROOM_MAX_BYTES
    loaded = files.load_all()
    assert [r.room_id for r in loaded] == [record.room_id], "the room the writer wrote was refused"
    room = loaded[0]
    assert room.base + len(room.transcript) == 200  # every message is counted, the oldest were dropped
    assert room.transcript[-1]["text"].startswith("199 ")
    assert room.transcript[0]["text"].startswith(f"{room.base} ")  # positions still name the same entries
    assert room.seen == {"alice": 150, "bob": 199}
    assert not (root / "bot_relay" / "quarantine").exists()


def test_fit_room_keeps_the_newest_entries_and_counts_the_dropped_ones() -> None:
    record = _record(10, "x" * 1000)
    before = list(record.transcript)
    data = fit_room(record, keep=8, budget=4000)
    assert len(data) <= 4000
    assert record.transcript == before[-len(record.transcript):]
    assert record.base == 10 - len(record.transcript) >= 2
    small = _record(3, "hello")
    assert fit_room(small) and small.base == 0 and len(small.transcript) == 3
    one = _record(1, "x" * 1000)
    fit_room(one, budget=10)  # the newest entry always stays
    assert len(one.transcript) == 1 and one.base == 0


def test_fit_room_never_drops_a_send_whose_round_has_not_ended() -> None:
    """Regression: the writer dropped acked sends still waiting for their rounds (14 of 80 long sends were never
    shown to any member): they, and what follows them, stay whatever the budget."""
    from hermes_actors.rooms.file_budget import undelivered_bytes, undelivered_from

    record = _record(10, "x" * 1000)
    waiting = record.transcript[3]["message_id"]
    record.sends = [{"message_id": waiting, "sender": "user", "mentioned": []}]
    assert undelivered_from(record) == 3
    assert 1000 < undelivered_bytes(record) < 2 * 1000  # the waiting send itself, not what followed it
    fit_room(record, budget=2000)
    assert record.base == 3 and record.transcript[0]["message_id"] == waiting
    active = _record(5, "y" * 1000)
    active.active = {"send": active.transcript[1]["message_id"], "round": 1, "queue": ["alice"]}
    fit_room(active, budget=10)
    assert active.base == 1  # the active round's send stays too
    idle = _record(4, "z" * 1000)
    assert undelivered_from(idle) == 4 and undelivered_bytes(idle) == 0


def test_verbose_replies_after_a_waiting_send_are_cut_not_the_send_and_the_file_still_fits(tmp_path: Path) -> None:
    """Regression: nothing from the oldest waiting send on could be dropped, so members' long replies piled up
    there until a write passed the reader's 16 MiB and the room halted for good, its acked sends undelivered.
    The oldest replies' texts are cut to a note instead; positions and the waiting sends stay whole."""
    record = _record(120)  # 120 entries of 48,000 bytes: 5.8 MB, all after the waiting send
    waiting = record.transcript[0]["message_id"]
    record.sends = [{"message_id": waiting, "sender": "user", "mentioned": []}]
    data = fit_room(record)
    assert len(data) <= ROOM_WRITE_BUDGET
    assert record.base == 0 and len(record.transcript) == 120  # nothing dropped: positions unchanged
    assert record.transcript[0]["text"].startswith("0 ") and len(record.transcript[0]["text"]) > 16_000
    cut = [e for e in record.transcript if "characters dropped" in e["text"]]
    assert cut and cut[0] is record.transcript[1]  # the oldest replies first
    assert record.transcript[-1]["text"].startswith("119 ")  # the newest whole
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    files = RoomFiles(root, fsync=False).ensure()
    files.write(record)
    assert [r.room_id for r in files.load_all()] == [record.room_id]


def test_many_short_replies_after_a_waiting_send_are_cut_too(tmp_path: Path) -> None:
    """Replies under 200 characters were never cut: a backlog of sends with short replies each kept the file
    far over its budget (7.4 MB seen). Any reply longer than its note is cut now, oldest first."""
    record = _record(1, "first")
    waiting = record.transcript[0]["message_id"]
    record.sends = [{"message_id": waiting, "sender": "user", "mentioned": []}]
    record.transcript += [_entry(i, "\u4e2d" * 199) for i in range(1, 8001)]  # 8,000 replies of 597 bytes
    data = fit_room(record)
    assert len(data) <= ROOM_WRITE_BUDGET
    assert record.base == 0 and len(record.transcript) == 8001 and record.transcript[0]["text"] == "0 first"
    assert record.transcript[-1]["text"].startswith("8000 ")  # the newest stays whole


@pytest.mark.parametrize(
    "change",
    [{"round": -3}, {"round": 4}, {"round": True}, {"status": {"a": 1}}, {"status": "shouted"},
     {"author": "mallory"}, {"message_id": "x"}, {"at": None}],
)
def test_a_transcript_entry_that_the_room_could_not_have_posted_is_refused(change: dict[str, Any]) -> None:
    # Regression: only the fields' types were checked, so {"round": -3, "status": {"a": 1}} loaded and showed
    # as "[-3] bob [{'a': 1}]: t". Refused like any other bad field: the file is quarantined by its reader.
    good = {"message_id": "b" * 32, "author": "bob", "text": "t", "at": 1.0, "round": 1, "status": "said"}
    data = {"version": 1, "room_id": "a" * 32, "name": "plan", "members": ["alice", "bob"],
            "handles": {"alice": "alice", "bob": "bob"}, "created_at": 1.0, "state": "idle", "transcript": [good],
            "seen": {}, "base": 0, "sends": [], "active": None, "running": None, "needs_you": False}
    assert parse_room(data).transcript == [good]
    with pytest.raises(ValidationError, match="bad transcript entry 1"):
        parse_room({**data, "transcript": [good, {**good, **change}]})


@pytest.mark.parametrize(("in_this_process", "text"), [
    (False, "another gateway process drives the rooms of /r"),
    (True, "another Gateway in this process drives the rooms of /r (one Gateway drives a root's rooms): make the "
           "room calls on that one, or stop it first"),
])
def test_rooms_held_text_says_whose_gateway_holds_the_rooms(in_this_process: bool, text: str) -> None:
    assert rooms_held_text(Path("/r"), in_this_process=in_this_process) == text


def test_only_the_owner_lock_a_gateway_of_this_process_took_is_told_as_this_processs(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    files = RoomFiles(root, fsync=False).ensure()
    other = files.owner_lock()  # taken as another process would: not through take_owner_lock
    assert other.try_acquire()
    assert files.owned_elsewhere() == rooms_held_text(root, in_this_process=False)
    other.release()
    mine = files.owner_lock()
    assert files.take_owner_lock(mine)
    try:
        assert files.owned_elsewhere() == rooms_held_text(root, in_this_process=True)
    finally:
        files.release_owner_lock(mine)
        mine.close()
    assert files.owned_elsewhere() == rooms_held_text(root, in_this_process=False)  # let go: no longer noted
    other.close()


def test_a_start_mark_whose_room_look_fails_is_withdrawn_and_the_turn_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (diff review of the mark-then-look order): with the start mark written first, a look at the room's
    file that raised (out of descriptors, a refused directory) left the mark: a kill before the room recorded the
    turn failed made the next start call a turn that never ran interrupted. Now the mark is withdrawn."""
    import errno
    import os

    from hermes_actors.errors import StoreError
    from hermes_actors.rooms import store
    from hermes_actors.rooms.store import RoomFiles, RoomStartMarks

    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    room_id, turn_id = "a" * 32, "b" * 32
    files = RoomFiles(root)
    files.ensure()
    files.path(room_id).write_text("{}")
    real = store.lexists_below

    def failing(base: Path, path: Path) -> bool:
        if path.name == f"{room_id}.json":
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(base, path)

    monkeypatch.setattr(store, "lexists_below", failing)
    with pytest.raises(StoreError, match="could not be looked at"):
        RoomStartMarks(root, room_id).append_durably({"t": "started", "id": turn_id})
    assert not files.start_mark(turn_id).exists()
