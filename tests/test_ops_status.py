"""``live_status`` (a running gateway) and ``file_status`` (the files) — the ``status`` view."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import LogCapture, RecordingRunner, held_on, make_root, send_dm, start_gateway

from hermes_actors import Gateway
from hermes_actors.cli.render import status_text
from hermes_actors.core import outcomes
from hermes_actors.local import delivery_stats
from hermes_actors.messages import Delivery
from hermes_actors.ops.delivery_log import delivery_line
from hermes_actors.ops.journal_view import find_outcome
from hermes_actors.ops.status import (
    STATUS_KEYS,
    busy_in_hermes,
    file_status,
    in_flight_rows,
    live_status,
    outcome_counters,
    profile_rows,
    room_rows,
)
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_roster import normalize_roster_row


def test_outcome_counters_sum_by_status_and_reason() -> None:
    got = outcome_counters({"failed": {"target_busy": 2, "unknown": 1}, "replied": {"": 3}})
    assert got["by_status"] == {"failed": 3, "replied": 3}
    assert got["by_reason"] == {"target_busy": 2, "unknown": 1}


def test_profile_rows_states() -> None:
    profiles = [{"profile": "bob", "handle": "bob", "title": "", "managed": True},
                {"profile": "carol", "handle": "carol", "title": "", "managed": True}]
    live = profile_rows(profiles, {"bob": 3}, {"carol"}, live=True)
    assert [(r["state"], r["queued"], r["live_owner"]) for r in live] == [("running", 2, False), ("idle", 0, True)]
    offline = profile_rows(profiles, {"bob": 3}, set(), live=False)
    assert [(r["state"], r["queued"]) for r in offline] == [("offline", 3), ("offline", 0)]
    # hermes still runs a turn of carol given up on: busy, every DM in flight to it waiting (and refused)
    busy = profile_rows(profiles, {"bob": 3, "carol": 2}, set(), live=True, busy=frozenset({"carol"}))
    assert [(r["state"], r["queued"], r["in_flight"]) for r in busy] == [("running", 2, 3), ("busy", 2, 2)]
    assert [r["state"] for r in profile_rows(profiles, {}, set(), live=False, busy=frozenset({"bob"}))] == [
        "offline", "offline"]


@pytest.mark.parametrize(("before", "after", "in_flight", "busy"), [
    ({}, {}, set(), set()),
    ({"bob": "d1"}, {"bob": "d1"}, set(), {"bob"}),  # a timed-out warm turn: its DM settled, hermes runs it on
    ({"bob": "d1"}, {"bob": "d1"}, {"d1"}, set()),  # the DM's own turn: bob is running, not busy
    ({"bob": "d1"}, {}, set(), set()),  # it ended during the stats: not running any more
    ({}, {"bob": "d2"}, set(), set()),  # began during the stats: a DM in flight the stats may not show yet
    ({"bob": "d1"}, {"bob": "d2"}, set(), set()),  # another turn since: the stats cannot tell which
    ({"bob": ""}, {"bob": ""}, {"d9"}, {"bob"}),  # a turn lost in a stopping gateway that still lives
], ids=["none", "timed-out", "its-own-dm", "ended", "began", "replaced", "lost"])
def test_busy_in_hermes(before: dict[str, str], after: dict[str, str], in_flight: set[str], busy: set[str]) -> None:
    assert busy_in_hermes(before, after, in_flight) == busy


def test_room_rows_add_idle_seconds_and_sort_by_name() -> None:
    rows = room_rows([
        {"room_id": "b" * 32, "name": "Zeta", "members": ["alice", "bob"], "state": "busy", "messages": 3,
         "last_activity": 90.0},
        {"room_id": "a" * 32, "name": "alpha", "members": ["bob", "carol"], "state": "idle", "messages": 0,
         "last_activity": 100.5},
    ], now=100.0)
    assert [r["name"] for r in rows] == ["alpha", "Zeta"]
    assert rows[0]["idle_seconds"] == 0.0 and rows[1]["idle_seconds"] == 10.0  # never negative (clock skew)
    assert rows[1] == {"name": "Zeta", "room_id": "b" * 32, "members": ["alice", "bob"], "state": "busy",
                       "messages": 3, "last_activity": 90.0, "idle_seconds": 10.0}


def test_live_status_shows_rooms_only_when_there_are_some(root: Path, gateways: list[Gateway]) -> None:
    release = threading.Event()

    def behave(turn: Any) -> str:
        if turn.session.startswith("Group: "):
            assert release.wait(10), "the test never released the member turn"
            return "On it." if turn.profile == "alice" else "[SILENT]"
        return "done"

    gw = start_gateway(gateways, root, RecordingRunner(behave))
    assert "rooms" not in live_status(gw)
    room = gw.create_room("plan", ["alice", "bob"])
    try:
        assert gw.room_send("plan", "user", "Plan Friday")["status"] == "queued"
        [busy] = live_status(gw)["rooms"]
        assert (busy["name"], busy["room_id"], busy["members"]) == ("plan", room["room_id"], ["alice", "bob"])
        assert (busy["state"], busy["messages"]) == ("busy", 1)
        assert busy["idle_seconds"] >= 0
        [turn] = [r for r in live_status(gw)["in_flight"] if not r["sender"]]  # the member turn (no sender)
        assert f"  {turn['delivery_id']} @alice in room 'plan' (" in status_text(live_status(gw))
    finally:
        release.set()
    assert gw.wait_room_idle("plan", timeout=30) == "idle"
    status = live_status(gw)
    [idle] = status["rooms"]
    assert (idle["state"], idle["messages"]) == ("idle", 2)
    assert idle["last_activity"] == gw.room_transcript("plan")[-1]["at"]
    text = status_text(status)
    assert "rooms: 1" in text and f"  plan ({room['room_id']}) idle, 2 messages, last " in text
    assert text.endswith("; @alice, @bob")
    gw.disband_room("plan")
    assert "rooms" not in live_status(gw)


def test_in_flight_rows_age_oldest_first() -> None:
    rows = in_flight_rows([{"delivery_id": "a", "accepted_at": 95.0}, {"delivery_id": "b", "accepted_at": 80.0},
                           {"delivery_id": "c", "accepted_at": None}], now=100.0)
    assert [(r["delivery_id"], r["age_seconds"]) for r in rows] == [("b", 20.0), ("a", 5.0), ("c", None)]
    assert all("accepted_at" not in r for r in rows)


def test_delivery_line_never_has_text() -> None:
    line = delivery_line("ab" * 16, "alice", "@bob", "failed", "target_busy", 1.234)
    assert line == f"delivery {'ab' * 16} alice → @bob: failed [target_busy] in 1.23 s"
    assert delivery_line("x", "alice", "@bob", "replied") == "delivery x alice → @bob: replied"


def test_live_status_shows_running_queued_and_counters(root: Path, gateways: list[Gateway]) -> None:
    release = threading.Event()
    runner = RecordingRunner(lambda turn: release.wait(10) and "done")
    gw = start_gateway(gateways, root, runner)
    try:
        first = send_dm(gw, "one")
        second = send_dm(gw, "two")
        runner.wait_entered(1)
        status = live_status(gw)
        assert set(STATUS_KEYS) <= set(status)
        assert status["running"] is True and status["source"] == "gateway"
        assert status["gateway"]["pid"] == os.getpid() and status["gateway"]["uptime_seconds"] >= 0
        bob = next(p for p in status["profiles"] if p["profile"] == "bob")
        assert (bob["state"], bob["queued"], bob["live_owner"]) == ("running", 1, False)
        alice = next(p for p in status["profiles"] if p["profile"] == "alice")
        assert alice["state"] == "idle"
        assert {r["delivery_id"] for r in status["in_flight"]} == {first, second}
        assert all(r["sender"] == "alice" and r["age_seconds"] >= 0 for r in status["in_flight"])
        assert status["counters"]["accepted"] == 2 and status["counters"]["pending"] == 2
        assert status["relay"]["outbox"] == 0 and status["relay"]["quarantine"] == 0
        refused = gw.message_agent(sender="alice", target="nobody", message="hi")
        assert "error" in refused
    finally:
        release.set()
    gw.wait_outcome(first, timeout=10)
    gw.wait_outcome(second, timeout=10)
    status = live_status(gw)
    assert status["in_flight"] == []
    assert status["counters"]["refused"] == 1
    assert status["counters"]["by_status"] == {"replied": 2}
    orjson.dumps(status)  # JSON-able as it is


@pytest.mark.parametrize(("sender", "handle", "shown"), [
    ("default", "hermes", "hermes"),  # the root's own profile: its handle, as the outcome and the log line name it
    ("alice", "alice", "alice"),
    ("alice", "", "alice"),  # no handle known: the folder id
    ("", "dave on Mini", "dave on Mini"),  # a wake of a remote DM: who answered, as its DM's target was shown
])
def test_shown_sender_is_the_handle_else_the_folder_id(sender: str, handle: str, shown: str) -> None:
    assert outcomes.shown_sender(sender, handle) == shown


def test_in_flight_rows_name_the_roots_own_bot_by_its_handle(root: Path, gateways: list[Gateway]) -> None:
    """Review (opsfix): a DM from the root's own profile was listed in flight as sent by ``default`` (status,
    ``/status``, the live page) while its outcome, the log line and the roster named it ``@hermes``."""
    release = threading.Event()
    runner = RecordingRunner(lambda turn: release.wait(30) and "done")
    gw = start_gateway(gateways, root, runner)
    try:
        key = send_dm(gw, "hi", sender="hermes")
        runner.wait_entered(1)
        live, files = live_status(gw), file_status(root)
        for status in (live, files):
            assert [(r["delivery_id"], r["sender"]) for r in status["in_flight"]] == [(key, "hermes")], status
        assert f"{key} @hermes → @bob (local, " in status_text(live)
    finally:
        release.set()
    assert gw.wait_outcome(key, timeout=10)["status"] == "replied"


def test_serve_logs_one_info_line_per_delivery_without_text(root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, root)
    with LogCapture("INFO") as logs:
        key = send_dm(gw, "the secret text")
        gw.wait_outcome(key, timeout=10)
        gw.stats()  # the outcome was published (and logged) before stats answers
    lines = logs.matching(f"delivery {key}")
    assert len(lines) == 1, logs.lines
    assert "@alice → @bob: replied in " in lines[0]
    assert not any("secret" in line for line in logs.lines)


def test_the_delivery_line_makes_no_logger_per_dm(monkeypatch: pytest.MonkeyPatch) -> None:
    # On every DM's path (the Dispatcher's thread): logger.opt() builds a new Logger each call; the lazy one
    # is built once, so the line is logged with the module's logger out of reach.
    monkeypatch.setattr(delivery_stats, "logger", None)
    delivery = Delivery("ab" * 16, "alice", "alice", "bob", "bob", "hi", accepted_at=1.0, label="@bob")
    with LogCapture("INFO") as logs:
        delivery_stats.log_settled(delivery, outcomes.from_reply(delivery.delivery_id, "@bob", "ok"))
    assert len(logs.matching(f"delivery {delivery.delivery_id}", "@alice → @bob: replied in ")) == 1, logs.lines


def test_file_status_reads_journals_and_relay_dirs(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    release = threading.Event()
    runner = RecordingRunner(lambda turn: "done" if "second" not in turn.content or release.wait(10) else "")
    gw = Gateway(root, runner=runner).start()
    try:
        done = send_dm(gw, "first", target="carol")
        gw.wait_outcome(done, timeout=10)
        waiting = send_dm(gw, "second")
        runner.wait_entered(2)
        status = file_status(root)
    finally:
        release.set()
        gw.stop(timeout=10)
    assert status["running"] is False and status["source"] == "files"
    assert set(STATUS_KEYS) <= set(status)
    assert [r["delivery_id"] for r in status["in_flight"]] == [waiting]
    assert status["in_flight"][0]["started"] is True
    bob = next(p for p in status["profiles"] if p["profile"] == "bob")
    assert (bob["state"], bob["queued"]) == ("offline", 1)
    assert status["counters"]["by_status"] == {"replied": 1}
    assert status["relay"]["outbox"] == 0 and status["managed"] is True
    assert status["profiles"][0]["profile"] == "default"
    orjson.dumps(status)


def test_file_status_refuses_a_symlinked_journal_dir(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "j-x.log").write_text('{"t":"accepted","id":"' + "a" * 32 + '","d":{}}\n')
    (root / "bot_relay").mkdir()
    (root / "bot_relay" / "journal").symlink_to(elsewhere)
    status = file_status(root)
    assert status["in_flight"] == []
    assert any("refusing" in p for p in status["problems"])


def test_file_status_reads_nothing_through_a_symlinked_bot_relay(tmp_path: Path) -> None:
    """Regression (hostile paths): with ``bot_relay/`` a symlink to another root's, the status of the files
    counted that root's relay directories, journal and roster as this root's, and said no problem."""
    other = make_root(tmp_path / "other")
    gw = Gateway(other, runner=RecordingRunner()).start()
    try:
        key = send_dm(gw, "hello")
        gw.wait_outcome(key, timeout=10)
    finally:
        gw.stop(timeout=10)
    relay = other / "bot_relay"
    (relay / "outbox" / f"{1:032x}.json").write_text("{}")
    row = {"profile": "dave", "handle": "dave", "connection_id": "mini", "title": "", "online": True}
    (relay / "roster.json").write_text(orjson.dumps({"updated_at": int(time.time()), "agents": [row]}).decode())
    assert file_status(other)["relay"]["outbox"] == 1 and file_status(other)["relay"]["remote_agents"] == 1
    root = make_root(tmp_path / "mine")
    (root / "bot_relay").symlink_to(relay)
    status = file_status(root)
    assert status["problems"][0].startswith(f"relay directories: {root / 'bot_relay'} is a symlink or not a "
                                            "directory; refusing to use it. The relay cannot start on ")
    assert status["counters"]["by_status"] == {}
    assert status["relay"]["outbox"] is None and status["relay"]["remote_agents"] == 0
    assert "problem: relay directories: " in status_text(status)
    assert find_outcome(other, key)["status"] == "replied"
    assert find_outcome(root, key)["status"] == "unknown"  # `outcome --root mine` read the other root's journal


def test_heartbeats_skip_a_pid_no_process_can_have(tmp_path: Path) -> None:
    """Regression: an over-large pid in a heartbeat file raised OverflowError out of os.kill (status crashed)."""
    import json
    import os
    import time

    from hermes_actors.ops.status import heartbeats
    from hermes_actors.store.relay_inbox import InboxPaths

    root = make_root(tmp_path)
    directory = InboxPaths.from_root(root).heartbeat
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    (directory / "1.json").write_text(json.dumps({"pid": 2**70, "at": now}))
    (directory / f"{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid(), "at": now}))
    assert [row["pid"] for row in heartbeats(root, now)] == [os.getpid()]


def test_relay_counts_include_the_envelopes_on_the_processes_shelves(tmp_path: Path) -> None:
    """Regression: `taken` counted only flat files, so 7 envelopes held on a shelf showed as 'taken 0'."""
    import os

    from hermes_actors.ops.status import relay_dir_counts
    from hermes_actors.store.relay_inbox import InboxPaths

    root = make_root(tmp_path)
    taken = InboxPaths.from_root(root).taken
    shelf = taken / "s-0123456789abcdef0123456789abcdef"
    shelf.mkdir(parents=True, mode=0o700)
    for i in range(3):
        (shelf / f"{i:032x}.json").write_text("{}")
    (shelf / ".lock").write_text("")
    (taken / f"{9:032x}.json").write_text("{}")  # a flat one, as older versions left them
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{7:032x}.json").write_text("{}")
    os.symlink(elsewhere, taken / "s-planted")  # a shelf that is a symlink is not followed
    assert relay_dir_counts(root)["taken"] == 4


def test_file_status_shows_a_relayed_in_dm_as_the_running_gateway_does(root: Path, gateways: list[Gateway]) -> None:
    """A relayed-in DM is journaled from its turn's start (so that a retry of its envelope after a restart is answered
    from the journal): the files show it in flight as ``relay-in``, as the running gateway does, and count its
    outcome no more than the gateway's counters do (it went back to its sender's connection, not to a subscriber)."""
    release = threading.Event()
    runner = RecordingRunner(held_on("held", release))
    gw = start_gateway(gateways, root, runner, connection_id="mini")
    target = normalize_roster_row({"profile": "bob", "handle": "bob", "connection_id": "mini"})
    assert target is not None
    done, held = (rp.make_envelope(target=target, message=m, sender_profile="zed", sender_handle="zed",
                                   now=time.time()) for m in ("done", "held"))
    assert gw.relay_deliver(done, timeout=10)["reply"] == "ok: done"
    call = threading.Thread(target=gw.relay_deliver, args=(held,), kwargs={"timeout": 20})
    call.start()
    try:
        runner.wait_entered(2)
        live, files = live_status(gw), file_status(root)
    finally:
        release.set()
        call.join(timeout=30)
    for status in (live, files):
        assert [(r["delivery_id"], r["route"]) for r in status["in_flight"]] == [(held["id"], "relay-in")], status
    assert files["counters"]["by_status"] == live["counters"]["by_status"] == {}


@pytest.mark.parametrize(("pending", "per_profile", "to_peers"), [
    ([], {}, 0),
    ([("bob", "local"), ("bob", "local"), ("carol", "relay-in")], {"bob": 2, "carol": 1}, 0),
    ([("", "peer"), ("bob", "local")], {"bob": 1}, 1),  # a peer DM: no profile of this root runs it
    ([("", "relay"), ("alice", "wake")], {"alice": 1}, 0),  # a DM to another connection is no peer's either
])
def test_in_flight_counts_keep_peer_dms_apart(pending: list[tuple[str, str]], per_profile: dict[str, int],
                                              to_peers: int) -> None:
    from hermes_actors.local.delivery_stats import in_flight_counts

    assert in_flight_counts(pending) == (per_profile, to_peers)


@pytest.mark.parametrize(("count", "line"), [
    (None, "peers: mini"), (0, "peers: mini"), (1, "peers: mini; in flight to peers: 1"),
    (3, "peers: mini; in flight to peers: 3"),
])
def test_the_peers_line_says_the_dms_in_flight_to_them(count: int | None, line: str) -> None:
    status = {"root": "/r", "relay": {"peers": ["mini"], "peers_in_flight": count}}
    assert line in status_text(status).splitlines()


class _HeldPeerTransport:
    """A ``bot_peers`` transport whose delivery is under way until the test releases it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def deliver(self, delivery: Delivery, route: Any) -> Any:
        self.started.set()
        self.release.wait(30)
        return outcomes.from_reply(delivery.delivery_id, route.label, "late")


def test_a_peer_dm_in_flight_is_counted_apart_never_under_a_profile(tmp_path: Path) -> None:
    """Regression (cliedges): ``status`` from the files counted a pending ``bot_peers`` DM (journaled with origin
    ``peer``, no local target) under the profile "", and neither source said how many DMs the peers had: they are
    ``relay.peers_in_flight`` now, on the ``peers:`` line, and no profile row counts them."""
    root = make_root(tmp_path, config={"bot_peers": {"mini": {}}})
    transport = _HeldPeerTransport()
    try:
        with Gateway(root, runner=RecordingRunner(), peer_transport=transport) as gw:
            key = send_dm(gw, "to the peer", target="mini/bob")
            assert transport.started.wait(30)
            live, files = live_status(gw), file_status(root)
            transport.release.set()
    finally:
        transport.release.set()
    for status in (live, files):
        assert [(r["delivery_id"], r["route"], r["profile"]) for r in status["in_flight"]] == [(key, "peer", "")]
        assert status["relay"]["peers_in_flight"] == 1, status["source"]
        assert all(p["in_flight"] == 0 and p["queued"] == 0 for p in status["profiles"]), status["profiles"]
        assert "peers: mini; in flight to peers: 1" in status_text(status).splitlines()
