"""Group rooms through the Gateway: rounds and caps, mentions, pass/settle, @user, refusals,
serialization with DMs, subscriber events, restart."""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pykka
import pytest
from roots import CRASHING_REPLY, LogCapture, RecordingRunner, crash_on_reply, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.facade import shutdown as facade_shutdown
from hermes_actors.messages import Turn
from hermes_actors.ops.status import live_status
from hermes_actors.rooms import store as room_store
from hermes_actors.rooms.rooms import RoomsTakeover
from hermes_actors.rooms.store import STARTED_DIR, RoomFiles

ENTRY_KEYS = {"message_id", "author", "text", "at", "round", "status"}


@pytest.fixture
def room_root(tmp_path: Path) -> Path:
    return make_root(tmp_path, {"alice": {}, "bob": {}, "carol": {}, "dave": {"display_name": "Dave the Critic"}})


class Script:
    """A runner: each profile answers its scripted replies in order, then passes (``[SILENT]``)."""

    def __init__(self, **replies: list[str]) -> None:
        self.replies = {k: list(v) for k, v in replies.items()}
        self.lock = threading.Lock()

    def __call__(self, turn: Turn) -> str:
        with self.lock:
            queue = self.replies.get(turn.profile, [])
            return queue.pop(0) if queue else "[SILENT]"


def said(transcript: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(e["author"], e["text"], e["round"]) for e in transcript if e["status"] == "said"]


def room_turns(runner: RecordingRunner) -> list[Turn]:
    return [t for t in runner.entered if t.session.startswith("Group: ")]


def send_and_settle(gw: Gateway) -> str:
    """A DM from alice to bob; its outcome's status."""
    ack = gw.message_agent(sender="alice", target="bob", message="hi")
    return str(gw.wait_outcome(ack["delivery_id"], timeout=30)["status"])


# ── creating, listing, disbanding, refusals ─────────────────────────────────


def test_create_list_disband(room_root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, room_root, Script())
    room = gw.create_room("plan", ["alice", "@bob", "Dave the Critic"])
    assert set(room) == {"room_id", "name", "members"}
    assert room["name"] == "plan" and room["members"] == ["alice", "bob", "dave"]
    assert len(room["room_id"]) == 32
    rows = gw.list_rooms()
    assert rows == [{**room, "state": "idle", "messages": 0, "last_activity": rows[0]["last_activity"]}]
    assert isinstance(rows[0]["last_activity"], float)  # created_at until a message is posted
    assert gw.wait_room_idle("PLAN", timeout=1) == "idle"  # a name resolves case-insensitively
    assert gw.disband_room(room["room_id"]) == {**room, "state": "disbanded"}
    assert gw.list_rooms() == []
    with pytest.raises(KeyError, match="no room 'plan'"):
        gw.room_transcript("plan")
    refused = gw.room_send("plan", "user", "anyone?")
    assert refused["error"].startswith("no room 'plan'") and "reason" in refused


@pytest.mark.parametrize(
    ("name", "members", "error"),
    [
        ("solo", ["alice"], "a room has 2 to 6 members, not 1"),
        ("crowd", ["alice", "bob", "carol", "dave", "hermes", "erin", "frank"], "a room has 2 to 6 members, not 7"),
        ("ghost", ["alice", "nobody"], "unknown member 'nobody'"),
        ("twice", ["alice", "@alice"], "member '@alice' is listed twice"),
        ("", ["alice", "bob"], "room name is required"),
        ("plan #launch", ["alice", "bob"], "room name 'plan #launch' contains ' #'"),
    ],
)
def test_create_room_refusals(tmp_path: Path, gateways: list[Gateway], name: str, members: list[str],
                              error: str) -> None:
    root = make_root(tmp_path, {n: {} for n in ("alice", "bob", "carol", "dave", "erin", "frank")})
    gw = start_gateway(gateways, root, Script())
    with pytest.raises(ValueError, match=error):
        gw.create_room(name, members)
    assert gw.list_rooms() == []


def test_room_names_are_unique(room_root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, room_root, Script())
    gw.create_room("plan", ["alice", "bob"])
    with pytest.raises(ValueError, match="a room named 'Plan' exists already"):
        gw.create_room("Plan", ["carol", "dave"])


@pytest.mark.parametrize(
    ("sender", "text", "error"),
    [
        ("user", "", "text is required"),
        ("user", "   ", "text is required"),
        ("carol", "hi", "Unknown sender 'carol': not a member of this room"),
        ("nobody", "hi", "Unknown sender 'nobody'"),
    ],
)
def test_room_send_refusals(room_root: Path, gateways: list[Gateway], sender: str, text: str, error: str) -> None:
    runner = RecordingRunner(Script())
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob"])
    refused = gw.room_send("plan", sender, text)
    assert set(refused) == {"error", "reason"} and refused["error"].startswith(error), refused
    assert gw.room_transcript("plan") == []
    assert gw.wait_room_idle("plan", timeout=1) == "idle" and runner.entered == []


# ── rounds ──────────────────────────────────────────────────────────────────


