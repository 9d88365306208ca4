"""Waking the sender through the Gateway: a callable runner with ``bot_mode.wake_sender: true``.

Each DM's outcome becomes a new turn in the sender's "Bot Chat" whose content
is exactly the outcome text, queued behind the sender's other turns; the hop
rides along; the wake's own outcome is nobody's DM outcome.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import hub_thread, remote_row, seed_envelope, seed_write_json, write_roster_file
from roots import LogCapture, RecordingRunner, body_of, held_on, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.core.wake import wake_id, wake_retry_id
from hermes_actors.errors import TurnFailed
from hermes_actors.messages import BOT_CHAT_SESSION, Turn
from hermes_actors.ops.status import live_status
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.turnlock import turn_lock_path

WAKE_ON = {"bot_mode": {"wake_sender": True}}


def is_wake_turn(turn: Turn) -> bool:
    return turn.content.startswith(("Reply from ", "Delivery to "))


def queued(ack: dict[str, Any]) -> str:
    assert ack.get("status") == "queued", ack
    return str(ack["delivery_id"])


def assert_woken_or_not(gw: Gateway, dm: str, woken: bool) -> None:
    """The wake of ``dm`` ran and settled (``woken``), or no wake of it exists at all."""
    if woken:
        assert gw.wait_outcome(wake_id(dm), timeout=10)["status"] == "replied"
    else:
        with pytest.raises(KeyError):
            gw.wait_outcome(wake_id(dm), timeout=1)


def test_the_outcome_wakes_the_sender_in_its_bot_chat_with_exactly_the_outcome_text(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    rec = RecordingRunner(
        lambda turn: "noted" if is_wake_turn(turn) else f"{turn.profile} got: {body_of(turn.content)}"
    )
    gw = start_gateway(gateways, make_root(tmp_path), rec, config=WAKE_ON)
    seen: list[dict[str, Any]] = []
    gw.subscribe(seen.append)

    dm = queued(gw.message_agent(sender="alice", target="bob", message="status?"))
    outcome = gw.wait_outcome(dm, timeout=10)
    assert outcome["text"] == "Reply from @bob: bob got: status?"
    wake = gw.wait_outcome(wake_id(dm), timeout=10)  # the wake turn settled
    assert wake["status"] == "replied" and wake["reply"] == "noted"

    (turn,) = [t for t in rec.entered if t.profile == "alice"]
    assert turn.content == outcome["text"]  # no wrapper, no "Message from" prefix
    assert turn.session == BOT_CHAT_SESSION and turn.delivery_id == wake_id(dm)
    assert turn.hop == 1  # the DM's hop: a DM sent from this turn is hop 2

    marker = queued(gw.message_agent(sender="carol", target="bob", message="marker"))
    gw.wait_outcome(marker, timeout=10)
    gw.wait_outcome(wake_id(marker), timeout=10)
    await_condition(lambda: len(seen) >= 2, timeout=10, message="the subscriber saw both DM outcomes")
    assert [o["delivery_id"] for o in seen] == [dm, marker]  # wake outcomes are not DM outcomes
    stats = gw.stats()
    assert (stats["wakes_sent"], stats["wakes_failed"], stats["settled"]) == (2, 0, 2)


def test_the_wake_queues_behind_the_senders_turns_one_turn_at_a_time(tmp_path: Path, gateways: list[Gateway]) -> None:
    gate = threading.Event()
    lock = threading.Lock()
    active: dict[str, int] = {}
    overlap: list[str] = []

    def behave(turn: Turn) -> str:
        with lock:
            active[turn.profile] = active.get(turn.profile, 0) + 1
            if active[turn.profile] > 1:
                overlap.append(turn.profile)
        try:
            if turn.profile == "alice" and body_of(turn.content) == "first":
                assert gate.wait(30), "the test never opened the gate"
            return "ok"
        finally:
            with lock:
                active[turn.profile] -= 1

    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), rec, config=WAKE_ON)
    first = queued(gw.message_agent(sender="carol", target="alice", message="first"))
    rec.wait_entered(1, timeout=10)  # alice is busy with "first"
    second = queued(gw.message_agent(sender="carol", target="alice", message="second"))
    dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    assert gw.stats()["wakes_sent"] == 1  # alice's wake is queued now, behind "second"
    gate.set()
    for key in (first, second, wake_id(dm)):
        assert gw.wait_outcome(key, timeout=20)["status"] == "replied"

    alice = [t for t in rec.entered if t.profile == "alice"]
    assert [t.delivery_id for t in alice] == [first, second, wake_id(dm)]
    assert alice[2].content == "Reply from @bob: ok"
    assert overlap == []


@pytest.mark.parametrize(
    "config", [{"bot_mode": {"wake_sender": False}}, {"bot_mode": {"wake_sender": "auto"}}, None],
    ids=["off", "auto-with-a-callable", "default"],
)
def test_no_wake_when_the_switch_is_off_or_auto_with_a_custom_runner(
    tmp_path: Path, gateways: list[Gateway], config: dict[str, Any] | None
) -> None:
    rec = RecordingRunner()
    gw = start_gateway(gateways, make_root(tmp_path), rec, config=config)
    dm = queued(gw.message_agent(sender="alice", target="bob", message="hi"))
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    assert gw.stats()["wakes_sent"] == 0  # decided when the outcome was published, before wait_outcome answered
    with pytest.raises(KeyError):
        gw.wait_outcome(wake_id(dm), timeout=1)
    assert [t.profile for t in rec.entered] == ["bob"]


def test_a_dm_sent_from_the_wake_turn_is_one_hop_deeper(tmp_path: Path, gateways: list[Gateway]) -> None:
    acks: list[dict[str, Any]] = []

    def behave(turn: Turn) -> str:
        if turn.profile == "alice" and is_wake_turn(turn) and not acks:
            acks.append(turn.message_agent("bob", "follow-up"))
        return "ok"

    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), rec, config=WAKE_ON)
    dm = queued(gw.message_agent(sender="alice", target="bob", message="start"))
    gw.wait_outcome(dm, timeout=10)  # published: its wake exists from now on
    gw.wait_outcome(wake_id(dm), timeout=10)
    follow_up = queued(acks[0])
    gw.wait_outcome(follow_up, timeout=10)
    bob = {body_of(t.content): t.hop for t in rec.entered if t.profile == "bob"}
    assert bob == {"start": 1, "follow-up": 2}


def test_the_hop_limit_refuses_a_deep_chain_of_replies_to_replies(tmp_path: Path, gateways: list[Gateway]) -> None:
    refusals: list[dict[str, Any]] = []
    done = threading.Event()

    def behave(turn: Turn) -> str:
        if turn.profile == "alice" and is_wake_turn(turn):  # every wake answers bob again
            ack = turn.message_agent("bob", f"again after hop {turn.hop}")
            if "error" in ack:
                refusals.append(ack)
                done.set()
        return "ok"

    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), rec, config={"bot_mode": {"wake_sender": True, "max_hops": 3}})
    queued(gw.message_agent(sender="alice", target="bob", message="start"))
    assert done.wait(30), "the chain was never refused"
    assert refusals[0]["reason"] == "loop_guard" and "hop 4" in refusals[0]["error"]
    assert sorted(t.hop for t in rec.entered if t.profile == "bob") == [1, 2, 3]


def test_a_relay_reply_wakes_the_local_sender(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    rec = RecordingRunner(lambda turn: "noted")
    gw = Gateway(root, runner=rec, config=WAKE_ON, connection_id="alpha")
    gateways.append(gw)
    gw.start()
    envelope = queued(gw.message_agent(sender="alice", target="moxie", message="ping"))
    reply = {"id": envelope, "at": 1, "reply": "pong", "error": "", "reason": ""}
    seed_write_json(root / "bot_relay" / "replies" / f"{envelope}.json", reply)
    assert gw.wait_outcome(envelope, timeout=10)["text"] == "Reply from @moxie on mini: pong"
    gw.wait_outcome(wake_id(envelope), timeout=10)
    (turn,) = rec.entered
    assert (turn.profile, turn.content) == ("alice", "Reply from @moxie on mini: pong")


def test_a_dm_from_a_remote_sender_wakes_nobody_here(tmp_path: Path) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    rec = RecordingRunner(lambda turn: "moxie here")
    with Gateway(mini, runner=rec, config=WAKE_ON, connection_id="mini") as gw, \
            hub_thread({"alpha": alpha, "mini": mini}):
        await_condition((alpha / "bot_relay" / "roster.json").exists, timeout=10, message="the hub pushed a roster")
        env = seed_envelope(target_connection="mini", target_profile="moxie", message="hello from afar")
        seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env, prefix=".env-")
        reply_path = alpha / "bot_relay" / "replies" / f"{env['id']}.json"
        await_condition(reply_path.exists, timeout=10, message="the reply went back to alpha")
        assert gw.stats()["wakes_sent"] == 0
    assert [t.profile for t in rec.entered] == ["moxie"]


@pytest.mark.parametrize("durable", [True, False])
def test_a_relay_dm_resumed_after_the_senders_restart_still_wakes_its_sender(
    tmp_path: Path, gateways: list[Gateway], durable: bool
) -> None:
    """Regression: after a restart the resumed relay DM got its outcome, but its sender was never woken
    (``sent/`` kept only the id and label, so the resumed DM had no sender)."""
    from hermes_actors.store import relay_files as rf
    from hermes_actors.store import relay_protocol as rp
    from hermes_actors.store.relay_paths import RelayPaths

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    first = start_gateway(gateways, alpha, RecordingRunner(), config=WAKE_ON, connection_id="alpha", durable=durable)
    dm = queued(first.message_agent(sender="alice", target="moxie@mini", message="hi"))
    first.stop(timeout=5)

    rec = RecordingRunner(lambda turn: "noted")
    rf.write_reply(RelayPaths.from_root(alpha), rp.make_reply(dm, reply="hello back", now=0.0))
    gw = start_gateway(gateways, alpha, rec, config=WAKE_ON, connection_id="alpha", durable=durable)
    assert gw.wait_outcome(dm, timeout=10)["reply"] == "hello back"
    wake = gw.wait_outcome(wake_id(dm), timeout=10)  # the sender's wake turn ran and settled
    assert wake["status"] == "replied"
    (turn,) = [t for t in rec.entered if t.profile == "alice"]
    assert is_wake_turn(turn) and "hello back" in turn.content
    assert turn.hop == 1  # the DM's hop, as recorded when it was sent


@pytest.mark.parametrize("accepting_wakes", [True, False], ids=["acked-by-a-waking-host", "acked-by-a-one-off-send"])
def test_a_resumed_relay_dm_wakes_its_sender_as_the_gateway_that_acked_it_decided(
    tmp_path: Path, gateways: list[Gateway], accepting_wakes: bool
) -> None:
    """The decision rides in ``sent/`` across the restart: the gateway that reads the reply does not decide."""
    from hermes_actors.store import relay_files as rf
    from hermes_actors.store import relay_protocol as rp
    from hermes_actors.store.relay_paths import RelayPaths

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    first = start_gateway(gateways, alpha, RecordingRunner(), config={"bot_mode": {"wake_sender": accepting_wakes}},
                          connection_id="alpha")
    dm = queued(first.message_agent(sender="alice", target="moxie@mini", message="hi"))
    first.stop(timeout=5)

    rec = RecordingRunner(lambda turn: "noted")
    rf.write_reply(RelayPaths.from_root(alpha), rp.make_reply(dm, reply="hello back", now=0.0))
    gw = start_gateway(gateways, alpha, rec, config={"bot_mode": {"wake_sender": not accepting_wakes}},
                       connection_id="alpha")
    assert gw.wait_outcome(dm, timeout=10)["reply"] == "hello back"
    assert_woken_or_not(gw, dm, accepting_wakes)
    assert [t.profile for t in rec.entered] == (["alice"] if accepting_wakes else [])


def test_status_names_a_pending_wake_a_wake_and_never_counts_its_outcome_as_a_dm(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Live and from the files: a wake turn is shown as route "wake"; only the DM is a settled DM."""
    from hermes_actors.ops.status import file_status, live_status

    gate = threading.Event()

    def behave(turn: Turn) -> str:
        if is_wake_turn(turn):
            assert gate.wait(30), "the test never opened the gate"
            return "noted"
        return "ok"

    root = make_root(tmp_path)
    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, root, rec, config=WAKE_ON)
    dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    rec.wait_entered(2, timeout=10)  # alice's wake turn is running
    live = live_status(gw)
    rows = {row["delivery_id"]: row for row in live["in_flight"]}
    assert rows[wake_id(dm)]["route"] == "wake", rows
    assert live["counters"]["pending"] == 0 and live["counters"]["settled"] == 1  # DMs only
    held = file_status(root)  # what the journal says meanwhile
    assert [(r["delivery_id"], r["route"]) for r in held["in_flight"]] == [(wake_id(dm), "wake")]
    assert held["counters"]["pending"] == 0
    gate.set()
    assert gw.wait_outcome(wake_id(dm), timeout=10)["reply"] == "noted"
    gw.stop()
    after = file_status(root)
    assert after["counters"]["settled"] == 1 and after["in_flight"] == [], after["counters"]
    assert after["counters"]["by_status"] == {"replied": 1}


