"""issue 14: nothing stranded when the receiving gateway or the hub dies; the seed on the same root left alone."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import hub_thread, remote_row, seed_envelope, seed_write_json, write_roster_file
from roots import LogCapture, RecordingRunner, body_of, make_root, send_dm, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed
from hermes_actors.errors import HostileFileError
from hermes_actors.relay.drain import Expired, Quarantined, ToDeliver, drain_envelope
from hermes_actors.relay.restart import (
    SentScan,
    damaged_fate,
    envelope_is_ours,
    rebuilt_record,
    recover_taken,
    scan_sent,
    taken_action,
)
from hermes_actors.store import owner_lock
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_inbox import InboxPaths, take_from_inbox
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_sent import (
    UNKNOWN_TARGET_LABEL,
    SentRecord,
    clear_sent,
    drop_withdrawn,
    queueing_name,
    record_sent,
)
from hermes_actors.store.relay_shelf import (
    LOCK_NAME,
    Shelf,
    count_on_shelves,
    find_on_shelves,
    holding_places,
    is_shelf_name,
)


def _dead_shelf(parent: Path) -> Path:
    """A shelf as a gateway killed -9 leaves it: the lock file is there, nobody holds its flock."""
    shelf = parent / f"s-{uuid.uuid4().hex}"
    shelf.mkdir(parents=True, mode=0o700)
    (shelf / LOCK_NAME).touch(mode=0o600)
    return shelf


def _write(path: Path, payload: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(payload, f)


def _inbound(target_profile: str, message: str = "hello") -> dict[str, Any]:
    return {**seed_envelope(target_connection="mini", target_profile=target_profile, message=message),
            "reply_connection": "alpha"}


def _delivered(root: Path, envelope_id: str) -> dict[str, Any] | None:
    path = root / "bot_relay" / "delivered" / f"{envelope_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


# ── item 1: the receiving gateway's taken envelopes ─────────────────────────


@pytest.mark.parametrize(
    ("replied", "started", "legacy", "expected"),
    [
        (False, False, False, "rerun"),  # never started: run it now, once
        (False, True, False, "may_have_run"),  # never run twice: answered from the journal, else ambiguous
        (False, False, True, "may_have_run"),  # a flat file of an older version: nothing recorded its state
        (True, True, False, "finished"),  # its reply is on disk: the hub forwards it
        (True, False, True, "finished"),
    ],
)
def test_taken_action(replied: bool, started: bool, legacy: bool, expected: str) -> None:
    assert taken_action(replied=replied, started=started, legacy=legacy) == expected


def test_recover_taken_leaves_an_envelope_that_may_have_run_on_our_shelf_marked_for_the_dispatcher_to_answer(
    tmp_path: Path,
) -> None:
    """Regression (review): a started envelope whose reply is nowhere on disk was answered ``ambiguous`` here at
    once, though the dead gateway's journal may hold its outcome. Now it is returned for the Dispatcher to answer
    (from the journal, else ambiguous): no reply is written, it stays on our shelf with its start mark, and a legacy
    flat file gets the start mark its turn would have had, so a kill before its answer never lets a start run it."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    dead = _dead_shelf(paths.taken_parent)
    midturn, legacy = _inbound("moxie", "m0"), _inbound("moxie", "m1")
    _write(dead / f"{midturn['id']}.json", midturn)
    _write(paths.started / f"{midturn['id']}.json", {"id": midturn["id"], "at": int(time.time())})
    _write(paths.taken_parent / f"{legacy['id']}.json", legacy)  # taken by a version without shelves
    shelf = Shelf(paths.taken_parent, within=paths.relay.root)
    ours = paths.on_shelf(shelf.open())
    try:
        recovery = recover_taken(ours, shelf.adopt(), ttl=900)
    finally:
        shelf.close(keep=True)
    assert sorted((env["id"], conn) for env, conn in recovery.may_have_run) == sorted(
        [(midturn["id"], "alpha"), (legacy["id"], "alpha")])
    assert (recovery.rerun, recovery.ambiguous, recovery.finished) == ([], 0, 0)
    for env in (midturn, legacy):
        assert _delivered(tmp_path / "root", env["id"]) is None
        assert (ours.taken / f"{env['id']}.json").exists() and (paths.started / f"{env['id']}.json").exists()


_ID, _SHELF, _NOW = "a" * 32, "s-" + "b" * 32, 1_800_000_000.0
_ENVELOPE = seed_envelope(target_connection="mini", target_profile="moxie", target_handle="moxie", from_profile="alice",
                          from_handle="al", created_at=1_700_000_000, envelope_id=_ID)


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        pytest.param(_ENVELOPE, SentRecord(_ID, 1_700_000_000.0, "@moxie on mini", "alice", "al", 0, False, _SHELF),
                     id="a-seed-shaped-envelope"),
        pytest.param({**_ENVELOPE, "hop": 3},
                     SentRecord(_ID, 1_700_000_000.0, "@moxie on mini", "alice", "al", 3, False, _SHELF),
                     id="its-hop-kept"),
        pytest.param({**_ENVELOPE, "hop": 3, "wake": True},  # an envelope that says its wake: kept
                     SentRecord(_ID, 1_700_000_000.0, "@moxie on mini", "alice", "al", 3, True, _SHELF),
                     id="its-wake-kept"),
        pytest.param({**_ENVELOPE, "created_at": 0},  # unknown (parse_envelope's 0): aged from now
                     SentRecord(_ID, _NOW, "@moxie on mini", "alice", "al", 0, False, _SHELF),
                     id="created-at-unknown"),
        pytest.param({**_ENVELOPE, "from_profile": "x" * 65},  # not a sender of ours (recorded_sender's rule)
                     SentRecord(_ID, 1_700_000_000.0, "@moxie on mini", "", "", 0, False, _SHELF),
                     id="a-sender-too-long-names-nobody"),
        pytest.param(None, SentRecord(_ID, _NOW, UNKNOWN_TARGET_LABEL, "", "", 0, False, _SHELF), id="no-envelope"),
    ],
)
def test_rebuilt_record(envelope: dict[str, Any] | None, expected: SentRecord) -> None:
    """A damaged sent/ record rebuilt from its envelope: target, sender, hop and age from it; no wake unless the
    envelope says so (diffrev29: the wake was left to the host's ``wake_sender``, which woke a sender who sent
    with wake off)."""
    assert rebuilt_record(_ID, envelope, now=_NOW, owner=_SHELF) == expected


@pytest.mark.parametrize(
    ("envelope", "profiles", "expected"),
    [
        pytest.param({**_ENVELOPE, "hop": 0}, {"alice"}, True, id="our-hop-and-a-profile-of-the-root"),
        pytest.param(_ENVELOPE, {"alice"}, False, id="a-seeds-no-hop"),
        pytest.param({**_ENVELOPE, "hop": 0}, {"bob"}, False, id="a-sender-not-of-this-root"),
        pytest.param({**_ENVELOPE, "hop": 0}, set(), False, id="no-profiles-known"),
    ],
)
def test_envelope_is_ours(envelope: dict[str, Any], profiles: set[str], expected: bool) -> None:
    """Only an envelope our gateways wrote (``hop``) from a profile of this root is taken for ours (diffrev29)."""
    assert envelope_is_ours(envelope, profiles) is expected