def test_everyone_answers_when_nobody_is_mentioned_and_a_silent_round_settles(
    room_root: Path, gateways: list[Gateway]
) -> None:
    runner = RecordingRunner(Script(alice=["I'd ship Friday."]))
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob", "carol"])
    ack = gw.room_send("plan", "user", "When do we ship?")
    assert ack["status"] == "queued" and set(ack) == {"status", "room_id", "message_id"}
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    transcript = gw.room_transcript("plan")
    assert all(set(e) == ENTRY_KEYS for e in transcript)
    assert transcript[0]["message_id"] == ack["message_id"]
    assert said(transcript) == [("user", "When do we ship?", 0), ("alice", "I'd ship Friday.", 1)]
    # round 1: all three (bob and carol read alice's reply in their turns); round 2 has nobody with news
    # since their last turn: each passes without a turn, and the silent round settles the room.
    turns = room_turns(runner)
    assert [t.profile for t in turns] == ["alice", "bob", "carol"]
    assert turns[2].content.splitlines()[1:-1] == ["user: When do we ship?", "@alice: I'd ship Friday."]


def test_mentions_scope_who_answers(room_root: Path, gateways: list[Gateway]) -> None:
    runner = RecordingRunner(Script(bob=["@carol can you check the numbers?"], carol=["Numbers look right."]))
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob", "carol", "dave"])
    gw.room_send("plan", "user", "@bob, is the report ready?")
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    assert said(gw.room_transcript("plan")) == [
        ("user", "@bob, is the report ready?", 0),
        ("bob", "@carol can you check the numbers?", 1),
        ("carol", "Numbers look right.", 2),
    ]
    # round 1: bob only; round 2: carol only (mentioned); round 3: everyone with news; all pass.
    profiles = [t.profile for t in room_turns(runner)]
    assert profiles[:2] == ["bob", "carol"]
    assert sorted(profiles[2:]) == ["alice", "bob", "dave"]


def test_friendly_name_mentions_resolve_like_message_agent_targets(room_root: Path, gateways: list[Gateway]) -> None:
    runner = RecordingRunner(Script())
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob", "dave"])
    gw.room_send("plan", "alice", "@dave-the-critic please review")
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    assert [t.profile for t in room_turns(runner)] == ["dave"]


def test_caps_three_rounds_and_ten_messages(room_root: Path, gateways: list[Gateway]) -> None:
    chatty = {name: [f"{name} says {n}" for n in range(5)] for name in ("alice", "bob", "carol", "dave")}
    runner = RecordingRunner(Script(**chatty))
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob", "carol", "dave"])
    gw.room_send("plan", "user", "Brainstorm!")
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    replies = said(gw.room_transcript("plan"))[1:]
    assert len(replies) == 10  # 4 + 4 + 2: the cap ends round 3 early
    assert [r for _, _, r in replies] == [1] * 4 + [2] * 4 + [3] * 2
    assert len(room_turns(runner)) == 10

    two = RecordingRunner(Script(alice=[f"a{n}" for n in range(9)], bob=[f"b{n}" for n in range(9)]))
    gw2 = start_gateway(gateways, make_root(room_root.parent, {"alice": {}, "bob": {}}, name="two"), two)
    gw2.create_room("duo", ["alice", "bob"])
    gw2.room_send("duo", "user", "go")
    assert gw2.wait_room_idle("duo", timeout=10) == "idle"
    assert [r for _, _, r in said(gw2.room_transcript("duo"))[1:]] == [1, 1, 2, 2, 3, 3]  # 3 rounds, no more


def test_user_mention_marks_needs_you_until_the_user_writes(room_root: Path, gateways: list[Gateway]) -> None:
    runner = RecordingRunner(Script(alice=["@user which date do you prefer?"], bob=["Either works."]))
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "Pick a date.")
    assert gw.wait_room_idle("plan", timeout=10) == "needs_you"
    assert gw.list_rooms()[0]["state"] == "needs_you"
    # the round finished (bob answered) but no round 2 started
    assert [t.profile for t in room_turns(runner)] == ["alice", "bob"]
    gw.room_send("plan", "user", "Friday.")
    assert gw.wait_room_idle("plan", timeout=10) == "idle"


def test_member_turns_run_in_the_group_session_with_the_news_attributed(
    room_root: Path, gateways: list[Gateway]
) -> None:
    runner = RecordingRunner(Script(alice=["Sounds good."]))
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("launch", ["alice", "bob"])
    gw.room_send("launch", "bob", "Launch is Monday.")
    assert gw.wait_room_idle("launch", timeout=10) == "idle"
    turns = room_turns(runner)
    assert [t.profile for t in turns] == ["alice", "bob"]
    assert {t.session for t in turns} == {"Group: launch"}
    assert turns[0].content.splitlines()[1:-1] == ["@bob: Launch is Monday."]
    assert turns[1].content.splitlines()[1:-1] == ["@alice: Sounds good."]  # its own message is not news
    gw.room_send("launch", "user", "Thanks both.")
    assert gw.wait_room_idle("launch", timeout=10) == "idle"
    later = room_turns(runner)[2:]
    assert [t.content.splitlines()[1:-1] for t in later] == [["user: Thanks both."]] * 2