def test_status_from_the_files_never_counts_a_wake_once_a_later_start_rewrote_the_journal(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review (opsfix): after one more start and stop (its adoption rewrote the journal as outcomes only), status
    read from the files counted each wake turn's outcome as a settled DM: 3 DMs showed ``settled 6``."""
    from hermes_actors.ops.status import file_status

    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, RecordingRunner(lambda turn: "noted" if is_wake_turn(turn) else "ok"),
                       config=WAKE_ON)
    dms = [queued(gw.message_agent(sender="alice", target="bob", message=f"hi {n}")) for n in range(3)]
    await_condition(lambda: gw.stats()["wakes_sent"] == 3, timeout=10, message="the 3 wakes were never sent")
    for dm in dms:
        assert gw.wait_outcome(wake_id(dm), timeout=10)["reply"] == "noted"
    gw.stop()
    for _ in range(2):  # each start adopts the journal before it and writes its outcomes into its own file
        start_gateway(gateways, root, RecordingRunner(), config=WAKE_ON).stop()
        counters = file_status(root)["counters"]
        assert (counters["settled"], counters["by_status"]) == (3, {"replied": 3}), counters


def test_a_reply_too_long_for_a_cli_turn_wakes_the_sender_with_its_first_part_and_a_note(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a wake over 100 KiB failed on hermes 0.19's CLI (text on its command line)."""
    long_reply = "é" * 120_000  # 240,000 bytes of UTF-8
    rec = RecordingRunner(lambda turn: "noted" if is_wake_turn(turn) else long_reply)
    root = make_root(tmp_path)
    monkeypatch.chdir(root.parent)  # a relative root (`serve --root hermes-root`): the note names it absolute
    gw = start_gateway(gateways, Path(root.name), rec, config=WAKE_ON)
    dm = queued(gw.message_agent(sender="alice", target="bob", message="write a lot"))
    outcome = gw.wait_outcome(dm, timeout=10)
    assert outcome["reply"] == long_reply  # the outcome keeps it whole
    assert gw.wait_outcome(wake_id(dm), timeout=10)["status"] == "replied"
    (turn,) = [t for t in rec.entered if t.profile == "alice"]
    assert len(turn.content.encode()) <= 100 * 1024  # what hermes 0.19's command line takes
    assert len(turn.content) <= 65_536  # what its API server keeps of a message (it cuts the rest silently)
    head, note = turn.content.split("\n\n[cut here: ")
    assert outcome["text"].startswith(head) and head.startswith("Reply from @bob: éé")
    assert note == f"the whole text is {len(outcome['text']):,} characters; " \
                   f"`hermes-actors outcome --root {shlex.quote(str(root))} {dm}` prints it]"
    gw.stop()
    monkeypatch.chdir(tmp_path.parent)  # the bot runs it from elsewhere
    assert main(["outcome", "--root", str(root), dm]) == 0  # the command the note names finds it


@pytest.mark.parametrize("accepting_wakes", [True, False], ids=["acked-by-a-waking-host", "acked-by-a-one-off-send"])
def test_whether_a_dm_wakes_its_sender_is_decided_where_it_was_acked_not_where_it_settles(
    tmp_path: Path, accepting_wakes: bool
) -> None:
    # A host (waking) acks a DM and stops with it journaled; a one-off `send` (waking nobody) adopts the
    # journal and runs it: the sender still gets its wake. And the reverse: a one-off send's DM run by a host
    # wakes nobody (the send printed its outcome itself).
    root = make_root(tmp_path)
    release = threading.Event()
    blocked = RecordingRunner(held_on("blocker", release))
    first = Gateway(root, runner=blocked, durable=True, config={"bot_mode": {"wake_sender": accepting_wakes}})
    first.start()
    try:
        first.message_agent(sender="carol", target="bob", message="blocker")
        blocked.wait_entered(1)
        dm = queued(first.message_agent(sender="alice", target="bob", message="queued behind the blocker"))
    finally:
        first.stop(timeout=0.3)
        release.set()

    rec = RecordingRunner(lambda turn: "noted" if is_wake_turn(turn) else f"ok: {body_of(turn.content)}")
    settling = Gateway(root, runner=rec, durable=True, config={"bot_mode": {"wake_sender": not accepting_wakes}})
    settling.start()
    try:
        # the DM, and where the host wakes, carol's wake with the blocker's ambiguous outcome (journaled at stop)
        assert settling.recovered["reoffered"] == 1 + accepting_wakes, settling.recovered
        assert settling.wait_outcome(dm, timeout=10)["text"] == "Reply from @bob: ok: queued behind the blocker"
        assert_woken_or_not(settling, dm, accepting_wakes)
        woken = [t.content for t in rec.entered if t.profile == "alice"]
        assert woken == (["Reply from @bob: ok: queued behind the blocker"] if accepting_wakes else [])
    finally:
        settling.stop()


def test_a_wake_whose_sender_is_removed_before_it_runs_is_settled_not_left_pending(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a wake whose sender's profile was removed between journaling the wake and running it (its batch's
    commit still under way) was left booked pending for the rest of the run: ``wait_outcome`` never answered it.
    Now it is settled ``failed`` (the profile no longer exists) like any DM to a removed profile."""
    import os
    import shutil

    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, RecordingRunner(), config={"bot_mode": {"wake_sender": True,
                                                                             "rescan_seconds": 0.05}})
    journal = gw._journal
    assert journal is not None
    writing, release = threading.Event(), threading.Event()
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:  # the wake's batch is written once alice is gone
        if fd == journal._file.fd and b'"origin":"wake"' in bytes(data) and not release.is_set():
            writing.set()
            release.wait(30)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    dm = queued(gw.message_agent(sender="alice", target="bob", message="hi"))
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    assert writing.wait(10), "the wake's batch is being written"
    shutil.rmtree(root / "profiles" / "alice")  # hermes profile delete -y alice
    await_condition(lambda: all(r["profile"] != "alice" for r in gw.roster()), timeout=10, message="alice left")
    release.set()
    out = gw.wait_outcome(wake_id(dm), timeout=10)
    assert (out["status"], out["reason"]) == ("failed", "unknown"), out
    assert out["error"] == "The profile 'alice' no longer exists; the message was NOT delivered."
    assert gw.stats()["pending"] == 0


def fill_the_queue_of(gw: Gateway, rec: RecordingRunner, profile: str, places: int) -> list[str]:
    """Hold ``profile`` in a ``blocker`` turn and queue ``places`` DMs behind it: its queue is full.

    Returns:
        The blocker's id, then the queued DMs' ids.
    """
    blocker = queued(gw.message_agent(sender="carol", target=profile, message="blocker"))
    rec.wait_entered(1)
    fills = [queued(gw.message_agent(sender="carol", target=profile, message=f"fill {i}")) for i in range(places)]
    refused = gw.message_agent(sender="carol", target=profile, message="one too many")
    assert refused.get("reason") == "target_busy" and "is full" in refused["error"], refused
    return [blocker, *fills]


def wake_told(gw: Gateway, logs: LogCapture, dm: str) -> None:
    """Return once the wake of ``dm`` was told to its sender's ProfileActor (durable: once its records landed).

    The Dispatcher logs it as it queues it; an ask to the Dispatcher (``stats``) hands on what it queued.
    """
    await_condition(lambda: logs.matching("waking @", f"the outcome of {dm} "), timeout=10,
                    message="the Dispatcher queued the wake")
    gw.stats()


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_a_senders_wake_is_queued_past_its_full_queue_and_runs_once(
    tmp_path: Path, gateways: list[Gateway], durable: bool
) -> None:
    """Chaos review: the wake of a DM that was replied failed ``target_busy`` ("the queue for profile 'alice'
    is full … retry shortly") when its sender's own queue was full, so the reply never reached the sender (and
    nobody can retry a wake). A wake is bounded by the sender's own DMs, not by what others send it: it is
    queued past the bound and runs once, after the DMs queued before it."""
    release = threading.Event()
    rec = RecordingRunner(held_on("blocker", release))
    gw = start_gateway(gateways, make_root(tmp_path), rec, durable=durable,
                       config={"bot_mode": {"wake_sender": True, "max_queued": 2}})
    before = fill_the_queue_of(gw, rec, "alice", 2)
    with LogCapture("DEBUG") as logs:
        dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        wake_told(gw, logs, dm)  # reaches alice's ProfileActor while its queue is full
    release.set()
    wake = gw.wait_outcome(wake_id(dm), timeout=20)
    assert (wake["status"], wake["reply"]) == ("replied", "ok: Reply from @bob: ok: ping"), wake
    for key in before:
        assert gw.wait_outcome(key, timeout=20)["status"] == "replied"
    alice = [t.delivery_id for t in rec.entered if t.profile == "alice"]
    assert alice == [*before, wake_id(dm)]  # the wake once, behind the DMs queued before it
    assert gw.stats()["wakes_failed"] == 0


def test_wakes_queued_past_the_bound_are_not_counted_as_dms_waiting(tmp_path: Path, gateways: list[Gateway]) -> None:
    """Review (diffrev10): wakes are queued past ``max_queued`` but were counted as DMs waiting, so with one DM
    waiting and three wakes queued a new DM was refused "the queue for profile 'alice' is full (4 DMs waiting)",
    with ``max_queued`` 2. The bound and its text count DMs only: a local DM and a relayed-in one (checked by
    the ProfileActor, not in an ack) are admitted while fewer than ``max_queued`` DMs wait, and the next local
    DM is refused naming the DMs that wait."""
    root = make_root(tmp_path, name="alpha")
    release = threading.Event()
    rec = RecordingRunner(held_on("blocker", release))
    gw = start_gateway(gateways, root, rec, connection_id="alpha",
                       config={"bot_mode": {"wake_sender": True, "max_queued": 2}})
    blocker = queued(gw.message_agent(sender="carol", target="alice", message="blocker"))
    rec.wait_entered(1)
    fill = queued(gw.message_agent(sender="carol", target="alice", message="fill 0"))
    with LogCapture("DEBUG") as logs:
        dms = [queued(gw.message_agent(sender="alice", target="bob", message=f"ping {i}")) for i in range(3)]
        for dm in dms:
            assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
            wake_told(gw, logs, dm)  # queued on alice's ProfileActor, behind fill 0
    paths = InboxPaths.from_root(root)
    envelope = seed_envelope(target_connection="alpha", target_profile="alice", from_profile="moxie",
                             message="relayed")
    post_to_inbox(paths, envelope, "mini")  # checked by alice's ProfileActor: 1 DM waits, 3 wakes
    delivered = paths.delivered / f"{envelope['id']}.json"
    await_condition(lambda: delivered.exists() or any(r["delivery_id"] == envelope["id"]
                                                      for r in live_status(gw)["in_flight"]),
                    timeout=10, message="the relayed-in DM is queued (or answered)")
    gw.stats()  # an ask: the Dispatcher has handed it to alice's ProfileActor
    assert not delivered.exists(), delivered.read_text(encoding="utf-8")  # not refused: only 1 DM waited
    refused = gw.message_agent(sender="carol", target="alice", message="one too many")
    assert refused.get("reason") == "target_busy", refused
    assert "the queue for profile 'alice' is full (2 DMs waiting)" in refused["error"], refused
    release.set()
    for key in (blocker, fill, *(wake_id(dm) for dm in dms)):
        assert gw.wait_outcome(key, timeout=20)["status"] == "replied"
    await_condition(delivered.exists, timeout=20, message="the relayed-in DM's reply")
    assert json.loads(delivered.read_text(encoding="utf-8"))["reply"] == "ok: relayed"
    alice = [t.delivery_id for t in rec.entered if t.profile == "alice"]
    assert alice == [blocker, fill, *(wake_id(dm) for dm in dms), envelope["id"]]


def test_a_running_wake_takes_the_place_of_the_turn_so_a_dm_past_the_bound_is_refused_in_its_ack(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """A queued wake takes no place in the bound, but the turn it runs does (``max_queued`` places and one for
    the turn): while alice's wake runs, ``max_queued`` DMs may wait and the next is refused in its ack, not
    acked and then failed ``target_busy`` by the ProfileActor."""
    gate = threading.Event()

    def behave(turn: Turn) -> str:
        if is_wake_turn(turn):
            assert gate.wait(30), "the test never opened the gate"
            return "noted"
        return f"ok: {body_of(turn.content)}"

    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), rec, config={"bot_mode": {"wake_sender": True, "max_queued": 2}})
    dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    rec.wait_entered(2, timeout=10)  # alice's wake turn is running
    waiting = [queued(gw.message_agent(sender="carol", target="alice", message=f"fill {i}")) for i in range(2)]
    refused = gw.message_agent(sender="carol", target="alice", message="one too many")
    assert refused.get("reason") == "target_busy", refused
    assert "the queue for profile 'alice' is full (2 DMs waiting)" in refused["error"], refused
    gate.set()
    assert gw.wait_outcome(wake_id(dm), timeout=20)["reply"] == "noted"
    for key in waiting:
        assert gw.wait_outcome(key, timeout=20)["status"] == "replied"


def test_a_wake_that_waited_past_the_turn_wait_budget_still_runs_even_if_the_flock_is_busy_as_it_starts(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chaos review: a queued wake failed ``target_busy`` once it had waited ``turn_wait_seconds`` behind its
    sender's long turn, like a DM (which its sender may resend; nobody resends a wake). It waits for its turn
    however long that takes; and once it starts, its wait for the bot's flock (another process's turn) is
    timed from its start: before, that deadline was already past, and a flock busy for a moment failed it."""
    from hermes_actors.store.turnlock import TurnLock

    release, contend, contended = threading.Event(), threading.Event(), threading.Event()
    real_lock_now = TurnLock._lock_now

    def lock_now(self: TurnLock) -> None:  # once contend is set, the next try finds the flock taken, once
        if contend.is_set() and not contended.is_set():
            contended.set()
            raise BlockingIOError("another process holds the flock (this test)")
        real_lock_now(self)

    monkeypatch.setattr(TurnLock, "_lock_now", lock_now)
    rec = RecordingRunner(held_on("blocker", release))
    gw = start_gateway(gateways, make_root(tmp_path), rec,
                       config={"bot_mode": {"wake_sender": True, "turn_wait_seconds": 1.0}})
    blocker = queued(gw.message_agent(sender="carol", target="alice", message="blocker"))
    rec.wait_entered(1)
    with LogCapture("DEBUG") as logs:
        dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        wake_told(gw, logs, dm)
    later = queued(gw.message_agent(sender="carol", target="alice", message="later"))  # queued behind the wake
    out = gw.wait_outcome(later, timeout=20)
    assert (out["status"], out["reason"]) == ("failed", "target_busy"), out  # the wake's budget ran out before
    contend.set()
    release.set()
    wake = gw.wait_outcome(wake_id(dm), timeout=20)
    assert wake["status"] == "replied", wake
    assert contended.is_set()  # the wake's first try at the flock found it busy, and it waited
    assert gw.wait_outcome(blocker, timeout=10)["status"] == "replied"
    assert [t.delivery_id for t in rec.entered if t.profile == "alice"] == [blocker, wake_id(dm)]
    assert gw.stats()["wakes_failed"] == 0


_HOLD_THE_FLOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("turn_wait", [0, -5])
def test_a_wake_waits_for_a_flock_another_process_holds_a_moment_even_with_no_turn_wait(
    tmp_path: Path, gateways: list[Gateway], turn_wait: float
) -> None:
    """Review (diffrev10): a wake's flock wait was ``turn_wait_seconds`` from its start, so with 0 (what a negative
    value means too, as the seed reads it) one try that found the bot's flock taken by another process's turn
    failed the wake ``target_busy``: its reply was lost to the bot (nobody resends a wake) for a moment's
    contention. A wake now waits for the flock as long as a turn may hold it (``turn_timeout_seconds``)."""
    root = make_root(tmp_path)
    lock = turn_lock_path(root, "alice")
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THE_FLOCK, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"  # another process's turn
        rec = RecordingRunner()
        config = {"bot_mode": {"wake_sender": True, "turn_wait_seconds": turn_wait}}
        gw = start_gateway(gateways, root, rec, config=config)
        with LogCapture("INFO") as logs:
            dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
            assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
            await_condition(lambda: logs.matching("waiting for the lock", str(lock)), timeout=10,
                            message="the wake found alice's flock taken")
    finally:
        holder.communicate("go\n", timeout=30)  # its turn ends: the flock is free
    wake = gw.wait_outcome(wake_id(dm), timeout=20)
    assert (wake["status"], wake["reply"]) == ("replied", "ok: Reply from @bob: ok: ping"), wake
    assert [t.delivery_id for t in rec.entered if t.profile == "alice"] == [wake_id(dm)]
    assert gw.stats()["wakes_failed"] == 0


def test_a_wake_that_got_the_flock_late_still_has_the_whole_turn_timeout_for_its_turn(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """A wake's flock wait may last ``turn_timeout_seconds``, and its turn has ``turn_timeout_seconds`` from when it
    began: a wake that waited for another process's turn and then runs a turn of its own, shorter than
    ``turn_timeout_seconds``, is not cut off ``delivery_timeout`` at ``turn_timeout_seconds`` from its start (the
    timer would have fired while its turn ran). The other process holds the flock 2 s after the wake was seen
    waiting, so the wake's turn (until its start + turn_timeout_seconds + 0.5 s) lasts well under its timeout."""
    timeout = 4.0
    root = make_root(tmp_path)
    lock = turn_lock_path(root, "alice")
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    waited: list[float] = []  # when the test saw the wake wait for the flock (after its timer was armed)

    def behave(turn: Turn) -> str:
        if is_wake_turn(turn):  # a turn that outlives the wake's start + turn_timeout_seconds, by a margin
            threading.Event().wait(max(0.0, waited[0] + timeout + 0.5 - time.monotonic()))
            return "noted"
        return f"ok: {body_of(turn.content)}"

    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THE_FLOCK, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        rec = RecordingRunner(behave)
        gw = start_gateway(gateways, root, rec, config={"bot_mode": {"wake_sender": True, "turn_wait_seconds": 0,
                                                                     "turn_timeout_seconds": timeout}})
        with LogCapture("INFO") as logs:
            dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
            await_condition(lambda: logs.matching("waiting for the lock", str(lock)), timeout=10,
                            message="the wake found alice's flock taken")
            waited.append(time.monotonic())
        threading.Event().wait(2.0)  # the other process's turn goes on: the wake gets the flock late, by a margin
    finally:
        holder.communicate("go\n", timeout=30)
    wake = gw.wait_outcome(wake_id(dm), timeout=20)
    assert (wake["status"], wake["reply"]) == ("replied", "noted"), wake
    assert gw.stats()["wakes_failed"] == 0
    (ran,) = [r for r in rec.records if r.turn.delivery_id == wake_id(dm)]
    assert ran.exited - ran.entered < timeout, "the premise: the wake's own turn was shorter than its timeout"


def test_a_hung_wake_that_got_the_flock_at_once_times_out_at_turn_timeout_and_the_dm_behind_it_runs(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review (diffrev12) of 8a08e4a: a wake's turn timer was armed for its whole flock wait plus
    ``turn_timeout_seconds`` even when the flock was free at once, so a hung wake held its bot that long (defaults:
    up to 1200 s, its text still saying "within 600s") and every DM queued behind it failed ``target_busy``
    meanwhile. Its turn has ``turn_timeout_seconds`` from when it began, as any turn's: it times out then, and the
    DM behind it runs (here within its 8 s wait; before, the wake was timed out at 8 + 1 s, after that DM failed)."""
    release = threading.Event()

    def behave(turn: Turn) -> str:
        if is_wake_turn(turn):
            release.wait(60)  # hung
            return "noted"
        return f"ok: {body_of(turn.content)}"

    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), rec, config={"bot_mode": {
        "wake_sender": True, "turn_timeout_seconds": 1, "turn_wait_seconds": 8}})
    try:
        dm = queued(gw.message_agent(sender="alice", target="bob", message="ping"))
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        await_condition(lambda: wake_id(dm) in [t.delivery_id for t in rec.entered], timeout=10,
                        message="the wake's turn began (alice's flock was free)")
        behind = queued(gw.message_agent(sender="carol", target="alice", message="behind the wake"))
        wake = gw.wait_outcome(wake_id(dm), timeout=30)
        assert (wake["status"], wake["reason"]) == ("failed", "delivery_timeout"), wake
        assert "did not finish within 1s" in wake["text"], wake
        after = gw.wait_outcome(behind, timeout=30)
        assert (after["status"], after["reply"]) == ("replied", "ok: behind the wake"), after
    finally:
        release.set()


def test_a_relay_replys_wake_is_queued_past_its_senders_full_queue(tmp_path: Path, gateways: list[Gateway]) -> None:
    """Chaos review, the relay side: a relayed reply's wake found its sender's queue full and failed the same way."""
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    release = threading.Event()
    rec = RecordingRunner(held_on("blocker", release))
    gw = start_gateway(gateways, root, rec, connection_id="alpha",
                       config={"bot_mode": {"wake_sender": True, "max_queued": 2}})
    before = fill_the_queue_of(gw, rec, "alice", 2)
    envelope = queued(gw.message_agent(sender="alice", target="moxie", message="ping"))
    reply = {"id": envelope, "at": 1, "reply": "pong", "error": "", "reason": ""}
    with LogCapture("DEBUG") as logs:
        seed_write_json(root / "bot_relay" / "replies" / f"{envelope}.json", reply)
        assert gw.wait_outcome(envelope, timeout=10)["text"] == "Reply from @moxie on mini: pong"
        wake_told(gw, logs, envelope)
    release.set()
    wake = gw.wait_outcome(wake_id(envelope), timeout=20)
    assert wake["status"] == "replied", wake
    alice = [t for t in rec.entered if t.profile == "alice"]
    assert [t.delivery_id for t in alice] == [*before, wake_id(envelope)]
    assert alice[-1].content == "Reply from @moxie on mini: pong"


class _RealHermesLike(RecordingRunner):
    """A recording runner that says its turns run on the real Hermes (``wake_sender: auto`` wakes senders)."""

    real_hermes = True

    def run_turn(self, turn: Turn) -> Any:  # a runner object, not a callable: wrapped, it would lose real_hermes
        return self(turn)


def _readme_no_wake_config() -> dict[str, Any]:
    """The ``config=`` README gives beside its Python example to wake nobody."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    found = re.search(r"pass `config=(\{.*?\}\})` to `Gateway`", readme)
    assert found is not None, "README says next to its Python example how to not wake the sender"
    config = ast.literal_eval(found.group(1))
    assert isinstance(config, dict)
    return config


@pytest.mark.parametrize("readme_config", [False, True], ids=["default", "readme-no-wake"])
def test_the_readme_example_leaves_a_wake_the_next_host_runs_unless_told_not_to(
    tmp_path: Path, gateways: list[Gateway], readme_config: bool
) -> None:
    """Regression (acceptance review): README's Python example (``wait_outcome`` then print, on the real Hermes)
    left a journaled wake for alice that the next ``serve`` ran as a new turn in her Bot Chat, and README did not
    say so. It does now, with the config that wakes nobody: both halves are checked here."""
    config = _readme_no_wake_config() if readme_config else None
    root = make_root(tmp_path)
    lock = turn_lock_path(root, "alice")
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # alice's wake cannot begin before the example's gateway stops
        rec = _RealHermesLike()
        with Gateway(root, runner=rec, config=config) as gw:  # the README example
            ack = gw.message_agent(sender="alice", target="bob", message="hi")
            assert gw.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
        assert [t.profile for t in rec.entered] == ["bob"]
    finally:
        os.close(held)  # the flock goes with it
    nxt = _RealHermesLike()
    gw2 = start_gateway(gateways, root, nxt, config=config)  # the next host on the root
    if readme_config:
        with pytest.raises(KeyError):
            gw2.wait_outcome(wake_id(ack["delivery_id"]), timeout=1)
        assert nxt.entered == []
    else:
        assert gw2.wait_outcome(wake_id(ack["delivery_id"]), timeout=30)["status"] == "replied"
        (turn,) = nxt.entered
        assert (turn.profile, turn.session) == ("alice", BOT_CHAT_SESSION)
        assert turn.content.startswith("Reply from @bob: ")


# ── a wake whose turn never began is tried again ────────────────────────────

RETRY_FAST = {"wake_sender": True, "wake_retry_seconds": 0.05}  # bot_mode: the shortest back-off, for the tests


class _WakeRefused:
    """A runner whose sender's wake turns fail as hermes' would when the bot's turn never began: the first
    ``refusals`` of them (all of them when None) raise ``TurnFailed`` (``target_busy`` by default); every other
    turn replies. Each wake turn's delivery id is recorded."""

    def __init__(self, refusals: int | None, error: TurnFailed | None = None) -> None:
        self.refusals = refusals
        self.error = error or TurnFailed("@alice's Bot Chat is open on another surface right now", "target_busy")
        self.rec = RecordingRunner(self.behave)
        self.lock = threading.Lock()
        self.woken: list[str] = []  # wake turns that got their reply to the bot (ran to their end)
        self.refused: list[str] = []

    def behave(self, turn: Turn) -> str:
        if not is_wake_turn(turn):
            return f"{turn.profile} got: {body_of(turn.content)}"
        with self.lock:
            if self.refusals is None or len(self.refused) < self.refusals:
                self.refused.append(turn.delivery_id)
                raise self.error
            self.woken.append(turn.delivery_id)
        return "noted"


def test_a_wake_refused_target_busy_once_is_tried_again_and_the_sender_gets_the_reply_once(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review: a wake whose turn failed ``target_busy`` (another process, a seed gateway or a user's ``hermes chat``,
    held the bot's flock for the whole wait) was only logged ("waking @alice failed"): nobody resends a wake, so
    alice never learnt bob's reply. It is now run again, as an attempt of its own, after its back-off."""
    runner = _WakeRefused(refusals=1)
    gw = start_gateway(gateways, make_root(tmp_path), runner.rec, config={"bot_mode": RETRY_FAST})
    seen: list[dict[str, Any]] = []
    gw.subscribe(seen.append)
    dm = queued(gw.message_agent(sender="alice", target="bob", message="status?"))
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    first = gw.wait_outcome(wake_id(dm), timeout=10)
    assert (first["status"], first["reason"]) == ("failed", "target_busy")
    again = wake_retry_id(wake_id(dm))
    assert gw.wait_outcome(again, timeout=20)["status"] == "replied"
    assert runner.refused == [wake_id(dm)] and runner.woken == [again]  # the bot got the reply exactly once
    alice = [t for t in runner.rec.entered if t.profile == "alice"]
    assert [t.delivery_id for t in alice] == [wake_id(dm), again]
    assert alice[0].content == alice[1].content == "Reply from @bob: bob got: status?"
    assert alice[1].hop == alice[0].hop == 1
    stats = gw.stats()
    assert (stats["wakes_sent"], stats["wakes_retried"], stats["wakes_failed"]) == (1, 1, 0)
    assert live_status(gw)["counters"]["wakes_retried"] == 1  # `status --json` shows it too
    with pytest.raises(KeyError):  # it replied: no third attempt
        gw.wait_outcome(wake_retry_id(again), timeout=1)
    await_condition(lambda: len(seen) >= 1, timeout=10, message="the subscriber saw the DM's outcome")
    assert [o["delivery_id"] for o in seen] == [dm]  # no attempt's outcome is a DM outcome
    assert gw.stats()["settled"] == 1


def test_a_wake_refused_until_its_window_closes_is_given_up_with_one_warning(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """A wake tried again until ``reply_wait_seconds`` passed since it was created is then given up: one WARNING
    saying so, counted in ``wakes_failed``; no attempt is created after that."""
    runner = _WakeRefused(refusals=None)
    gw = start_gateway(gateways, make_root(tmp_path), runner.rec,
                       config={"bot_mode": {**RETRY_FAST, "reply_wait_seconds": 3}})
    with LogCapture("WARNING") as logs:
        dm = queued(gw.message_agent(sender="alice", target="bob", message="status?"))
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        await_condition(lambda: gw.stats()["wakes_failed"] == 1, timeout=30, message="the wake was given up")
        stats = gw.stats()
    attempts = runner.refused
    assert attempts[0] == wake_id(dm) and len(attempts) >= 2 and runner.woken == []
    assert attempts == [attempts[0], *(wake_retry_id(a) for a in attempts[:-1])]  # each derived from the one before
    assert (stats["wakes_sent"], stats["wakes_retried"], stats["wakes_failed"]) == (1, len(attempts) - 1, 1)
    (given_up,) = logs.matching("waking @alice failed")
    assert f"wake {attempts[-1]}, target_busy" in given_up and "given up: 3 s (bot_mode.reply_wait_seconds)" in given_up
    assert gw.wait_outcome(attempts[-1], timeout=10)["reason"] == "target_busy"
    with pytest.raises(KeyError):
        gw.wait_outcome(wake_retry_id(attempts[-1]), timeout=1)


@pytest.mark.parametrize("error", [
    TurnFailed("the connection to hermes was lost after the request was sent", "runtime_offline", ambiguous=True),
    TurnFailed("the turn timed out", "delivery_timeout"),
], ids=["ambiguous", "delivery_timeout"])
def test_a_wake_that_may_have_run_is_never_tried_again(
    tmp_path: Path, gateways: list[Gateway], error: TurnFailed
) -> None:
    """An ``ambiguous`` wake (or one timed out) may have reached the bot: running it again could give the bot the
    reply twice. It is given up at once, as before."""
    runner = _WakeRefused(refusals=None, error=error)
    gw = start_gateway(gateways, make_root(tmp_path), runner.rec, config={"bot_mode": RETRY_FAST})
    with LogCapture("WARNING") as logs:
        dm = queued(gw.message_agent(sender="alice", target="bob", message="status?"))
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"  # its wake is booked by then
        wake = gw.wait_outcome(wake_id(dm), timeout=10)
        stats = gw.stats()  # answered once the wake's outcome was handled (a retry would be booked by then)
    assert wake["reason"] == error.reason and (wake["status"] == "ambiguous") is error.ambiguous
    assert (stats["wakes_sent"], stats["wakes_retried"], stats["wakes_failed"]) == (1, 0, 1)
    with pytest.raises(KeyError):
        gw.wait_outcome(wake_retry_id(wake_id(dm)), timeout=1)
    assert set(runner.refused) == {wake_id(dm)}  # (a timed-out turn gets the turn's own policy retry, same id)
    (failed,) = logs.matching("waking @alice failed")
    assert "given up" not in failed