@pytest.mark.parametrize(
    ("found", "traced", "expected"),
    [
        ("ours", True, "rebuild"),
        ("ours", False, "rebuild"),
        ("foreign", True, "foreign"),  # a seed's envelope: never taken, whatever else is there
        ("foreign", False, "foreign"),
        ("none", True, "blind"),  # its reply, a claim, an unreadable envelope: ambiguous unless the reply is there
        ("none", False, "untraced"),  # only the bad file's name: no outcome invented (diffrev29)
    ],
)
def test_damaged_fate(found: Any, traced: bool, expected: str) -> None:
    assert damaged_fate(found, traced=traced) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"s-{uuid.uuid4().hex}", True),  # what Shelf names its directory: s- + a uuid4's hex
        ("s-0123456789abcdef0123456789abcdef", True),
        ("s-evil", False),
        ("s-", False),
        ("s-0123456789ABCDEF0123456789ABCDEF", False),  # uuid4().hex is lowercase
        ("s-0123456789abcdef0123456789abcde", False),  # 31 hex
        ("s-0123456789abcdef0123456789abcdef0", False),  # 33 hex
        ("s-0123456789abcdef0123456789abcdef.tmp", False),
        ("s-0123456789abcdef0123456789abcdeg", False),
        ("expiring", False),  # the hub's hubclaims/expiring/ holds shelves; it is none
        ("0123456789abcdef0123456789abcdef.json", False),  # a flat envelope of an older version
    ],
)
def test_is_shelf_name(name: str, expected: bool) -> None:
    assert is_shelf_name(name) is expected


def test_every_shelf_a_process_makes_has_a_shelf_name(tmp_path: Path) -> None:
    assert all(is_shelf_name(Shelf(tmp_path).path.name) for _ in range(200))


def test_an_s_directory_that_is_no_shelf_name_is_never_adopted_searched_or_counted(tmp_path: Path) -> None:
    """Regression: any ``s-*`` directory with a free ``.lock`` was adopted (its envelopes run as ours), searched
    for held envelopes and counted, though only :func:`is_shelf_name` names a shelf."""
    paths = InboxPaths.from_root(make_root(tmp_path, {"moxie": {}}, name="mini")).ensure()
    evil = paths.taken_parent / "s-evil"
    evil.mkdir(mode=0o700)
    (evil / LOCK_NAME).touch(mode=0o600)  # its lock free, as a dead shelf's
    planted = _inbound("moxie", "planted")
    _write(evil / f"{planted['id']}.json", planted)
    dead = _dead_shelf(paths.taken_parent)  # a real dead shelf beside it is still adopted
    owed = _inbound("moxie", "owed")
    _write(dead / f"{owed['id']}.json", owed)
    ours = Shelf(paths.taken_parent)
    ours.open()
    try:
        adopted = ours.adopt()
    finally:
        ours.close(keep=True)
    assert adopted.ids == (owed["id"],)
    assert adopted.dead == (dead.name,) and "s-evil" not in adopted.alive
    assert sorted(os.listdir(evil)) == sorted([LOCK_NAME, f"{planted['id']}.json"])  # left where it was
    assert not find_on_shelves(paths.taken_parent, f"{planted['id']}.json")
    assert not find_on_shelves(paths.taken_parent, f"{planted['id']}.json", base=paths.relay.base)
    assert evil not in holding_places(paths.taken_parent, base=paths.relay.base)
    assert count_on_shelves(paths.taken_parent) == 1  # the adopted one, on our shelf


def test_a_restarted_gateway_runs_never_started_envelopes_once_and_answers_the_others_at_once(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini).ensure()
    dead = _dead_shelf(paths.taken_parent)
    never, midturn, finished, legacy = (_inbound("moxie", f"m{i}") for i in range(4))
    for env in (never, midturn, finished):
        _write(dead / f"{env['id']}.json", env)
    _write(paths.taken_parent / f"{legacy['id']}.json", legacy)  # taken by a version without shelves
    _write(paths.started / f"{midturn['id']}.json", {"id": midturn["id"], "at": int(time.time())})
    done = rp.make_reply(finished["id"], reply="the real answer", now=time.time())
    _write(paths.delivered / f"{finished['id']}.json", {**done, "reply_connection": "alpha"})
    # A living gateway's shelf (its flock is held) is never touched.
    alive = Shelf(paths.taken_parent)
    alive_dir = alive.open()
    other = _inbound("moxie", "someone else's")
    _write(alive_dir / f"{other['id']}.json", other)
    rec = RecordingRunner()
    try:
        start_gateway(gateways, mini, rec, connection_id="mini")
        await_condition(lambda: all(_delivered(mini, env["id"]) for env in (never, midturn, legacy)), timeout=10,
                        message="never-run replied, the others answered")
        assert [t.delivery_id for t in rec.entered] == [never["id"]]  # only the never-started one ran
        assert _delivered(mini, never["id"])["reply"] == "ok: m0"  # type: ignore[index]
        for env in (midturn, legacy):
            record = _delivered(mini, env["id"])
            assert record is not None and record["reply"] == "" and "may have been delivered" in record["error"]
            assert record["reply_connection"] == "alpha"
        assert _delivered(mini, finished["id"]) == {**done, "reply_connection": "alpha"}  # untouched
        assert not dead.exists()  # the dead shelf was emptied and removed
        assert not (paths.taken_parent / f"{legacy['id']}.json").exists()
        # every mark cleared once its reply was on disk: after it (reply, off the shelf, then the mark), so waited for
        await_condition(lambda: os.listdir(paths.started) == [], timeout=10, message="every start mark cleared")
        assert sorted(os.listdir(alive_dir)) == sorted([LOCK_NAME, f"{other['id']}.json"])
    finally:
        alive.close()


def test_a_relayed_in_turn_is_marked_started_before_it_runs_and_unmarked_once_replied(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    seen: list[bool] = []
    started_dir = mini / "bot_relay" / "started"

    def runner(turn: Any) -> str:
        seen.append((started_dir / f"{turn.delivery_id}.json").exists())
        return "fine"

    start_gateway(gateways, mini, runner, connection_id="mini")
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    post_to_inbox(InboxPaths.from_root(mini), env, "alpha")
    await_condition(lambda: _delivered(mini, env["id"]) is not None, timeout=10, message="the reply")
    assert seen == [True]
    # The mark is cleared right after the reply is written, in the same relay message: wait for it, not race it.
    await_condition(lambda: os.listdir(started_dir) == [], timeout=10, message="the start mark cleared")


def _gated_runner(release: threading.Event) -> RecordingRunner:
    """Replies ``ok: <body>`` once ``release`` is set (bounded: a stuck test fails, it never hangs)."""

    def behave(turn: Any) -> str:
        release.wait(30)
        return f"ok: {body_of(turn.content)}"

    return RecordingRunner(behave)


def test_a_relayed_in_dm_still_queued_at_stop_goes_back_to_the_inbox_and_the_next_start_runs_it_once(
    tmp_path: Path, gateways: list[Gateway], logs: LogCapture
) -> None:
    """Not answered ``cancelled`` (resend) but put back, unstarted, for the next taker: the sender gets the reply."""
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini)
    release = threading.Event()
    rec = _gated_runner(release)
    gw = start_gateway(gateways, mini, rec, connection_id="mini")
    running, queued = (seed_envelope(target_connection="mini", target_profile="moxie", message=m)
                       for m in ("running", "queued"))
    post_to_inbox(paths, running, "alpha")
    rec.wait_entered(1, timeout=10)
    post_to_inbox(paths, queued, "alpha")
    await_condition(lambda: gw.stats()["pending"] == 2, timeout=10, message="the second envelope queued")
    stopper = threading.Thread(target=gw.stop, kwargs={"timeout": 20})
    stopper.start()
    try:  # the stop cancels the queued one first, then waits for the running turn
        await_condition(lambda: (paths.inbox / f"{queued['id']}.json").exists(), timeout=10,
                        message="the unstarted envelope back in inbox/")
    finally:
        release.set()
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    assert _delivered(mini, running["id"])["reply"] == "ok: running"  # type: ignore[index]
    assert _delivered(mini, queued["id"]) is None  # not answered: its sender keeps waiting for the real reply
    assert [t.delivery_id for t in rec.entered] == [running["id"]]
    assert os.listdir(paths.started) == []
    assert os.listdir(paths.taken_parent) == []  # our shelf was emptied and removed
    # said without -v (a warning): the senders of these DMs wait until a gateway runs on this root again
    assert logs.matching("relay: 1 relayed-in envelope(s) never started and went back into inbox/")

    again = RecordingRunner()
    start_gateway(gateways, mini, again, connection_id="mini")
    await_condition(lambda: _delivered(mini, queued["id"]) is not None, timeout=10, message="the reply")
    record = _delivered(mini, queued["id"])
    assert record is not None and (record["reply"], record["error"]) == ("ok: queued", "")
    assert record["reply_connection"] == "alpha"
    assert [t.delivery_id for t in again.entered] == [queued["id"]]  # run once, by the next start only