def test_failed_member_turn_is_shown_and_counts_as_a_pass(room_root: Path, gateways: list[Gateway]) -> None:
    def behave(turn: Turn) -> str:
        if turn.profile == "bob":
            raise RuntimeError("model exploded")
        return "[SILENT]"

    gw = start_gateway(gateways, room_root, RecordingRunner(behave))
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "hi")
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    failed = [e for e in gw.room_transcript("plan") if e["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["author"] == "bob" and "model exploded" in failed[0]["text"]


# ── serialization with DMs ──────────────────────────────────────────────────


def test_member_turns_queue_behind_the_members_dms(room_root: Path, gateways: list[Gateway]) -> None:
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if turn.session == "Bot Chat":
            entered.set()
            assert release.wait(10)
            return "dm done"
        return "room reply" if turn.profile == "bob" else "[SILENT]"

    runner = RecordingRunner(behave)
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob"])
    dm = gw.message_agent(sender="alice", target="bob", message="long job")
    assert entered.wait(10)
    gw.room_send("plan", "user", "@bob status?")
    release.set()
    assert gw.wait_outcome(dm["delivery_id"], timeout=10)["status"] == "replied"
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    bob = [r for r in runner.records if r.turn.profile == "bob"]
    assert [r.turn.session for r in sorted(bob, key=lambda r: r.entered)][:2] == ["Bot Chat", "Group: plan"]
    ordered = sorted(bob, key=lambda r: r.entered)
    for before, after in itertools.pairwise(ordered):
        assert after.entered >= before.exited, "two turns of bob overlapped"


def test_pending_sends_are_capped_so_the_room_file_stays_bounded(
    room_root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hermes_actors.rooms.room_actor.MAX_PENDING_SENDS", 2)
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        assert release.wait(10)
        return "[SILENT]"

    gw = start_gateway(gateways, room_root, behave)
    gw.create_room("plan", ["alice", "bob"])
    assert gw.room_send("plan", "user", "@bob one")["status"] == "queued"  # its round runs bob's turn
    assert entered.wait(10)
    assert gw.room_send("plan", "user", "@bob two")["status"] == "queued"
    assert gw.room_send("plan", "user", "@bob three")["status"] == "queued"
    refused = gw.room_send("plan", "user", "@bob four")
    assert "2 messages waiting" in refused["error"], refused
    release.set()
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    assert [e["text"] for e in gw.room_transcript("plan")] == ["@bob one", "@bob two", "@bob three"]


def test_a_send_that_would_crowd_undelivered_sends_out_of_the_file_is_refused_and_none_is_lost(
    room_root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: while a member turn was held, 80 long sends were all acked, and the writer's byte budget then
    dropped 14 of them from the file before any round delivered them. Acked sends are never dropped now; a send
    that would make them too big to keep is refused, NOT posted."""
    import re

    monkeypatch.setattr("hermes_actors.rooms.room_actor.UNDELIVERED_BUDGET", 200_000)  # (the file's: 4 MiB)
    release, entered = threading.Event(), threading.Event()
    shown: set[str] = set()
    lock = threading.Lock()

    def behave(turn: Turn) -> str:
        entered.set()
        assert release.wait(20)
        with lock:
            shown.update(re.findall(r"MSG(\d+)END", turn.content))
        return "[SILENT]"

    gw = start_gateway(gateways, room_root, behave)
    gw.create_room("big", ["alice", "bob"])
    acked: list[str] = []
    refused: dict[str, Any] = {}
    for n in range(20):
        answer = gw.room_send("big", "user", f"MSG{n}END " + "\U0001F600" * 15_000)  # 60 KB each
        if "error" in answer:
            refused = answer
            break
        acked.append(str(n))
        if n == 0:
            assert entered.wait(10)  # the first round's first turn is held
    assert refused and "have not delivered yet" in refused["error"] and "NOT posted" in refused["error"], refused
    assert 2 <= len(acked) < 20
    release.set()
    assert gw.wait_room_idle("big", timeout=60) == "idle"
    assert sorted(shown, key=int) == acked, "an acked send was never shown to a member"


def test_a_send_posted_while_a_members_turn_runs_is_shown_to_that_member_next(
    room_root: Path, gateways: list[Gateway]
) -> None:
    """Regression: a member's reply marked everything up to the end of the transcript read, so a send posted
    while its turn ran (addressed to it) was never shown to it: its next round found nothing new."""
    release, entered = threading.Event(), threading.Event()
    contents: dict[str, list[str]] = {}
    lock = threading.Lock()

    def behave(turn: Turn) -> str:
        with lock:
            contents.setdefault(turn.profile, []).append(turn.content)
        if turn.profile == "alice" and not entered.is_set():
            entered.set()
            assert release.wait(20)
        return "ok noted"

    gw = start_gateway(gateways, room_root, behave)
    gw.create_room("plan", ["alice", "bob"])
    assert gw.room_send("plan", "user", "@alice first question")["status"] == "queued"
    assert entered.wait(10)
    assert gw.room_send("plan", "user", "@alice SECOND question, only for you")["status"] == "queued"
    release.set()
    assert gw.wait_room_idle("plan", timeout=20) in ("idle", "needs_you")
    alice = contents["alice"]
    assert any("SECOND question" in text for text in alice[1:]), alice


def test_a_member_turn_runs_with_the_runner_when_a_live_owner_is_attached(
    room_root: Path, gateways: list[Gateway]
) -> None:
    # Regression: bob's room turn was handed to his open Bot Chat window (the live owner) like a DM.
    handed: list[Turn] = []

    def owner(turn: Turn) -> str:
        handed.append(turn)
        return "owner answered"

    runner = RecordingRunner(Script(bob=["bob in the room"]))
    gw = start_gateway(gateways, room_root, runner)
    gw.attach_live_owner("bob", owner)
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "@bob hello")
    assert gw.wait_room_idle("plan", timeout=10) == "idle"
    assert handed == []
    assert [(t.profile, t.session) for t in room_turns(runner)][:1] == [("bob", "Group: plan")]
    assert said(gw.room_transcript("plan"))[1:] == [("bob", "bob in the room", 1)]


def test_a_member_turn_queued_when_the_room_is_disbanded_never_runs(room_root: Path, gateways: list[Gateway]) -> None:
    # Regression: bob's queued room turn ran after disband_room had returned.
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if turn.session == "Bot Chat":
            entered.set()
            assert release.wait(10)
        return "done"

    runner = RecordingRunner(behave)
    gw = start_gateway(gateways, room_root, runner)
    room = gw.create_room("plan", ["alice", "bob"])
    dm = gw.message_agent(sender="alice", target="bob", message="long job")
    assert entered.wait(10)
    gw.room_send("plan", "user", "@bob status?")  # on disk as running before the ack; queued behind the DM
    path = room_root / "bot_relay" / "rooms" / f"{room['room_id']}.json"
    turn_id = json.loads(path.read_text())["running"]["turn_id"]
    assert gw.disband_room("plan")["state"] == "disbanded"
    release.set()
    assert gw.wait_outcome(dm["delivery_id"], timeout=10)["status"] == "replied"
    outcome = gw.wait_outcome(turn_id, timeout=10)
    assert outcome["status"] == "failed" and "disbanded" in outcome["error"], outcome
    assert room_turns(runner) == []


@pytest.mark.parametrize("disband_at", ["before the mark is written", "after the mark is written"])
def test_a_disband_landing_while_a_member_turn_marks_its_start_keeps_it_from_running(
    room_root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, disband_at: str
) -> None:
    # Regression (review): the turn looked at the room's file, then wrote its start mark; a disband in between
    # deleted the file (and the mark not yet written), then the turn wrote its mark and ran after disband_room had
    # returned, its mark left in rooms/.started. The disband is made to land right at the mark's write.
    real_write = room_store.atomic_write_bytes
    in_window, disbanded = threading.Event(), threading.Event()

    def write_with_disband(path: Path, *args: Any, **kwargs: Any) -> None:
        if path.parent.name != STARTED_DIR:
            real_write(path, *args, **kwargs)
            return
        if disband_at == "after the mark is written":
            real_write(path, *args, **kwargs)
        in_window.set()
        assert disbanded.wait(20), "the disband never returned"
        if disband_at == "before the mark is written":
            real_write(path, *args, **kwargs)

    monkeypatch.setattr(room_store, "atomic_write_bytes", write_with_disband)
    runner = RecordingRunner(Script(bob=["bob speaks"]))
    gw = start_gateway(gateways, room_root, runner)
    room = gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "@bob status?")
    assert in_window.wait(20), "bob's turn never marked its start"
    path = room_root / "bot_relay" / "rooms" / f"{room['room_id']}.json"
    turn_id = json.loads(path.read_text())["running"]["turn_id"]
    try:
        assert gw.disband_room("plan")["state"] == "disbanded"
    finally:
        disbanded.set()
    outcome = gw.wait_outcome(turn_id, timeout=20)
    assert outcome["status"] == "failed" and "disbanded" in outcome["error"], outcome
    assert room_turns(runner) == []
    assert list((room_root / "bot_relay" / "rooms" / STARTED_DIR).iterdir()) == [], "a start mark was left behind"


# ── events ──────────────────────────────────────────────────────────────────


def test_room_events_reach_subscribers_with_a_kind(room_root: Path, gateways: list[Gateway]) -> None:
    events: list[dict[str, Any]] = []
    lock = threading.Lock()

    def collect(event: dict[str, Any]) -> None:
        with lock:
            events.append(event)

    outcomes_only: list[dict[str, Any]] = []
    gw = Gateway(room_root, runner=Script(alice=["hello"]))
    gw.subscribe(collect)  # the rooms' issue: room events also reach subscribe callbacks
    gw.subscribe(outcomes_only.append, rooms=False)
    gateways.append(gw)
    gw.start()
    room = gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "hi")
    gw.wait_room_idle("plan", timeout=10)
    dm = gw.message_agent(sender="alice", target="bob", message="ping")
    gw.wait_outcome(dm["delivery_id"], timeout=10)
    gw.stop()  # flushes the subscribers
    kinds = defaultdict(list)
    for event in events:
        kinds[event["kind"]].append(event)
    assert [e["delivery_id"] for e in kinds["dm"]] == [dm["delivery_id"]]
    assert [o["delivery_id"] for o in outcomes_only] == [dm["delivery_id"]]  # no room event with rooms=False
    room_events = kinds["room"]
    assert {e["room_id"] for e in room_events} == {room["room_id"]} and {e["room"] for e in room_events} == {"plan"}
    assert [e["message"]["text"] for e in room_events if e["event"] == "message"] == ["hi", "hello"]
    assert [e["state"] for e in room_events if e["event"] == "state"] == ["busy", "idle"]


# ── restart ─────────────────────────────────────────────────────────────────


def test_rooms_survive_a_restart(room_root: Path) -> None:
    with Gateway(room_root, runner=Script(alice=["first"])) as gw:
        room = gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "hi")
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        before = gw.room_transcript("plan")
    files = sorted((room_root / "bot_relay" / "rooms").glob("*.json"))
    assert [f.name for f in files] == [f"{room['room_id']}.json"]
    assert files[0].stat().st_mode & 0o777 == 0o600
    runner = RecordingRunner(Script(bob=["second"]))
    with Gateway(room_root, runner=runner) as gw:
        assert gw.list_rooms() == [{**room, "state": "idle", "messages": len(before),
                                    "last_activity": before[-1]["at"]}]
        assert gw.room_transcript("plan") == before
        gw.room_send("plan", "user", "again")
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        assert said(gw.room_transcript("plan"))[-2:] == [("user", "again", 0), ("bob", "second", 1)]
        # alice read everything up to her last turn before the restart: her news is only the new messages
        alice = [t for t in runner.entered if t.profile == "alice"]
        assert alice[0].content.splitlines()[1:-1] == ["user: again"]


def test_a_start_leaves_the_file_of_a_room_nobody_touched_as_it_is(room_root: Path) -> None:
    """Regression (docs review): every gateway start rewrote every room's file, idle ones too (its RoomActor wrote
    the record it had just loaded), so a host-less `room create` changed every room's modification time, and on a
    full disk each start logged "could not write its file" for rooms nobody touched. A room's file is written only
    when the room changed."""
    with Gateway(room_root, runner=Script(alice=["first"])) as gw:
        idle = gw.create_room("idle", ["alice", "bob"])
        gw.create_room("other", ["alice", "bob"])
        gw.room_send("idle", "user", "hi")
        assert gw.wait_room_idle("idle", timeout=10) == "idle"
    path = room_root / "bot_relay" / "rooms" / f"{idle['room_id']}.json"

    def on_disk() -> tuple[bytes, int, int]:
        stat = path.stat()
        return path.read_bytes(), stat.st_mtime_ns, stat.st_ino

    before = on_disk()
    with Gateway(room_root, runner=Script(bob=["second"])) as gw:
        assert [r["state"] for r in gw.list_rooms()] == ["idle", "idle"]  # both RoomActors have started
        gw.room_send("other", "user", "hi @bob")  # a room that changes is written as before
        assert gw.wait_room_idle("other", timeout=10) == "idle"
        assert [e["text"] for e in gw.room_transcript("other")] == ["hi @bob", "second"]
        assert on_disk() == before
    assert on_disk() == before


def test_room_reads_before_start_and_after_stop_answer_from_the_room_files(room_root: Path) -> None:
    """Regression (chaos review): ``room_transcript`` and ``list_rooms`` raised ``RuntimeError("gateway is not
    running")`` before ``start()`` and after ``stop()``, though the room files hold the answer (``room show`` and
    ``room list`` read them without a host, as ``wait_outcome`` answers from the journal). The calls that act or
    wait still refuse."""
    gw = Gateway(room_root, runner=Script(alice=["first"]))
    assert gw.list_rooms() == []  # no room was ever made on this root
    with pytest.raises(KeyError, match="no room 'plan'"):
        gw.room_transcript("plan")
    with gw:
        room = gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "hi")
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        rows, transcript = gw.list_rooms(), gw.room_transcript("plan")
    assert said(transcript) == [("user", "hi", 0), ("alice", "first", 1)]
    assert gw.list_rooms() == rows
    assert gw.room_transcript("PLAN") == gw.room_transcript(room["room_id"]) == transcript
    with pytest.raises(KeyError, match="no room 'other'"):
        gw.room_transcript("other")
    fresh = Gateway(room_root, runner=Script())  # another gateway object on the root, never started
    assert (fresh.list_rooms(), fresh.room_transcript("plan")) == (rows, transcript)
    for act in (lambda: gw.room_send("plan", "user", "again"), lambda: gw.create_room("q", ["alice", "bob"]),
                lambda: gw.wait_room_idle("plan", timeout=1), lambda: gw.disband_room("plan")):
        with pytest.raises(RuntimeError, match="gateway is not running"):
            act()
    assert fresh.room_transcript("plan") == transcript, "nothing was posted, created or disbanded"


def test_one_gateway_at_a_time_drives_a_roots_rooms(room_root: Path, gateways: list[Gateway]) -> None:
    """Regression (soak): a gateway that found the rooms owner lock held at its start refused every room call for
    its whole life, long after the lock was let go. Its next room call takes the rooms over now.

    Regression: the refusal said "another gateway process drives the rooms" of a Gateway of this very process;
    it says which one now."""
    first = start_gateway(gateways, room_root, Script())
    first.create_room("plan", ["alice", "bob"])
    second = start_gateway(gateways, room_root, Script())
    held_here = f"rooms are unavailable: another Gateway in this process drives the rooms of {room_root} "
    with pytest.raises(RuntimeError) as refused:
        second.list_rooms()
    assert str(refused.value).startswith(held_here), refused.value
    assert first.room_send("plan", "user", "hi")["status"] == "queued"
    first.stop()
    assert [r["name"] for r in second.list_rooms()] == ["plan"]  # the lock went with the first gateway
    assert second.wait_room_idle("plan", timeout=30) == "idle"
    third = start_gateway(gateways, room_root, Script())
    with pytest.raises(RuntimeError) as refused:
        third.list_rooms()
    assert str(refused.value).startswith(held_here), refused.value


def _pending_room(root: Path) -> dict[str, Any]:
    """A room ``plan`` of alice and bob whose file holds an acked send to @bob whose round has not started (as a
    gateway that stopped right after the ack leaves it)."""
    with Gateway(root, runner=Script()) as gw:
        room = gw.create_room("plan", ["alice", "bob"])
    path = root / "bot_relay" / "rooms" / f"{room['room_id']}.json"
    record = json.loads(path.read_text())
    entry = {"message_id": "a" * 32, "author": "user", "text": "@bob are you there?", "at": 1.0, "round": 0,
             "status": "said"}
    record |= {"transcript": [entry], "sends": [{"message_id": "a" * 32, "sender": "user", "mentioned": ["bob"]}],
               "state": "busy"}
    path.write_text(json.dumps(record))
    return room


def test_rooms_held_elsewhere_at_the_start_are_taken_over_at_a_tick_once_let_go(room_root: Path,
                                                                                 gateways: list[Gateway]) -> None:
    """Regression (soak): a host-less command held ``rooms/.owner.lock`` while the host started; long after it
    exited, the host's status kept `rooms are unavailable: another gateway process drives the rooms of …` and
    its rooms never ran. Now, with no room call at all, the host's next rescan tick takes the rooms over: the
    pending round resumes, an INFO line says so, and the status problem is gone."""
    _pending_room(room_root)
    holder = RoomFiles(room_root).owner_lock()  # another process's lock: a flock held through another open file
    assert holder.try_acquire()
    runner = RecordingRunner(lambda turn: "here" if turn.profile == "bob" else "[SILENT]")
    with LogCapture("INFO") as logs:
        try:
            gw = start_gateway(gateways, room_root, runner, {"bot_mode": {"rescan_seconds": 0.05}})
            unavailable = f"rooms are unavailable: another gateway process drives the rooms of {room_root}"
            assert unavailable in live_status(gw)["problems"]
        finally:
            holder.release()
            holder.close()
        turns = runner.wait_entered(1, timeout=30)  # the round resumed: no room call asked for it
        await_condition(lambda: logs.matching(f"rooms of {room_root} are now driven here", "1 room(s)"),
                        timeout=30, message="the take-over's INFO line")
    assert logs.matching(f"rooms are unavailable here for now: another gateway process drives the rooms of "
                         f"{room_root}; this gateway takes them over once it can")
    # the first turn of the resumed round is bob's (the round may have gone on to alice's silent one by now)
    assert [(t.profile, t.session) for t in turns][:1] == [("bob", "Group: plan")]
    assert gw.wait_room_idle("plan", timeout=30) == "idle"
    assert said(gw.room_transcript("plan")) == [("user", "@bob are you there?", 0), ("bob", "here", 1)]
    assert not any("rooms are unavailable" in p for p in live_status(gw)["problems"])


def test_a_gateway_stopping_while_its_rooms_are_held_elsewhere_takes_nothing_and_leaves_no_takeover(
        room_root: Path, gateways: list[Gateway]) -> None:
    """The take-over ends with the gateway: its RoomsTakeover stops with it, and it never takes the lock on its
    way out, so the next gateway drives the rooms once the holder lets go."""
    def takeovers() -> set[Any]:  # of this test's gateways (another test's may still be stopping)
        return set(pykka.ActorRegistry.get_by_class(RoomsTakeover)) - before

    _pending_room(room_root)
    before = set(pykka.ActorRegistry.get_by_class(RoomsTakeover))
    holder = RoomFiles(room_root).owner_lock()
    assert holder.try_acquire()
    try:
        gw = start_gateway(gateways, room_root, Script(), {"bot_mode": {"rescan_seconds": 0.05}})
        assert len(takeovers()) == 1
        gw.stop()
        assert takeovers() == set()
    finally:
        holder.release()
        holder.close()
    runner = RecordingRunner(lambda turn: "[SILENT]")
    nxt = start_gateway(gateways, room_root, runner)
    assert nxt.wait_room_idle("plan", timeout=30) == "idle"
    assert [(t.profile, t.session) for t in room_turns(runner)] == [("bob", "Group: plan")]
    assert takeovers() == set()


def test_a_gateway_that_drives_no_rooms_leaves_their_lock_and_reads_their_files(room_root: Path,
                                                                                gateways: list[Gateway]) -> None:
    """``drive_rooms=False`` (a host-less ``hermes-actors send``'s gateway): no rooms owner lock, no round
    resumed; the room reads answer from the files, the calls that act refuse naming why."""
    room = _pending_room(room_root)
    runner = RecordingRunner()
    gw = start_gateway(gateways, room_root, runner, drive_rooms=False)
    holder = RoomFiles(room_root).owner_lock()
    try:
        assert holder.try_acquire(), "a gateway that drives no rooms holds their lock"
    finally:
        holder.release()
        holder.close()
    assert [(r["room_id"], r["state"]) for r in gw.list_rooms()] == [(room["room_id"], "busy")]
    assert said(gw.room_transcript("plan")) == [("user", "@bob are you there?", 0)]
    for act in (lambda: gw.room_send("plan", "user", "again"), lambda: gw.create_room("q", ["alice", "bob"]),
                lambda: gw.wait_room_idle("plan", timeout=1), lambda: gw.disband_room("plan")):
        with pytest.raises(RuntimeError, match="rooms are unavailable: this gateway drives no rooms"):
            act()
    assert send_and_settle(gw) == "replied"
    assert runner.entered and not room_turns(runner), "a member turn ran on a gateway that drives no rooms"


# ── graceful stop ───────────────────────────────────────────────────────────


def test_a_member_turn_queued_at_stop_runs_at_the_next_start(room_root: Path) -> None:
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if turn.session == "Bot Chat":
            entered.set()
            release.wait(10)
            return "dm done"
        return "bob here" if turn.profile == "bob" else "[SILENT]"

    first = RecordingRunner(behave)
    gw = Gateway(room_root, runner=first)
    gw.start()
    try:
        gw.create_room("plan", ["alice", "bob"])
        gw.message_agent(sender="alice", target="bob", message="long job")
        assert entered.wait(10)
        gw.room_send("plan", "user", "@bob status?")  # bob's room turn queues behind the DM
    finally:
        # on_wait runs once the queues were wound down: only then may the DM finish (within the grace)
        gw.stop(timeout=10, on_wait=lambda running, grace: release.set())
        release.set()
    assert [t.session for t in first.entered] == ["Bot Chat"]  # the queued room turn was cancelled, not run

    second = RecordingRunner(behave)
    with Gateway(room_root, runner=second) as gw:
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        entries = gw.room_transcript("plan")
    assert [(e["author"], e["status"]) for e in entries] == [("user", "said"), ("bob", "said")]
    assert [t.profile for t in room_turns(second)] == ["bob", "alice"]  # run once each, after the restart


def test_a_member_turn_running_past_the_stop_grace_is_interrupted_and_not_run_again(room_root: Path) -> None:
    release, entered = threading.Event(), threading.Event()

    def hang(turn: Turn) -> str:
        entered.set()
        release.wait(10)
        return "too late"

    gw = Gateway(room_root, runner=hang)
    gw.start()
    try:
        gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "@bob status?")
        assert entered.wait(10)
    finally:
        gw.stop(timeout=0.2)  # bob's turn is still running: it ends ambiguous
        release.set()
    second = RecordingRunner(Script())
    with Gateway(room_root, runner=second) as gw:
        assert gw.wait_room_idle("plan", timeout=10) == "idle"
        entries = gw.room_transcript("plan")
    assert [(e["author"], e["status"], e["round"]) for e in entries] == [
        ("user", "said", 0), ("bob", "interrupted", 1)]
    assert room_turns(second) == []


def test_a_member_turn_its_profile_actor_crashed_settling_is_interrupted_with_that_why_not_a_stop(
    room_root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression (review): every ambiguous member turn was posted "(interrupted: the gateway stopped during this turn;
    # it was not run again)", though here the gateway runs on (bob's ProfileActor crashed settling the reply).
    crash_on_reply(monkeypatch)
    runner = RecordingRunner(Script(bob=[CRASHING_REPLY]))
    gw = start_gateway(gateways, room_root, runner)
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "@bob status?")
    assert gw.wait_room_idle("plan", timeout=20) == "idle"
    entries = gw.room_transcript("plan")
    assert [(e["author"], e["status"], e["text"]) for e in entries] == [
        ("user", "said", "@bob status?"),
        ("bob", "interrupted",
         "(interrupted: The target's ProfileActor crashed during the turn. It may have run; it was not run again.)")]
    assert [t.profile for t in room_turns(runner)] == ["bob"]  # not run again; the silent round settled the send
    assert send_and_settle(gw) == "silent"  # the gateway runs on, and bob's restarted ProfileActor with it


def test_stop_returns_once_a_running_member_turn_finishes(room_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: the Dispatcher never answered the stop's AwaitOutcome for a room turn, so a stop
    # with a member turn running always waited out its whole grace.
    # Asserted as what ended the stop's wait, not as how long it took (a loaded machine stretches that): the
    # wait for running turns reports whether every one finished before the grace ran out.
    finished_in_time: list[bool] = []
    real_await = facade_shutdown.await_running_turns

    def watched_await(*args: Any, **kwargs: Any) -> bool:
        finished = real_await(*args, **kwargs)
        finished_in_time.append(finished)
        return finished

    monkeypatch.setattr(facade_shutdown, "await_running_turns", watched_await)
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        release.wait(10)
        return "done"

    gw = Gateway(room_root, runner=behave)
    gw.start()
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "@bob go")
    assert entered.wait(10)
    gw.stop(timeout=60, on_wait=lambda running, grace: release.set())
    assert finished_in_time == [True], "stop waited out the grace of a turn that had finished"
    with Gateway(room_root, runner=behave) as again:
        assert again.wait_room_idle("plan", timeout=10) == "idle"
        assert [(e["author"], e["status"]) for e in again.room_transcript("plan")][:2] == [
            ("user", "said"), ("bob", "said")]


@pytest.mark.parametrize(("timeout", "error"), [(None, TypeError), ("5", TypeError), (float("nan"), ValueError)])
def test_wait_room_idle_names_a_bad_timeout(room_root: Path, gateways: list[Gateway], timeout: Any,
                                            error: type[Exception]) -> None:
    """Regression: NaN and None waited forever on a busy room, inf overflowed the clock."""
    release = threading.Event()
    gw = start_gateway(gateways, room_root, RecordingRunner(lambda turn: "ok" if release.wait(30) else "late"))
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "hello")
    try:
        with pytest.raises(error, match="wait_room_idle timeout"):
            gw.wait_room_idle("plan", timeout=timeout)
    finally:
        release.set()
    assert gw.wait_room_idle("plan", timeout=float("inf")) in ("idle", "needs_you")


def test_a_wait_room_idle_blocked_when_the_gateway_stops_is_told_so(room_root: Path, gateways: list[Gateway]) -> None:
    """Regression: the waiter sat out its whole timeout on a room nobody would advance any more."""
    release = threading.Event()
    rec = RecordingRunner(lambda turn: "ok" if release.wait(30) else "late")
    gw = start_gateway(gateways, room_root, rec)
    gw.create_room("plan", ["alice", "bob"])
    gw.room_send("plan", "user", "hello")
    rec.wait_entered(1)
    answers: list[BaseException | str] = []

    def wait() -> None:
        try:
            answers.append(gw.wait_room_idle("plan", timeout=3600))
        except BaseException as exc:
            answers.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        gw.stop(timeout=0.2)
    finally:
        release.set()
    waiter.join(60)
    assert not waiter.is_alive(), "the waiter still waits for a room the stopped gateway will never advance"
    (answer,) = answers
    # told the gateway stopped (or, had the waiter only asked after the stop, that it is not running)
    assert isinstance(answer, RuntimeError) and ("stopped" in str(answer) or "not running" in str(answer)), answer


def test_a_running_member_turn_is_no_pending_dm(room_root: Path, gateways: list[Gateway]) -> None:
    """Regression (docs review): ``status`` showed ``accepted 0 … pending 1`` (and ``hermes_actors_pending`` 1) while a
    room member's turn ran: ``pending`` counted room turns, which ``accepted`` and ``settled`` never count. It counts
    DMs only now, as the docs say; a DM queued behind the member turn is counted."""
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if turn.session.startswith("Group: "):
            entered.set()
            assert release.wait(30)
        return "[SILENT]"

    gw = start_gateway(gateways, room_root, RecordingRunner(behave))
    try:
        gw.create_room("plan", ["alice", "bob"])
        gw.room_send("plan", "user", "@bob status?")
        assert entered.wait(30)
        stats = gw.stats()
        assert (stats["accepted"], stats["pending"]) == (0, 0), stats
        ack = gw.message_agent(sender="alice", target="bob", message="hi")  # queued behind bob's member turn
        stats = gw.stats()
        assert (stats["accepted"], stats["pending"]) == (1, 1), stats
        counters = live_status(gw)["counters"]
        assert (counters["accepted"], counters["pending"]) == (1, 1), counters
    finally:
        release.set()
    assert gw.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "silent"
    assert gw.wait_room_idle("plan", timeout=30) == "idle"