def _relay_on(root: Path, dispatcher: Any, **kwargs: Any) -> Any:
    """A RelayActor on ``root`` (its directories made, as ``ActorSystem.start`` does) telling ``dispatcher``."""
    from actors import ManualScheduler
    from hermes_actors.core.config import BotModeConfig
    from hermes_actors.relay.relay_actor import RelayActor
    from hermes_actors.relay.strays import ensure_relay_directories

    ensure_relay_directories(InboxPaths.from_root(root))
    return RelayActor.start(root, config=BotModeConfig(), dispatcher=dispatcher, roster=None,
                            scheduler=ManualScheduler(), **kwargs)


def test_a_rescan_after_the_dispatcher_stopped_puts_what_it_takes_back_into_inbox_and_the_relay_lives(
    tmp_path: Path, logs: LogCapture, stop_all_actors: None
) -> None:
    """Regression (chaos run): a rescan queued behind a stop's backlog took an envelope from ``inbox/`` once the
    Dispatcher had stopped; its plain tell raised ActorDeadError and crashed the unsupervised RelayActor, which
    dropped every message behind (the stop's put-backs and the finished turns' replies). Now the envelope goes
    back to ``inbox/`` unstarted and the relay handles what follows."""
    from actors import Probe, Rescan, ask
    from hermes_actors.messages import ResumeRelay
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini)
    gone, _log = Probe.spawn()
    gone.stop()
    relay = _relay_on(mini, gone)
    envelopes = [_inbound("moxie", f"m{n}") for n in range(2)]
    for envelope in envelopes:
        post_to_inbox(paths, envelope, "alpha")
    relay.tell(Rescan("periodic"))
    assert ask(relay, ResumeRelay(), timeout=10) == ()  # answered after the rescan: the relay lived through it
    assert sorted(rf.list_ids(paths.inbox)) == sorted(e["id"] for e in envelopes)  # back, for the next taker
    assert rf.list_ids(paths.taken) == [] and os.listdir(paths.started) == []  # never started
    stats = relay.proxy().stats().get(timeout=10)
    assert (stats["drained"], stats["returned"]) == (0, 2)
    assert not logs.matching("crashed")
    relay.stop()
    assert logs.matching("relay: 2 relayed-in envelope(s) never started and went back into inbox/")


def test_a_reply_to_our_envelope_found_with_the_dispatcher_gone_is_left_to_the_next_start(
    tmp_path: Path, gateways: list[Gateway], logs: LogCapture, stop_all_actors: None
) -> None:
    """The sender side's report of a reply (``RelayedOutcome``) to a Dispatcher gone crashed the relay too; now
    the ``sent/`` record stays and the next start reports the reply."""
    from actors import Probe, ask
    from hermes_actors.messages import ResumeRelay

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    paths = InboxPaths.from_root(alpha).ensure()
    envelope_id = uuid.uuid4().hex
    record_sent(paths, envelope_id, "@moxie on mini", now=time.time(), sender="alice")
    rf.write_reply(paths.relay, rp.make_reply(envelope_id, reply="hi from moxie", now=time.time()))
    gone, _log = Probe.spawn()
    gone.stop()
    relay = _relay_on(alpha, gone)  # its start resumes the envelope and finds its reply
    assert ask(relay, ResumeRelay(), timeout=10) is not None  # the relay lived through its start
    relay.stop()
    assert not logs.matching("crashed")
    assert (paths.sent / f"{envelope_id}.json").exists()  # not forgotten: nobody got the outcome

    gw = start_gateway(gateways, alpha, RecordingRunner(), config={"bot_mode": {"wake_sender": False}})
    outcome = gw.wait_outcome(envelope_id, timeout=10)
    assert (outcome["status"], outcome["reply"]) == ("replied", "hi from moxie")


def test_a_stopping_relay_takes_nothing_more_from_its_inbox(tmp_path: Path, stop_all_actors: None) -> None:
    """Once the stop began (its flag set before the Dispatcher stops accepting) neither a file event nor a rescan
    takes an envelope: it stays in ``inbox/`` for the next taker (a chaos run saw 1358 taken only to be put
    back), and the Dispatcher is told nothing."""
    from actors import FileAppeared, Probe, Rescan, ask
    from hermes_actors.messages import RelayDeliver, ResumeRelay
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini)
    dispatcher, log = Probe.spawn()
    stopping = threading.Event()
    relay = _relay_on(mini, dispatcher, stopping=stopping)
    first = _inbound("moxie", "before")
    post_to_inbox(paths, first, "alpha")
    relay.tell(Rescan("periodic"))
    log.expect(RelayDeliver)  # taken while running
    stopping.set()
    later = _inbound("moxie", "after")
    path = post_to_inbox(paths, later, "alpha")
    relay.tell(FileAppeared(path))
    relay.tell(Rescan("periodic"))
    ask(relay, ResumeRelay(), timeout=10)  # after both
    assert rf.list_ids(paths.inbox) == [later["id"]]
    assert [m.envelope["id"] for m in log.records(RelayDeliver)] == [first["id"]]
    assert relay.proxy().stats().get(timeout=10)["drained"] == 1


def test_a_clean_stop_with_a_relayed_in_backlog_writes_every_finished_reply_and_puts_back_the_rest(
    tmp_path: Path, gateways: list[Gateway], logs: LogCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (chaos run): at a clean stop the relay, still working through a backlog, took an envelope
    from ``inbox/`` after the Dispatcher had stopped and crashed; the reply of a turn that finished during the
    stop and the put-back of the one it cancelled, queued behind, were dropped (the next start answered the
    finished one ``ambiguous``). The relay here is held in its take of an envelope ``late`` until the
    Dispatcher is gone, so everything the stop tells it queues behind that take, as in the chaos run."""
    from hermes_actors.relay.relay_actor import RelayActor
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini)
    running, queued, late = (_inbound("moxie", m) for m in ("running", "queued", "late"))
    held, go_on = threading.Event(), threading.Event()
    take = RelayActor._take

    def held_take(self: RelayActor, envelope_id: str) -> None:
        if envelope_id == late["id"] and not held.is_set():
            held.set()
            go_on.wait(30)  # bounded: a stuck test fails, it never hangs
        take(self, envelope_id)

    monkeypatch.setattr(RelayActor, "_take", held_take)
    release = threading.Event()
    rec = _gated_runner(release)
    gw = start_gateway(gateways, mini, rec, connection_id="mini")
    post_to_inbox(paths, running, "alpha")
    rec.wait_entered(1, timeout=10)
    post_to_inbox(paths, queued, "alpha")
    await_condition(lambda: gw.stats()["pending"] == 2, timeout=10, message="the second envelope queued")
    post_to_inbox(paths, late, "alpha")
    assert held.wait(10), "the relay took up the late envelope"
    assert gw._system is not None and gw._system.dispatcher is not None
    dispatcher = gw._system.dispatcher
    # the running turn finishes as the stop waits for it (the queued one was cancelled unrun just before)
    stopper = threading.Thread(target=gw.stop, kwargs={"timeout": 20, "on_wait": lambda turns, grace: release.set()})
    stopper.start()
    try:
        await_condition(lambda: not dispatcher.is_alive(), timeout=20, message="the Dispatcher stopped")
    finally:
        go_on.set()
        release.set()
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    record = _delivered(mini, running["id"])
    assert record is not None and record["reply"] == "ok: running"  # the finished turn's reply
    assert sorted(rf.list_ids(paths.inbox)) == sorted([queued["id"], late["id"]])  # both unstarted, back
    assert not logs.matching("crashed")
    assert _delivered(mini, queued["id"]) is None and _delivered(mini, late["id"]) is None
    assert os.listdir(paths.taken_parent) == [] and os.listdir(paths.started) == []
    assert [t.delivery_id for t in rec.entered] == [running["id"]]

    again = RecordingRunner()
    start_gateway(gateways, mini, again, connection_id="mini")
    await_condition(lambda: all(_delivered(mini, e["id"]) for e in (queued, late)), timeout=10, message="replies")
    assert sorted(t.delivery_id for t in again.entered) == sorted([queued["id"], late["id"]])  # each once
    assert _delivered(mini, running["id"]) == record


def _posted_oldest_first(count: int, message: str) -> list[dict[str, Any]]:
    """Relayed-in envelopes for moxie whose random ids sort in the reverse of their list order."""
    ids = sorted((uuid.uuid4().hex for _ in range(count)), reverse=True)
    return [_inbound("moxie", f"{message} {n}") | {"id": envelope_id} for n, envelope_id in enumerate(ids)]


@pytest.mark.parametrize("found_in", ["inbox", "a dead gateway's shelf"])
def test_envelopes_found_together_at_a_start_run_in_the_order_they_were_posted(
    tmp_path: Path, gateways: list[Gateway], found_in: str
) -> None:
    """A start takes ``inbox/`` (and re-runs what a killed gateway had taken) oldest first, not in the order
    of the random ids: a sender's DMs put back at a stop, posted while no gateway ran, or taken by a gateway
    killed -9, reach their target in the order they were sent."""
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini).ensure()  # as a hub finds it: no gateway ran on this root yet
    envelopes = _posted_oldest_first(4, "step")
    where = paths.inbox if found_in == "inbox" else _dead_shelf(paths.taken_parent)
    for n, envelope in enumerate(envelopes):  # posted oldest first: the id order is the reverse
        if found_in == "inbox":
            post_to_inbox(paths, envelope, "alpha")
        else:
            _write(where / f"{envelope['id']}.json", envelope)
        os.utime(where / f"{envelope['id']}.json", (1_700_000_000 + n, 1_700_000_000 + n))
    assert rf.list_ids(where, oldest_first=True) == [e["id"] for e in envelopes]
    assert rf.list_ids(where) == [e["id"] for e in reversed(envelopes)]
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini")
    await_condition(lambda: all(_delivered(mini, e["id"]) for e in envelopes), timeout=10, message="4 replies")
    assert [body_of(t.content) for t in rec.entered] == ["step 0", "step 1", "step 2", "step 3"]


def test_a_relayed_in_turn_that_started_and_ends_cancelled_during_the_stop_is_answered_not_put_back(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Only an unstarted envelope goes back: a turn that started (its start mark is on disk) and ends
    ``cancelled`` while the gateway stops (its process ended by the stop) may have reached its target."""
    from hermes_actors.store.relay_inbox import post_to_inbox

    release = threading.Event()

    def behave(turn: Any) -> str:
        release.wait(30)
        raise TurnFailed("@moxie's turn was ended because the gateway stopped", reason="cancelled")

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini)
    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, mini, rec, connection_id="mini")
    env = seed_envelope(target_connection="mini", target_profile="moxie", message="ends cancelled")
    post_to_inbox(paths, env, "alpha")
    rec.wait_entered(1, timeout=10)
    waited: list[int] = []

    def on_wait(turns: int, grace: float) -> None:  # the stop stopped accepting and now waits for the turn
        waited.append(turns)
        release.set()

    try:
        gw.stop(timeout=20, on_wait=on_wait)
    finally:
        release.set()
    assert waited == [1]
    record = _delivered(mini, env["id"])
    assert record is not None and record["reason"] == "cancelled" and "ended because the gateway stopped" in \
        record["error"]
    assert not (paths.inbox / f"{env['id']}.json").exists()
    assert len(rec.entered) == 1


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _our_shelf(paths: InboxPaths) -> Path:
    """The running gateway's shelf: the only one left once it adopted the dead ones."""
    [shelf] = [p for p in paths.taken_parent.iterdir() if p.name.startswith("s-")]
    return shelf


def test_housekeeping_never_sweeps_from_our_shelf_an_envelope_still_owed_its_turn_however_old(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (review): our shelf was swept by file age. With envelope expiry off, envelopes adopted after a
    long outage (or copied from another machine), older than 6 h by their mtime, were deleted by the first
    housekeeping, about 2 s after the start, while their turns were still owed: a kill then left the next start
    nothing to run or answer (and a start mark as old went too: the next start would have run the turn again)."""
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini).ensure()
    dead = _dead_shelf(paths.taken_parent)
    envelopes = [_inbound("moxie", m) for m in ("first", "second")]
    for env in envelopes:
        _write(dead / f"{env['id']}.json", env)
        _age(dead / f"{env['id']}.json", rp.STALE_AFTER_SECONDS + 3600)
    release = threading.Event()
    rec = _gated_runner(release)
    gw = start_gateway(gateways, mini, rec, {"bot_mode": {"envelope_ttl_seconds": 0}}, connection_id="mini")
    try:
        [turn] = rec.wait_entered(1, timeout=10)
        mark = paths.started / f"{turn.delivery_id}.json"
        _age(mark, rp.STALE_AFTER_SECONDS + 3600)  # a turn running for hours
        shelf = _our_shelf(paths)
        gw.housekeep()
        assert sorted(os.listdir(shelf)) == sorted([LOCK_NAME, *(f"{e['id']}.json" for e in envelopes)])
        assert mark.exists()
    finally:
        release.set()
    for env in envelopes:
        await_condition(lambda e=env: _delivered(mini, e["id"]) is not None, timeout=10, message="the reply")
        assert _delivered(mini, env["id"])["reply"] == f"ok: {env['message']}"  # type: ignore[index]
    await_condition(lambda: os.listdir(shelf) == [LOCK_NAME], timeout=10, message="our shelf emptied")
    # each start mark is cleared once its turn settled, which may come just after its envelope left the shelf
    await_condition(lambda: os.listdir(paths.started) == [], timeout=10, message="the start marks cleared")


def test_housekeeping_takes_a_settled_envelope_off_our_shelf_and_only_orphaned_start_marks(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """What is provably finished goes, whatever its age: an envelope whose reply is in delivered/ (its removal
    had failed) leaves our shelf with its start mark; a start mark whose envelope is on no shelf goes at 6 h."""
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini).ensure()
    gw = start_gateway(gateways, mini, connection_id="mini")
    shelf = _our_shelf(paths)
    settled, orphan, young = (_inbound("moxie", m) for m in ("settled", "orphan", "young"))
    _write(shelf / f"{settled['id']}.json", settled)
    done = rp.make_reply(settled["id"], reply="the answer", now=time.time())
    _write(paths.delivered / f"{settled['id']}.json", {**done, "reply_connection": "alpha"})
    for env in (settled, orphan, young):
        _write(paths.started / f"{env['id']}.json", {"id": env["id"], "at": int(time.time())})
    _age(paths.started / f"{orphan['id']}.json", rp.STALE_AFTER_SECONDS + 3600)  # its envelope left long ago
    gw.housekeep()  # (the first tick's may have run already: what it did is what is asserted)
    assert os.listdir(shelf) == [LOCK_NAME]
    assert os.listdir(paths.started) == [f"{young['id']}.json"]
    assert _delivered(mini, settled["id"]) == {**done, "reply_connection": "alpha"}  # the reply stays for the hub


def test_a_replied_envelope_leaves_the_shelf_before_its_start_mark_is_cleared(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill between the two steps must never leave an unmarked envelope on the shelf: once the hub has
    forwarded its reply, the next gateway would take it for never started and run the turn again."""
    from hermes_actors.relay import relay_actor
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    on_shelf_when_unmarked: list[bool] = []
    original = relay_actor.clear_started

    def clear_started(paths: InboxPaths, envelope_id: str) -> None:
        shelves = (mini / "bot_relay" / "taken").glob(f"s-*/{envelope_id}.json")
        on_shelf_when_unmarked.append(any(True for _ in shelves))
        original(paths, envelope_id)

    monkeypatch.setattr(relay_actor, "clear_started", clear_started)
    start_gateway(gateways, mini, lambda turn: "fine", connection_id="mini")
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    post_to_inbox(InboxPaths.from_root(mini), env, "alpha")
    await_condition(lambda: _delivered(mini, env["id"]) is not None and on_shelf_when_unmarked, timeout=10,
                    message="the reply, and its start mark cleared")
    assert on_shelf_when_unmarked == [False]


# ── item 2: the hub killed between its claim and the inbox post ─────────────


def test_a_hub_finishes_the_claims_a_killed_hub_left_and_never_posts_one_twice(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    source = InboxPaths.from_root(alpha).ensure()
    dead = _dead_shelf(source.hubclaims)
    unposted = seed_envelope(target_connection="mini", target_profile="moxie", message="not posted yet")
    posted = seed_envelope(target_connection="mini", target_profile="moxie", message="already answered")
    for env in (unposted, posted):
        _write(dead / f"{env['id']}.json", env)
    answered = rp.make_reply(posted["id"], reply="answered before the crash", now=time.time())
    rf.write_reply(source.relay, answered)  # the dead hub had posted it and forwarded the reply
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini")
    with hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: rf.read_reply(source.relay, unposted["id"]) is not None, timeout=15,
                        message="the unposted claim delivered and answered")
        await_condition(lambda: not dead.exists(), timeout=10, message="the dead shelf emptied")
    assert [t.delivery_id for t in rec.entered] == [unposted["id"]]
    assert rf.read_reply(source.relay, unposted["id"])["reply"] == "ok: not posted yet"  # type: ignore[index]
    assert rf.read_reply(source.relay, posted["id"]) == answered
    assert sorted(rf.list_ids(source.relay.claimed)) == sorted([unposted["id"], posted["id"]])


# ── item 3 and the done-when: a seed gateway's DMs on the same root ─────────


def test_a_seed_senders_envelopes_on_our_root_are_left_to_the_desktop_and_never_reach_our_subscribers(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    alpha = make_root(tmp_path, {"alice": {}, "bob": {}}, name="alpha",
                      config={"bot_mode": {"envelope_ttl_seconds": 60}})
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    outbox, replies = alpha / "bot_relay" / "outbox", alpha / "bot_relay" / "replies"
    # A seed gateway on this root queued two DMs from our local alice (the seed's way: mkstemp + replace):
    # one old enough to be past the TTL, one the Desktop already answered.
    stale = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time() - 3600)
    answered = seed_envelope(target_connection="mini", target_profile="moxie")
    for env in (stale, answered):
        seed_write_json(outbox / f"{env['id']}.json", env, prefix=".env-")
    seed_reply = rp.make_reply(answered["id"], reply="for the seed gateway", now=time.time())
    seed_write_json(replies / f"{answered['id']}.json", seed_reply)
    seen: list[dict[str, Any]] = []
    ours_seen = threading.Event()
    gw = Gateway(alpha, runner=RecordingRunner(), connection_id="alpha")
    gw.subscribe(lambda record: (seen.append(record), ours_seen.set()))
    gateways.append(gw.start())
    assert gw.stats()["relay"]["waiting"] == 0  # nothing of the seed's is waited for
    ours = send_dm(gw, "ours", target="bob")  # a flush: everything told at start was notified before it
    assert ours_seen.wait(10)
    gw.wait_outcome(ours, timeout=10)
    assert [r["delivery_id"] for r in seen] == [ours]
    assert sorted(rf.list_ids(outbox)) == sorted([stale["id"], answered["id"]])  # left for the Desktop
    assert rf.read_reply(RelayPaths.from_root(alpha), stale["id"]) is None  # we did not expire it
    assert rf.read_reply(RelayPaths.from_root(alpha), answered["id"]) == seed_reply


# ── item 7: a forged outbox flood ───────────────────────────────────────────


def test_a_forged_outbox_flood_is_not_resumed_and_is_counted_in_one_log_line(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    outbox = alpha / "bot_relay" / "outbox"
    outbox.mkdir(parents=True, mode=0o700)
    for _ in range(20_000):
        env = seed_envelope(target_connection="mini", target_profile="moxie")
        _write(outbox / f"{env['id']}.json", env)
    bad_sent = alpha / "bot_relay" / "sent"
    bad_sent.mkdir(mode=0o700)
    forged_record = uuid.uuid4().hex
    _write(bad_sent / f"{forged_record}.json", {"id": "not-this-one", "at": 1, "label": "x"})
    with LogCapture("INFO") as logs:
        gw = start_gateway(gateways, alpha, connection_id="alpha")
        relay = gw.stats()["relay"]
    assert relay["waiting"] == 0
    lines = [line for line in logs.lines if "in outbox/ that this root did not record as sent" in line]
    assert len(lines) == 1 and "left 20000 in outbox/" in lines[0] and "quarantined 1 bad sent" in lines[0], lines
    assert len(rf.list_ids(outbox)) == 20_000  # left alone: a Desktop or hub deals with them
    assert not (bad_sent / f"{forged_record}.json").exists()


def test_our_own_envelopes_are_resumed_from_the_sent_record_after_a_restart(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    with Gateway(alpha, runner=RecordingRunner(), connection_id="alpha") as gw:
        sent = gw.message_agent(sender="alice", target="moxie", message="still waiting?")["delivery_id"]
    gw = start_gateway(gateways, alpha, connection_id="alpha")
    assert gw.stats()["relay"]["waiting"] == 1
    rf.write_reply(RelayPaths.from_root(alpha), rp.make_reply(sent, reply="late but here", now=time.time()))
    assert gw.wait_outcome(sent, timeout=10)["reply"] == "late but here"
    await_condition(lambda: not (alpha / "bot_relay" / "sent" / f"{sent}.json").exists(), timeout=10,
                    message="the sent record dropped once reported")


def test_a_start_leaves_a_living_senders_staged_envelope_to_it_and_takes_back_a_dead_ones(tmp_path: Path) -> None:
    """A start scanning sent/ while a living sender on the root is between a DM's sent/ record and the rename
    into outbox/: the staged envelope's lock is held, so the start leaves it to its sender (neither never
    queued nor waited for: ``live``) and the send queues it. One staged by a sender that died (no lock) is
    taken back (never queued) under the start's lock: a second start meanwhile leaves it to the first, and
    once the first died too the next start still knows. A record whose envelope was queued, or staged by an
    older version under a random name, is waited for as before (nothing proves it never left)."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    paths = InboxPaths.from_root(alpha).ensure()
    living = seed_envelope(target_connection="mini", target_profile="moxie")
    scans: list[SentScan] = []

    def record_then_a_start_scans() -> None:
        record_sent(paths, living["id"], "@moxie on mini", now=time.time())
        scans.append(scan_sent(paths))  # what a gateway starting at this moment sees

    rf.enqueue_envelope(paths.relay, living, staged_as=queueing_name(living["id"]),
                        before_queued=record_then_a_start_scans)
    ((scan),) = scans
    assert (scan.never_queued, scan.ours, scan.live, scan.withdrawn) == ([], [], 1, {})
    assert rf.list_ids(paths.relay.outbox) == [living["id"]]  # queued by its living sender
    assert not (paths.relay.tmp / queueing_name(living["id"])).exists()

    dead = uuid.uuid4().hex  # a sender killed -9 after the record: its staged file is there, nobody's lock
    (paths.relay.tmp / queueing_name(dead)).write_text("{}")
    record_sent(paths, dead, "@moxie on mini", now=time.time())
    first = scan_sent(paths)
    assert [r.envelope_id for r in first.never_queued] == [dead] and list(first.withdrawn) == [dead]
    assert not (paths.relay.tmp / queueing_name(dead)).exists()
    second = scan_sent(paths)  # the first start lives and reports it: not the second one's
    assert second.never_queued == [] and dead not in {r.envelope_id for r in second.ours} and second.live == 1
    os.close(first.withdrawn[dead])  # the first start died before its outcome was journaled
    third = scan_sent(paths)
    assert [r.envelope_id for r in third.never_queued] == [dead]
    clear_sent(paths, dead)  # its outcome journaled: forgotten, as Outbound.forget does
    drop_withdrawn(paths, dead, third.withdrawn[dead])
    assert list(paths.relay.tmp.iterdir()) == []

    older = uuid.uuid4().hex  # an older version's record: its envelope staged under a random name, if at all
    record_sent(paths, older, "@moxie on mini", now=time.time())
    (paths.relay.tmp / f".{older}.json.0123456789abcdef.tmp").write_text("{}")
    scan = scan_sent(paths)
    assert sorted(r.envelope_id for r in scan.ours) == sorted([living["id"], older])
    assert scan.never_queued == [] and scan.live == 0


def _scan_at_once(starts: list[InboxPaths]) -> list[SentScan]:
    """Each start's sent/ scan, in a thread of its own, all let go at once by a barrier."""
    barrier = threading.Barrier(len(starts))
    scans: dict[int, SentScan] = {}

    def scan(n: int) -> None:
        barrier.wait(10)
        scans[n] = scan_sent(starts[n])

    threads = [threading.Thread(target=scan, args=(n,)) for n in range(len(starts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return [scans[n] for n in range(len(starts))]


@pytest.mark.parametrize("writer", ["killed", "stopped"])
def test_two_starts_racing_over_a_dead_writers_records_resume_each_exactly_once(tmp_path: Path, writer: str) -> None:
    """Two gateways start on the root at the same moment after the writer of some queued DMs died (killed -9: its
    shelf is there, its lock free; or stopped cleanly: its shelf is gone). Each record is resumed by exactly one
    of them: whoever holds the dead writer's shelf lock (made again when gone) rewrites its records to name its
    own shelf, and the other then finds them held by a living gateway. Before, both resumed every record:
    each reply was reported twice and its sender woken twice."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    base = InboxPaths.from_root(alpha).ensure()
    for round_ in range(5):  # a few rounds: the two scans meet at different points of each other's adoption
        dead = _dead_shelf(base.taken_parent)
        if writer == "stopped":
            (dead / LOCK_NAME).unlink()
            dead.rmdir()
        ids = []
        for n in range(20):
            envelope = seed_envelope(target_connection="mini", target_profile="moxie", message=f"{round_}.{n}")
            record_sent(base, envelope["id"], "@moxie on mini", now=time.time(), sender="alice", owner=dead.name)
            rf.enqueue_envelope(base.relay, envelope)
            ids.append(envelope["id"])
        shelves = [Shelf(base.taken_parent), Shelf(base.taken_parent)]
        starts = [base.on_shelf(shelf.open()) for shelf in shelves]
        scans = _scan_at_once(starts)
        resumed = [[record.envelope_id for record in scans[n].ours] for n in range(2)]
        assert sorted(resumed[0] + resumed[1]) == sorted(ids)  # each one by exactly one start
        assert sorted(map(len, resumed)) == [0, len(ids)] and sorted(scans[n].others for n in range(2)) == [0, 20]
        (winner,) = [starts[n].taken.name for n in range(2) if resumed[n]]
        owners = {json.loads((base.sent / f"{envelope_id}.json").read_text())["owner"] for envelope_id in ids}
        assert owners == {winner}  # any later start sees a living owner: the winner
        assert not dead.exists()  # the adopter's lock went with the shelf it made again (or emptied)
        for shelf in shelves:  # both stop: the next round's records are a new dead writer's
            shelf.close()
        for envelope_id in ids:
            clear_sent(base, envelope_id)


def test_a_lock_file_its_owner_replaced_before_letting_go_is_not_taken(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """take_unowned checks, once it holds the lock, that the path still names the file it locked: an owner
    that renamed its file away (a staged envelope queued) or replaced it just before letting go leaves a lock
    that proves nothing about the path. A free lock on the file still there is taken."""
    path = tmp_path / "staged"
    path.write_text("{}")
    real_flock = owner_lock.fcntl.flock

    def owner_finishes_first(fd: int, operation: int) -> None:  # the owner's last step, then its lock is free
        os.replace(tmp_path / "new", path)
        real_flock(fd, operation)

    (tmp_path / "new").write_text("{}")
    monkeypatch.setattr(owner_lock.fcntl, "flock", owner_finishes_first)
    assert owner_lock.take_unowned(path) is None
    monkeypatch.undo()
    lock = owner_lock.take_unowned(path)
    assert lock is not None
    assert owner_lock.take_unowned(path) is None  # held now: a living owner's
    owner_lock.release(lock)
    os.unlink(path)
    with pytest.raises(FileNotFoundError):
        owner_lock.take_unowned(path)


# ── item 4: seed timestamps ─────────────────────────────────────────────────


@pytest.mark.parametrize("created", ["missing", None, 0])
@pytest.mark.parametrize(("mtime_age", "expected"), [(5000, Expired), (0, ToDeliver)])
def test_an_envelope_without_created_at_is_aged_from_its_file_mtime_like_the_seed(
    tmp_path: Path, created: Any, mtime_age: float, expected: type
) -> None:
    paths = InboxPaths.from_root(tmp_path).ensure()
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    if created == "missing":
        del env["created_at"]
    else:
        env["created_at"] = created
    path = paths.relay.outbox / f"{env['id']}.json"
    _write(path, env)
    then = time.time() - mtime_age
    os.utime(path, (then, then))
    result = drain_envelope(paths, "outbox", env["id"], ttl=900, now=time.time())
    assert isinstance(result, expected), result
    assert not isinstance(result, Quarantined)


def test_a_fractional_ttl_is_applied_as_the_seed_applies_it() -> None:
    assert rp.seed_ttl(0.5) == 0  # 0.5 disables expiry, as in the seed
    assert rp.seed_ttl(900.7) == 900


def test_a_half_second_ttl_never_expires_an_envelope_like_the_seed(tmp_path: Path) -> None:
    paths = InboxPaths.from_root(tmp_path).ensure()
    env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time() - 5000)
    _write(paths.relay.outbox / f"{env['id']}.json", env)
    assert isinstance(drain_envelope(paths, "outbox", env["id"], ttl=0.5, now=time.time()), ToDeliver)


# ── item 6: relay directories swapped for symlinks at runtime ───────────────


def test_take_from_inbox_refuses_an_inbox_swapped_for_a_symlink(tmp_path: Path) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    env = _inbound("moxie")
    _write(outside / f"{env['id']}.json", env)
    paths.inbox.rmdir()
    paths.inbox.symlink_to(outside)
    with pytest.raises(HostileFileError, match="symlink"):
        take_from_inbox(paths, env["id"])
    assert (outside / f"{env['id']}.json").exists()
    assert os.listdir(paths.taken) == []


def test_claim_envelope_refuses_an_outbox_swapped_for_a_symlink(tmp_path: Path) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    _write(outside / f"{env['id']}.json", env)
    paths.relay.outbox.rmdir()
    paths.relay.outbox.symlink_to(outside)
    with pytest.raises(HostileFileError, match="symlink"):
        rf.claim_envelope(paths.relay, env["id"])
    assert (outside / f"{env['id']}.json").exists()


def _gateway_and_outside(tmp_path: Path, gateways: list[Gateway]) -> tuple[Path, RecordingRunner, InboxPaths, Path]:
    """A running 'mini' gateway (fast rescans) and a directory outside its root to swap a symlink to."""
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini", config={"bot_mode": {"rescan_seconds": 0.2}})
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    return mini, rec, InboxPaths.from_root(mini), outside


def _a_real_directory(path: Path) -> bool:
    """Whether ``path`` is a directory itself, not a symlink to one, in ONE ``lstat``.

    ``is_dir() and not is_symlink()`` is two looks: the first can see the symlink (followed)
    and the second nothing at all, in the moment between the relay moving the symlink
    aside and putting a real directory back — a wait on it could end with no directory.
    """
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def test_a_running_gateway_never_follows_an_inbox_swapped_for_a_symlink(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    mini, rec, paths, outside = _gateway_and_outside(tmp_path, gateways)
    planted = _inbound("moxie", "from outside the root")
    _write(outside / f"{planted['id']}.json", planted)
    paths.inbox.rmdir()
    paths.inbox.symlink_to(outside)
    # A rescan takes from inbox/ first, then puts a real directory back: once it is back, the take was refused.
    await_condition(lambda: _a_real_directory(paths.inbox), timeout=15,
                    message="inbox/ restored as a real directory")
    assert rec.entered == []
    assert (outside / f"{planted['id']}.json").exists()
    # The relay keeps working.
    from hermes_actors.store.relay_inbox import post_to_inbox

    fresh = seed_envelope(target_connection="mini", target_profile="moxie", message="legit")
    post_to_inbox(paths, fresh, "alpha")
    await_condition(lambda: _delivered(mini, fresh["id"]) is not None, timeout=10, message="the legit one replied")
    assert [t.delivery_id for t in rec.entered] == [fresh["id"]]


def test_a_temp_directory_swapped_for_a_symlink_is_never_written_through_and_is_put_back(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    mini, rec, paths, outside = _gateway_and_outside(tmp_path, gateways)
    paths.relay.tmp.rmdir()
    paths.relay.tmp.symlink_to(outside)
    await_condition(lambda: _a_real_directory(paths.relay.tmp), timeout=15,
                    message="the temp directory restored as a real directory")
    assert list(outside.iterdir()) == [], "no temp file was written through the symlink"
    from hermes_actors.store.relay_inbox import post_to_inbox

    fresh = seed_envelope(target_connection="mini", target_profile="moxie", message="legit")
    post_to_inbox(paths, fresh, "alpha")
    await_condition(lambda: _delivered(mini, fresh["id"]) is not None, timeout=10, message="the legit one replied")
    assert [t.delivery_id for t in rec.entered] == [fresh["id"]]
    assert list(outside.iterdir()) == []


def test_starting_a_gateway_makes_no_watchdog_warning(tmp_path: Path) -> None:
    """The relay's directories and shelf exist before the recursive watch starts (the demo's stray stderr line)."""
    import warnings

    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # each start makes a new shelf under taken/
            with Gateway(root, runner=RecordingRunner(), durable=False) as gw:
                assert gw.wait_outcome(send_dm(gw, "hi"), timeout=20)["status"] == "replied"
    assert [str(w.message)[:120] for w in caught if issubclass(w.category, RuntimeWarning)] == []


@pytest.mark.parametrize("delivered_written", [False, True], ids=["kill-before-delivered", "kill-after-delivered"])
def test_a_relayed_outcome_journaled_before_a_kill_is_neither_published_nor_woken_twice_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delivered_written: bool
) -> None:
    """A kill after the journal took a relayed DM's outcome (and its sender's wake) but before the relay cleared
    its ``sent/`` record: the restarted relay settles it again from its files. Before, the journal's re-publish
    came on top of it (the subscribers saw it twice in one run), and the waker, which learnt the journaled
    wakes only at recovery, after the relay, woke the sender a second time with the same reply."""
    from collections import Counter

    from hermes_actors.relay import outbound
    from hermes_actors.store import journal as journal_module

    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    config = {"bot_mode": {"wake_sender": True}}
    monkeypatch.setattr(outbound, "clear_sent", lambda *a, **k: None)  # the relay's record and reply stay
    monkeypatch.setattr(outbound, "mark_consumed", lambda *a, **k: None)
    if not delivered_written:  # the journal holds the outcome and the wake, not that the sender has the outcome
        together = journal_module.Journal.append_together

        def without_delivered(self: journal_module.Journal, records: list[dict[str, Any]], **kwargs: Any) -> Any:
            return together(self, [r for r in records if r.get("t") != "delivered"], **kwargs)

        monkeypatch.setattr(journal_module.Journal, "append_together", without_delivered)
    woken = RecordingRunner()
    with Gateway(root, runner=woken, config=config, connection_id="alpha", durable=True) as first:
        key = first.message_agent(sender="alice", target="moxie", message="ping")["delivery_id"]
        rf.write_reply(InboxPaths.from_root(root).relay, rp.make_reply(key, reply="pong", now=time.time()))
        assert first.wait_outcome(key, timeout=10)["reply"] == "pong"
        await_condition(lambda: len(woken.entered) == 1, timeout=10, message="alice woken once")
    monkeypatch.undo()
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    seen: Counter[str] = Counter()
    runner = RecordingRunner()
    again = Gateway(root, runner=runner, config=config, connection_id="alpha", durable=True)
    again.subscribe(lambda outcome: seen.update([outcome["delivery_id"]]))
    again.start()
    assert again.wait_outcome(key, timeout=10)["reply"] == "pong"
    sent_wakes = again.stats().get("wakes_sent")  # counted when a wake is queued: no race with its turn
    again.stop()  # flushes every notification
    assert seen[key] == (0 if delivered_written else 1), seen  # re-published at most once, never twice
    assert sent_wakes == 0 and runner.entered == [], "alice was woken again with the same reply"


def test_the_relay_keeps_its_record_until_the_journal_has_the_outcome_and_the_wake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the relay cleared its ``sent/`` record as soon as it told the Dispatcher, before the journal
    had the outcome; a kill in between lost the DM for good (wait_outcome: unknown id; Redis: the reply entry
    XDEL'd) and its sender's wake. The journal has no ``accepted`` record of a relayed DM, so a restart that
    re-publishes its outcome from the journal alone wakes nobody: the relay keeps its record until the journal
    has the outcome and then the wake (in one batch with the DM's ``delivered`` record), and only then forgets
    the envelope."""
    from hermes_actors.store import journal as journal_module

    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    paths = InboxPaths.from_root(root)
    held, release = threading.Event(), threading.Event()
    write_now = journal_module.Journal._write_now

    def slow_commit(self: Any, lines: list[bytes], **kwargs: Any) -> None:
        if any(b'"t":"delivered"' in line for line in lines) and not release.is_set():
            held.set()  # the commit that says the sender has the outcome waits for the test
            release.wait(30)
        write_now(self, lines, **kwargs)

    monkeypatch.setattr(journal_module.Journal, "_write_now", slow_commit)
    woken = RecordingRunner()
    with Gateway(root, runner=woken, config={"bot_mode": {"wake_sender": True}}, connection_id="alpha",
                 durable=True) as gw:
        key = gw.message_agent(sender="alice", target="moxie", message="ping")["delivery_id"]
        sent = paths.relay.id_file(paths.sent, key)
        assert sent.exists()
        rf.write_reply(paths.relay, rp.make_reply(key, reply="pong", now=time.time()))
        assert gw.wait_outcome(key, timeout=10)["reply"] == "pong"
        assert held.wait(10)
        assert sent.exists(), "the relay forgot its envelope before the journal had its outcome"
        release.set()
        await_condition(lambda: not sent.exists(), timeout=10, message="the record cleared once journaled")
        await_condition(lambda: len(woken.entered) == 1, timeout=10, message="alice woken once")
    records = [json.loads(line) for f in sorted((root / "bot_relay" / "journal").glob("*"))
               for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    wake_at = next(i for i, r in enumerate(records)
                   if r.get("t") == "accepted" and (r.get("d") or {}).get("origin") == "wake")
    finished_at = next(i for i, r in enumerate(records) if r.get("t") == "finished" and r.get("id") == key)
    assert finished_at < wake_at, "the outcome is on disk before it is published (and wakes the sender)"
    assert records[wake_at + 1] == {"t": "delivered", "id": key}, "the wake and delivered records: one batch"


def test_an_envelope_posted_again_after_the_restart_gets_its_first_reply_and_runs_no_turn(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """The journal's rule for every relayed-in DM, not only the Desktop's ``relay_deliver``: an envelope the hub
    posts to ``inbox/`` again once its reply was forwarded (and ``delivered/`` emptied) reaches a restarted
    gateway, which answers it from the journal. Before, that gateway ran its turn a second time."""
    from hermes_actors.store.relay_inbox import post_to_inbox

    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini)
    rec = RecordingRunner(lambda turn: f"answer {len(rec.entered)}")
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    gw = start_gateway(gateways, mini, rec, connection_id="mini")
    post_to_inbox(paths, env, "alpha")
    await_condition(lambda: _delivered(mini, env["id"]) is not None, timeout=10, message="the reply")
    first = _delivered(mini, env["id"])
    gw.stop(timeout=10)
    (paths.delivered / f"{env['id']}.json").unlink()  # the hub forwarded it

    start_gateway(gateways, mini, rec, connection_id="mini")
    post_to_inbox(paths, env, "alpha")
    await_condition(lambda: _delivered(mini, env["id"]) is not None, timeout=10, message="the reply again")
    again = _delivered(mini, env["id"])
    assert first is not None and again is not None
    assert (again["reply"], again["error"], again["reason"]) == (first["reply"], first["error"], first["reason"])
    assert first["reply"] == "answer 1"
    assert [t.delivery_id for t in rec.entered] == [env["id"]]


def test_an_envelope_that_may_have_run_is_answered_ambiguous_at_once_when_the_dispatcher_is_gone(
    tmp_path: Path,
) -> None:
    """Regression (diff review of the journal's answer to a restart's started envelopes): a started envelope adopted
    at a running gateway's rescan goes to the Dispatcher to be answered with its journaled outcome; with the
    Dispatcher gone, it stayed on our shelf unanswered until the next start (the put-back refuses a started one),
    where it had been answered ``ambiguous`` at once before. Now it is answered so, never run, its shelf file and
    start mark cleared."""
    mini = make_root(tmp_path, {"moxie": {}}, name="mini", config={"bot_mode": {"rescan_seconds": 0.1}})
    rec = RecordingRunner()
    taken = mini / "bot_relay" / "taken"
    started = mini / "bot_relay" / "started"
    with Gateway(mini, runner=rec, connection_id="mini") as gw:
        system = gw._system
        assert system is not None and system.dispatcher is not None
        system.dispatcher.stop(block=True)
        env = _inbound("moxie", "m0")
        dead = _dead_shelf(taken)
        started.mkdir(exist_ok=True, mode=0o700)
        _write(started / f"{env['id']}.json", {"id": env["id"], "at": int(time.time())})
        _write(dead / f"{env['id']}.json", env)
        await_condition(lambda: _delivered(mini, env["id"]) is not None, timeout=30,
                        message="the adopted started envelope is answered by the running gateway")
        await_condition(lambda: not (started / f"{env['id']}.json").exists(), timeout=30,
                        message="its start mark is cleared once the answer is on disk")
    reply = _delivered(mini, env["id"])
    assert reply is not None and "do not resend" in reply["error"], reply
    assert rec.entered == []
    assert list(taken.rglob(f"{env['id']}.json")) == []
