"""The file relay through the Gateway: seed interop, events vs rescans, liveness, TTL, budgets.

Two roots stand for two connections: ``alpha`` (the sender here) and ``mini``
(the target, a root whose gateway serves ``inbox/``). A hub in a thread plays
the Desktop where a test needs the whole path.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pykka
import pytest
from crash_procs import run_child, turns_logged
from relay_helpers import hub_thread, remote_row, seed_envelope, seed_write_json, write_roster_file
from relay_procs import children
from roots import LogCapture, RecordingRunner, body_of, make_root, rescan, start_gateway

from actors import FileAppeared
from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.core.hops import MAX_HOP
from hermes_actors.local import admission as admission_module
from hermes_actors.local import roster as roster_module
from hermes_actors.local.admission import CallerAdmission
from hermes_actors.local.roster import make_snapshot
from hermes_actors.local.sending import fresh_remote_roster
from hermes_actors.messages import SendRequest, Turn
from hermes_actors.ops.journal_view import find_outcome
from hermes_actors.relay import outbound as outbound_module
from hermes_actors.relay.relay_actor import RelayActor
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.hermes_root import discover_profiles
from hermes_actors.store.relay_files import read_roster_version
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_sent import claim_for_expiry
from hermes_actors.store.relay_shelf import find_on_shelves
from hermes_actors.store.turnlock import turn_lock_path

REPLY_KEYS = {"id", "at", "reply", "error", "reason"}
SEED_ENVELOPE_KEYS = {
    "id", "created_at", "from_profile", "from_handle", "target_connection", "target_profile", "target_handle",
    "message",
}
OFFLINE_TAIL = (
    "is offline right now — the message was NOT queued. Try again once that machine reconnects to the Desktop."
)


def start(gateways: list[Gateway], root: Path, runner: Any = None, *, config: dict[str, Any] | None = None,
          connection_id: str | None = "alpha") -> Gateway:
    return start_gateway(gateways, root, runner, config, connection_id=connection_id)


def beside(gateways: list[Gateway], root: Path, config: dict[str, Any]
           ) -> tuple[Gateway, RecordingRunner, list[dict[str, Any]]]:
    """A second gateway B on ``root`` (connection alpha), subscribed before its start so nothing it publishes is
    missed; its relay's start (the sent/ scan) has run when this returns. Returns B, its runner, what it published."""
    runner = RecordingRunner()
    b = Gateway(root, runner=runner, config=config, connection_id="alpha")
    gateways.append(b)
    seen: list[dict[str, Any]] = []
    b.subscribe(seen.append)
    b.start()
    return b, runner, seen


def relay(root: Path) -> Path:
    return root / "bot_relay"


def outbox_ids(root: Path) -> list[str]:
    return rf.list_ids(relay(root) / "outbox")


def sender_root(tmp_path: Path, rows: list[dict[str, Any]] | None = None) -> Path:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, rows if rows is not None else [remote_row("moxie", "mini", online=True)])
    return root


def queued(ack: dict[str, Any]) -> str:
    assert ack.get("status") == "queued", ack
    return str(ack["delivery_id"])


def reply_record(envelope_id: str, reply: str = "", error: str = "", reason: str = "") -> dict[str, Any]:
    return {"id": envelope_id, "at": int(time.time()), "reply": reply, "error": error, "reason": reason}


def test_a_dm_whose_hop_no_target_would_accept_is_refused_not_queued(tmp_path: Path,
                                                                     gateways: list[Gateway]) -> None:
    """A target drops an envelope past MAX_HOP unanswered (``parse_envelope``, the rule of both transports), so
    the sender refuses hop 1001 at once (``loop_guard``) and queues nothing, even with ``max_hops`` at its most
    (MAX_HOP: the config takes no deeper limit); hop 1000 is relayed."""
    gw = start(gateways, sender_root(tmp_path), config={"bot_mode": {"max_hops": MAX_HOP}})
    refused = gw.message_agent(sender="alice", target="moxie", message="deep", hop=1001)
    assert refused["reason"] == "loop_guard" and "NOT sent" in refused["error"], refused
    assert outbox_ids(tmp_path / "alpha") == []
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="ok", hop=1000))
    assert outbox_ids(tmp_path / "alpha") == [envelope_id]


def test_a_reply_that_lands_before_the_send_returns_still_settles_the_dm(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay answered faster than our own thread: the reply is there before the send handler returns.

    The outcome must still reach ``wait_outcome``: the relay reports it only after the send's ack was told
    (before the fix the outcome was settled first, the ack then booked the id as pending again, and
    ``wait_outcome`` waited forever).
    """
    root = sender_root(tmp_path)
    gw = start(gateways, root)
    real_enqueue = rf.enqueue_envelope

    def enqueue_and_answer_at_once(paths: RelayPaths, envelope: dict[str, Any], **how: Any) -> Path:
        queued_at = real_enqueue(paths, envelope, **how)
        rf.write_reply(paths, reply_record(envelope["id"], reply="faster than you"))
        return queued_at

    monkeypatch.setattr(rf, "enqueue_envelope", enqueue_and_answer_at_once)
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="quick"))
    assert gw.wait_outcome(envelope_id, timeout=10)["reply"] == "faster than you"


# ── 1. seed interop and event-driven replies ────────────────────────────────


def test_seed_written_envelope_is_drained_delivered_and_answered_in_seed_format(tmp_path: Path) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {"title": "Builder"}}, name="mini")
    rec = RecordingRunner(lambda turn: f"moxie here, got: {turn.content}")
    with Gateway(mini, runner=rec, connection_id="mini"), hub_thread({"alpha": alpha, "mini": mini}):
        await_condition((relay(alpha) / "roster.json").exists, timeout=10, message="the hub pushed a roster")
        env = seed_envelope(target_connection="mini", target_profile="moxie", message="status of the build?")
        seed_write_json(relay(alpha) / "outbox" / f"{env['id']}.json", env, prefix=".env-")
        reply_path = relay(alpha) / "replies" / f"{env['id']}.json"
        await_condition(reply_path.exists, timeout=10, message="the reply file landed in alpha/replies")

    turns = rec.entered
    assert [t.delivery_id for t in turns] == [env["id"]]
    assert turns[0].profile == "moxie" and turns[0].content == "status of the build?"
    # relayed from another machine: the author id names the sender's connection, not this install's own alice
    assert turns[0].author == {"id": "bot:alpha/alice", "name": "alice", "is_bot": True}
    reply = json.loads(reply_path.read_text(encoding="utf-8"))
    assert set(reply) == REPLY_KEYS  # exactly the seed's keys: no reply_connection leaks through
    assert reply["id"] == env["id"] and isinstance(reply["at"], int)
    assert reply["reply"] == "moxie here, got: status of the build?"
    assert reply["error"] == "" and reply["reason"] == ""
    assert stat.S_IMODE(reply_path.stat().st_mode) == 0o600
    assert (relay(alpha) / "claimed" / f"{env['id']}.json").exists()
    assert outbox_ids(alpha) == []


def test_a_reply_written_by_another_process_resolves_the_outcome_without_polling(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"rescan_seconds": 300}})
    ack = gw.message_agent(sender="alice", target="moxie", message="ping")
    envelope_id = queued(ack)
    assert ack["to"] == "@moxie on mini"
    env = json.loads((relay(root) / "outbox" / f"{envelope_id}.json").read_text(encoding="utf-8"))
    assert set(env) >= SEED_ENVELOPE_KEYS
    assert env["target_connection"] == "mini" and env["target_profile"] == "moxie" and env["from_profile"] == "alice"
    assert body_of(env["message"]) == "ping"

    seed_write_json(relay(root) / "replies" / f"{envelope_id}.json", reply_record(envelope_id, reply="pong"))
    # The periodic rescan is 300 s away: only the file event can settle it within wait_outcome's 20 s (which
    # raises TimeoutError otherwise).
    out = gw.wait_outcome(envelope_id, timeout=20)
    assert out["status"] == "replied" and out["reply"] == "pong"
    assert out["text"] == "Reply from @moxie on mini: pong"


def test_a_reply_file_that_starts_with_a_byte_order_mark_is_read_like_the_seed_reads_it(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: a peer's reply written as utf-8-sig (the seed's waiter reads it so) was quarantined as
    invalid JSON, and the sender, whose DM had run, got delivery_timeout instead of the reply."""
    root = sender_root(tmp_path)
    gw = start(gateways, root)
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="ping"))
    seed_write_json(relay(root) / "replies" / f"{envelope_id}.json", reply_record(envelope_id, reply="pong"),
                    encoding="utf-8-sig")
    assert (relay(root) / "replies" / f"{envelope_id}.json").read_bytes().startswith(b"\xef\xbb\xbf")
    assert gw.wait_outcome(envelope_id, timeout=10)["reply"] == "pong"
    assert not list((relay(root) / "quarantine").glob("*"))


@pytest.mark.parametrize(
    ("body", "status", "reply"),
    [
        (lambda i: {"id": i, "at": "2026-12-06T22:00:00Z", "reply": "ok", "error": "", "reason": ""}, "replied", "ok"),
        (lambda i: {"id": i, "at": 1, "reply": 42, "error": "", "reason": ""}, "replied", "42"),
        (lambda i: {"at": 1, "reply": "ok", "error": "", "reason": ""}, "replied", "ok"),
    ],
    ids=["at-string", "reply-number", "no-id-in-body"],
)
def test_a_reply_file_the_seeds_waiter_reads_reaches_the_sender(
    body: Any, status: str, reply: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (seed interop): a Desktop's reply whose ``at`` is a string, whose ``reply`` is a number, or whose
    body has no ``id`` (its file is ``<id>.json``) is read by the seed's waiter, which looks only at ``error``,
    ``reason`` and ``reply``; ours quarantined it and the sender got ``delivery_timeout`` instead of the reply."""
    root = sender_root(tmp_path)
    gw = start(gateways, root)
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="ping"))
    seed_write_json(relay(root) / "replies" / f"{envelope_id}.json", body(envelope_id))
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reply"]) == (status, reply)
    assert not list((relay(root) / "quarantine").glob("*"))


# ── 2. dropped events: the rescan is the truth ──────────────────────────────


def test_with_events_dropped_the_rescan_delivers_every_reply_and_inbox_envelope(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = sender_root(tmp_path)
    rec = RecordingRunner(lambda turn: f"ok {turn.delivery_id}")
    gw = start(gateways, root, rec, config={"bot_mode": {"rescan_seconds": 0.2}})
    assert gw._bridge is not None
    gw._bridge.paused = True  # every watchdog event is now dropped, as an overflowing inotify would

    sent = [queued(gw.message_agent(sender="alice", target="moxie", message=f"q{i}")) for i in range(5)]
    for i, envelope_id in enumerate(sent):
        seed_write_json(relay(root) / "replies" / f"{envelope_id}.json", reply_record(envelope_id, reply=f"a{i}"))
    paths = InboxPaths.from_root(root)
    incoming = [seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
                for _ in range(5)]
    for env in incoming:
        post_to_inbox(paths, env, "mini")

    outs = [gw.wait_outcome(envelope_id, timeout=10) for envelope_id in sent]
    assert [(o["status"], o["reply"]) for o in outs] == [("replied", f"a{i}") for i in range(5)]
    for env in incoming:
        delivered = paths.delivered / f"{env['id']}.json"
        await_condition(delivered.exists, timeout=10, message=f"delivered/{env['id']}.json")
        record = json.loads(delivered.read_text(encoding="utf-8"))
        assert record["reply"] == f"ok {env['id']}" and record["reply_connection"] == "mini"
    assert sorted(t.delivery_id for t in rec.entered) == sorted(e["id"] for e in incoming)
    assert gw._bridge.paused and gw._bridge.restarts == 0


# ── 4. liveness through the Gateway ─────────────────────────────────────────

LIVENESS_CASES = {
    # name: (rows or None = no roster file, roster age, target, expected: "queued" | "offline" | "unknown")
    "online-true": ([remote_row("moxie", "mini", online=True)], 0, "moxie", "queued"),
    "online-absent": ([remote_row("moxie", "mini")], 0, "moxie", "queued"),
    "offline-row": ([remote_row("moxie", "mini", online=False, label="Mini Mac")], 0, "moxie", "offline"),
    "absent-from-fresh": ([remote_row("other", "mini", online=True)], 0, "moxie", "unknown"),
    "stale-offline-fails-open": ([remote_row("moxie", "mini", online=False)], 700, "moxie", "queued"),
    "empty-roster": ([], 0, "moxie", "unknown"),
    "missing-roster": (None, 0, "moxie", "unknown"),
    "online-string": ([remote_row("moxie", "mini", online="false")], 0, "moxie", "queued"),
    "online-int": ([remote_row("moxie", "mini", online=0)], 0, "moxie", "queued"),
    "online-null": ([remote_row("moxie", "mini", online=None)], 0, "moxie", "queued"),
    "handle-at-connection": (
        [remote_row("moxie", "mini", online=True), remote_row("moxie", "maxi", online=True)], 0, "moxie@mini",
        "queued"),
}


@pytest.mark.parametrize("case", list(LIVENESS_CASES))
def test_liveness_table(case: str, tmp_path: Path, gateways: list[Gateway]) -> None:
    rows, age, target, expected = LIVENESS_CASES[case]
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, rows, age_seconds=age)
    gw = start(gateways, root)
    ack = gw.message_agent(sender="alice", target=target, message="are you there?")
    if expected == "queued":
        envelope_id = queued(ack)
        env = json.loads((relay(root) / "outbox" / f"{envelope_id}.json").read_text(encoding="utf-8"))
        assert (env["target_connection"], env["target_profile"]) == ("mini", "moxie")
        return
    assert "delivery_id" not in ack, ack
    if expected == "offline":
        assert ack["reason"] == "runtime_offline"
        assert ack["error"] == f"@moxie on Mini Mac {OFFLINE_TAIL}"
    else:
        assert ack["error"].startswith("No teammate named 'moxie' on this install, on a connected machine"), ack
    assert outbox_ids(root) == []


def test_ambiguous_bare_handle_lists_the_disambiguated_forms(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = sender_root(tmp_path, [remote_row("moxie", "mini", online=True), remote_row("moxie", "maxi", online=True)])
    gw = start(gateways, root)
    ack = gw.message_agent(sender="alice", target="moxie", message="hi")
    assert ack["error"] == (
        "'moxie' exists on several connected machines — disambiguate with one of: moxie@maxi, moxie@mini."
    )
    assert outbox_ids(root) == []
    envelope_id = queued(gw.message_agent(sender="alice", target="@moxie@maxi", message="hi"))
    env = json.loads((relay(root) / "outbox" / f"{envelope_id}.json").read_text(encoding="utf-8"))
    assert env["target_connection"] == "maxi"


def test_a_roster_rewritten_while_running_is_picked_up_from_its_event(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"rescan_seconds": 300}})
    queued(gw.message_agent(sender="alice", target="moxie", message="one"))
    write_roster_file(root, [remote_row("moxie", "mini", online=False)])

    def refused() -> dict[str, Any] | None:
        ack = gw.message_agent(sender="alice", target="moxie", message="two")
        return ack if ack.get("reason") == "runtime_offline" else None

    ack = await_condition(refused, timeout=20, interval=0.02, message="the offline roster took effect")
    assert ack["error"] == f"@moxie on mini {OFFLINE_TAIL}"


def roster_events_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file relay passes no event of roster.json on (and rescans nothing: the tests start with a 300 s rescan):
    what a DM sent right after a rewrite meets, before the file's event could reach the RosterActor."""
    on_file = RelayActor._on_file

    def withheld(self: RelayActor, msg: FileAppeared) -> None:
        if msg.path != self.paths.relay.roster:
            on_file(self, msg)

    monkeypatch.setattr(RelayActor, "_on_file", withheld)


QUIET = {"bot_mode": {"rescan_seconds": 300}}  # no rescan, no roster tick: roster.json is read only when asked


@pytest.mark.parametrize("hop", [0, 2])  # a caller's DM; one from inside a turn through the plugin (hop 2+)
def test_a_dm_sent_right_after_the_roster_was_rewritten_finds_the_agent_just_added(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, hop: int
) -> None:
    """Regression (rosterfresh): for a few ms after another process rewrote roster.json (the Desktop, a seed
    gateway, the hub) a DM to the agent it just added was refused ``No teammate named 'n3' …``: the roster was
    re-read only at the file's event. Now a DM the remote roster decides sees the file as it is at the call."""
    roster_events_withheld(monkeypatch)
    root = sender_root(tmp_path)
    gw = start(gateways, root, config=QUIET)
    write_roster_file(root, [remote_row("moxie", "mini", online=True), remote_row("n3", "mini", online=True)])
    envelope_id = queued(gw.message_agent(sender="alice", target="n3", message="welcome", hop=hop))
    env = json.loads((relay(root) / "outbox" / f"{envelope_id}.json").read_text(encoding="utf-8"))
    assert (env["target_connection"], env["target_profile"]) == ("mini", "n3")


@pytest.mark.parametrize("hop", [0, 2])
def test_a_dm_sent_right_after_the_roster_set_its_target_offline_is_refused_and_nothing_is_queued(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, hop: int
) -> None:
    """Regression (rosterfresh): a DM to an agent the rewritten roster.json had just set ``online: false`` was
    acked ``queued``, sat in outbox/ and ended ``queued_expired`` at the TTL. Now it is refused
    ``runtime_offline`` (DESIGN §5) and nothing is written."""
    roster_events_withheld(monkeypatch)
    root = sender_root(tmp_path)
    gw = start(gateways, root, config=QUIET)
    write_roster_file(root, [remote_row("moxie", "mini", online=False)])
    ack = gw.message_agent(sender="alice", target="moxie", message="still there?", hop=hop)
    assert ack.get("reason") == "runtime_offline", ack
    assert ack["error"] == f"@moxie on mini {OFFLINE_TAIL}"
    assert outbox_ids(root) == []
    assert rf.list_ids(relay(root) / "sent") == []


def test_a_dm_a_turn_sends_right_after_the_roster_was_rewritten_sees_the_rewrite(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (rosterfresh): a runner's turn sends through the Dispatcher (``Turn.message_agent``); a DM it
    sends right after a rewrite of roster.json is planned with the file as it is then, as a caller's is."""
    roster_events_withheld(monkeypatch)
    root = sender_root(tmp_path)

    def turn(t: Turn) -> str:
        write_roster_file(root, [remote_row("moxie", "mini", online=False), remote_row("n3", "mini", online=True)])
        added, offline = t.message_agent("n3", "welcome"), t.message_agent("moxie", "still there?")
        return json.dumps([added.get("status"), offline.get("reason")])

    gw = start(gateways, root, turn, config=QUIET)
    out = gw.wait_outcome(queued(gw.message_agent(sender="alice", target="bob", message="go")), timeout=20)
    assert out["text"] == 'Reply from @bob: ["queued", "runtime_offline"]', out
    [envelope_id] = outbox_ids(root)
    env = json.loads((relay(root) / "outbox" / f"{envelope_id}.json").read_text(encoding="utf-8"))
    assert env["target_profile"] == "n3"


def test_a_local_dm_never_looks_at_the_roster_file_and_a_remote_one_once(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is paid only by a DM the remote roster decides (one lstat); the local fast path has none."""
    looked: list[Path] = []
    identity = admission_module.roster_identity

    def counted(path: Path) -> Any:
        looked.append(path)
        return identity(path)

    monkeypatch.setattr(admission_module, "roster_identity", counted)
    root = sender_root(tmp_path)
    gw = start(gateways, root, config=QUIET)
    queued(gw.message_agent(sender="alice", target="bob", message="local"))
    assert looked == []
    queued(gw.message_agent(sender="alice", target="moxie", message="remote"))
    assert looked == [relay(root) / "roster.json"]


def test_only_a_roster_read_from_roster_json_is_checked_against_the_file(tmp_path: Path) -> None:
    """The check compares the file with the identity the snapshot was read from; a transport's remote roster
    (Redis: rows pushed every heartbeat, ``remote_via`` set) is no file, and a DM to it never asks a re-read."""
    root = sender_root(tmp_path)
    roster_file = relay(root) / "roster.json"
    agents, mtime, identity = read_roster_version(RelayPaths.from_root(root))
    assert identity is not None
    snapshot = make_snapshot(discover_profiles(root), remote=agents, remote_mtime=mtime, remote_identity=identity)
    caller = CallerAdmission(snapshot, max_hops=8, wake=False, roster_file=roster_file)
    to_remote, to_local = SendRequest("alice", "moxie", "hi"), SendRequest("alice", "bob", "hi")
    assert not caller.roster_rewritten(to_remote)
    write_roster_file(root, [remote_row("moxie", "mini", online=False)])
    assert caller.roster_rewritten(to_remote)
    assert not caller.roster_rewritten(to_local)  # never decided by the remote roster
    caller.snapshot = dataclasses.replace(snapshot, remote_via="redis", remote_identity=None)
    assert not caller.roster_rewritten(to_remote)


class _BusyRoster(pykka.ThreadingActor):
    """A RosterActor stand-in whose every message waits for ``release`` (a roster busy re-reading profiles)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def on_receive(self, message: Any) -> None:
        self.release.wait(30)


def test_a_roster_that_does_not_answer_the_re_read_in_time_fails_no_dm(tmp_path: Path) -> None:
    """Review (diffrev27 of ca627a7): a RosterActor that did not answer the re-read within the timeout made the
    sender's call raise AskTimeout instead of an ack or a refusal; the check is for freshness, so the DM is
    planned with the roster the Dispatcher has, as before the check existed."""
    root = sender_root(tmp_path)
    roster_file = relay(root) / "roster.json"
    agents, mtime, identity = read_roster_version(RelayPaths.from_root(root))
    snapshot = make_snapshot(discover_profiles(root), remote=agents, remote_mtime=mtime, remote_identity=identity)
    release = threading.Event()
    busy = _BusyRoster.start(release)
    try:
        caller = CallerAdmission(snapshot, max_hops=8, wake=False, roster=busy, roster_file=roster_file)
        write_roster_file(root, [remote_row("moxie", "mini", online=False)])
        request = SendRequest("alice", "moxie", "hi")
        assert caller.roster_rewritten(request)
        fresh_remote_roster(caller, request, timeout=0.01)  # returns: the ask timed out, the DM goes on
    finally:
        release.set()
        busy.stop()


def test_a_roster_rewritten_as_a_symlink_right_before_a_dm_is_still_refused(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-read a DM asks for goes through the roster's safe reader: a symlinked roster.json stays refused
    (its agents reach nobody), and its identity is the link's, so the next DM does not ask again."""
    roster_events_withheld(monkeypatch)
    root = sender_root(tmp_path)
    gw = start(gateways, root, config=QUIET)
    reads: list[Path] = []
    read = roster_module.read_roster_version

    def counted(paths: RelayPaths, **kwargs: Any) -> Any:
        reads.append(paths.roster)
        return read(paths, **kwargs)

    monkeypatch.setattr(roster_module, "read_roster_version", counted)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"agents": [remote_row("n3", "mini", online=True)]}), encoding="utf-8")
    link = relay(root) / ".roster-link.tmp"
    link.symlink_to(elsewhere)
    os.replace(link, relay(root) / "roster.json")
    with LogCapture() as logs:
        for _ in range(2):
            ack = gw.message_agent(sender="alice", target="n3", message="hi")
            assert ack["error"].startswith("No teammate named 'n3'"), ack
    assert len(logs.matching("ignoring relay roster")) == 1, logs.lines
    assert reads == [relay(root) / "roster.json"]  # one re-read for the two DMs
    assert outbox_ids(root) == []


# ── 5. TTL, drain-side expiry, sweep, first reply wins ──────────────────────


def test_an_undrained_envelope_expires_at_the_ttl_and_is_never_delivered_late(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    alpha = sender_root(tmp_path)
    gw = start(gateways, alpha, config={"bot_mode": {"envelope_ttl_seconds": 1}})
    expired_id = queued(gw.message_agent(sender="alice", target="moxie", message="anyone?"))
    out = gw.wait_outcome(expired_id, timeout=5)
    assert out["status"] == "failed" and out["reason"] == "queued_expired"
    assert out["error"] == (
        "queued message to @moxie on mini expired after 1s waiting for the Desktop to drain it — "
        "it was NOT delivered. Resend once the Desktop reconnects."
    )
    assert outbox_ids(alpha) == []
    assert (relay(alpha) / "claimed" / f"{expired_id}.json").exists()
    reply = json.loads((relay(alpha) / "replies" / f"{expired_id}.json").read_text(encoding="utf-8"))
    assert reply["reason"] == "queued_expired" and reply["error"] == out["error"] and reply["reply"] == ""

    # A hub and the target gateway start later: a fresh DM flows, the expired one never arrives.
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    rec = RecordingRunner()
    with Gateway(mini, runner=rec, connection_id="mini"), hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: any(r["handle"] == "moxie" and r["online"] is True for r in gw.roster()),
                        timeout=10, message="moxie online through the hub")
        fresh = queued(gw.message_agent(sender="alice", target="moxie", message="now?"))
        assert gw.wait_outcome(fresh, timeout=10)["status"] == "replied"
    assert [t.delivery_id for t in rec.entered] == [fresh]


def test_a_gateway_killed_between_its_expiry_claim_and_the_reply_reports_queued_expired_after_restart(
    tmp_path: Path,
) -> None:
    """The sending gateway took its own expired envelope out of outbox/ and was SIGKILLed before the
    queued_expired reply: the restart knows the envelope was its own (expiring/), answers it
    queued_expired, and leaves it in claimed/ where the seed's expiry leaves it."""
    root = sender_root(tmp_path)
    first = run_child(root, "expire", crash_at="relay-after-expiry-claim")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    envelope = first.of("ack")[0]["delivery_id"]
    assert (relay(root) / "expiring" / f"{envelope}.json").exists()
    assert not (relay(root) / "replies" / f"{envelope}.json").exists()

    write_roster_file(root, [remote_row("moxie", "mini", online=True)])  # fresh for the restart
    second = run_child(root, "expire", "--resume", envelope)
    assert second.returncode == 0, second.stderr[-2000:]
    (out,) = second.of("outcome")
    assert (out["status"], out["reason"]) == ("failed", "queued_expired"), out
    assert "NOT delivered" in out["error"]
    assert (relay(root) / "claimed" / f"{envelope}.json").exists()
    assert not (relay(root) / "expiring" / f"{envelope}.json").exists()
    assert turns_logged(root) == []  # nothing ran anywhere


def test_a_gateway_killed_after_its_expiry_reply_files_the_envelope_in_claimed_after_restart(
    tmp_path: Path,
) -> None:
    """Killed between the queued_expired reply and the move out of expiring/: the restart reports the
    reply and moves the envelope on to claimed/ (it used to stay in expiring/ until the 6 h sweep)."""
    root = sender_root(tmp_path)
    first = run_child(root, "expire", crash_at="relay-after-expiry-reply")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    envelope = first.of("ack")[0]["delivery_id"]
    assert (relay(root) / "expiring" / f"{envelope}.json").exists()
    assert (relay(root) / "replies" / f"{envelope}.json").exists()

    write_roster_file(root, [remote_row("moxie", "mini", online=True)])  # fresh for the restart
    second = run_child(root, "expire", "--resume", envelope)
    assert second.returncode == 0, second.stderr[-2000:]
    (out,) = second.of("outcome")
    assert (out["status"], out["reason"]) == ("failed", "queued_expired"), out
    assert (relay(root) / "claimed" / f"{envelope}.json").exists()
    assert not (relay(root) / "expiring" / f"{envelope}.json").exists()
    assert turns_logged(root) == []


def test_a_gateway_killed_between_the_sent_record_and_the_outbox_reports_not_sent_at_once_after_restart(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """The sending gateway was SIGKILLed after the DM's sent/ record, before its envelope reached outbox/ (the
    chaos run's kill mid-write): the restart finds the envelope still staged, so it was never sent, and says so
    at once (failed cancelled, NOT sent, resend) instead of waiting out reply_wait_seconds (900 s here) for a
    delivery_timeout "may still be delivered". Its sent/ record and staged file are gone afterwards."""
    root = sender_root(tmp_path)
    first = run_child(root, "expire", crash_at="relay-after-sent-record")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    assert first.of("ack") == []  # killed inside the send: the DM was never acked
    (record,) = (relay(root) / "sent").glob("*.json")
    envelope = record.stem
    assert outbox_ids(root) == []
    assert (root / rp.TMP / f".{envelope}.queueing").exists()

    write_roster_file(root, [remote_row("moxie", "mini", online=True)])  # fresh for the restart
    gw = start(gateways, root)  # the default budgets: 900 s each
    out = gw.wait_outcome(envelope, timeout=10)
    assert (out["status"], out["reason"], out["retryable"]) == ("failed", "cancelled", True), out
    assert "NOT sent" in out["error"] and "@moxie on mini" in out["error"], out
    await_condition(lambda: not record.exists() and not (root / rp.TMP / f".{envelope}.withdrawn").exists(),
                    timeout=10, message="the sent record and the withdrawn envelope dropped once reported")
    assert outbox_ids(root) == [] and not (relay(root) / "claimed" / f"{envelope}.json").exists()
    assert not (root / rp.TMP / f".{envelope}.queueing").exists()
    assert gw.stats()["relay"]["waiting"] == 0
    assert turns_logged(root) == []


def test_a_gateway_starting_while_another_is_queueing_a_dm_leaves_it_to_that_living_sender(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two gateways on one root (allowed): B starts while A is between a DM's sent/ record and its rename into
    outbox/ (the staged .<id>.queueing file is there). A is alive, and holds its staged file's lock: B leaves
    it to A (it neither takes it back nor waits for it), so A queues it and acks its caller, and the DM gets
    exactly one answer, A's: B publishes no outcome and wakes nobody ("The gateway stopped ... Resend it" would
    be false). Before, B's start renamed the staged file away: A's caller got ENOENT, "Nothing was sent", and
    B also reported it cancelled and woke the sender."""
    root = sender_root(tmp_path)
    reached, go = threading.Event(), threading.Event()
    real_crashpoint = outbound_module.crashpoint

    def hold_the_first_send(name: str) -> None:  # A's send, between its sent/ record and the rename
        if name == "relay-after-sent-record" and not reached.is_set():
            reached.set()
            assert go.wait(30), "the test never let A's send go on"
        real_crashpoint(name)

    monkeypatch.setattr(outbound_module, "crashpoint", hold_the_first_send)
    config = {"bot_mode": {"wake_sender": True}}
    a_runner = RecordingRunner()
    a = start(gateways, root, a_runner, config=config)
    seen_a: list[dict[str, Any]] = []
    a.subscribe(seen_a.append)
    acks: list[dict[str, Any]] = []
    sender = threading.Thread(target=lambda: acks.append(a.message_agent(sender="alice", target="moxie",
                                                                        message="hi")))
    sender.start()
    try:
        assert reached.wait(30), "A's send never reached its sent/ record"
        (record,) = (relay(root) / "sent").glob("*.json")
        envelope_id = record.stem
        assert (root / rp.TMP / f".{envelope_id}.queueing").exists()

        b, b_runner, seen_b = beside(gateways, root, config)
        assert b.stats()["relay"]["waiting"] == 0  # not B's to wait for either: A answers for it
        assert (root / rp.TMP / f".{envelope_id}.queueing").exists()  # left in place for A's rename
    finally:
        go.set()
        sender.join(30)
    (ack,) = acks
    assert queued(ack) == envelope_id, ack
    assert outbox_ids(root) == [envelope_id]
    b.stop(timeout=10)  # whatever B's start told its Dispatcher is published by now
    assert seen_b == [] and b_runner.entered == []

    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="hello back", now=time.time()))
    out = a.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reply"]) == ("replied", "hello back"), out
    await_condition(lambda: len(a_runner.entered) == 1, timeout=10, message="A woke its sender once")
    assert [o["status"] for o in seen_a if o["delivery_id"] == envelope_id] == ["replied"]
    assert "hello back" in body_of(a_runner.entered[0].content)


def test_a_gateway_starting_beside_a_living_sender_leaves_its_queued_envelopes_to_it(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Two gateways on one root (allowed), both sending through the relay: B starts after A queued DMs in
    outbox/. Their sent/ records name A's shelf, whose lock A holds: B neither waits for them nor reports
    them, so each DM gets one outcome (A's) and one wake. Before, B's start resumed all of A's records
    (the chaos run's "resumed waiting for 7 envelope(s) of ours"): each reply was published twice and woke
    its sender twice."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True}}
    a_runner = RecordingRunner()
    a = start(gateways, root, a_runner, config=config)
    seen_a: list[dict[str, Any]] = []
    a.subscribe(seen_a.append)
    ids = [queued(a.message_agent(sender="alice", target="moxie", message=f"hi {n}")) for n in range(3)]
    assert sorted(outbox_ids(root)) == sorted(ids)
    shelves = {json.loads(path.read_text(encoding="utf-8"))["owner"] for path in (relay(root) / "sent").glob("*")}
    assert shelves == {path.name for path in (relay(root) / "taken").glob("s-*")}  # A's, the one shelf yet

    b, b_runner, seen_b = beside(gateways, root, config)
    assert b.stats()["relay"]["waiting"] == 0  # A's to wait for
    for envelope_id in ids:
        rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="back", now=time.time()))
    for envelope_id in ids:
        out = a.wait_outcome(envelope_id, timeout=10)
        assert (out["status"], out["reply"]) == ("replied", "back"), out
    await_condition(lambda: len(a_runner.entered) == len(ids), timeout=10, message="A woke its sender per DM")
    b.stop(timeout=10)  # whatever B's start told its Dispatcher is published by now
    assert seen_b == [] and b_runner.entered == []
    assert sorted(o["delivery_id"] for o in seen_a) == sorted(ids)  # one outcome each
    assert len(a_runner.entered) == len(ids)


def test_a_killed_senders_envelopes_are_resumed_by_the_next_start_beside_a_living_gateway(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """The sender that recorded a DM was SIGKILLed (its shelf's lock died with it) while another gateway runs on
    the root: the next gateway to start resumes that DM (its owner is dead) and answers it, and leaves the
    living gateway's own DM to it."""
    root = sender_root(tmp_path)
    first = run_child(root, "expire", crash_at="relay-after-sent-record")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    (record,) = (relay(root) / "sent").glob("*.json")
    assert json.loads(record.read_text(encoding="utf-8"))["owner"].startswith("s-")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])  # fresh for the restarts
    living = start(gateways, root, config={"bot_mode": {"reply_wait_seconds": 300}})
    out = living.wait_outcome(record.stem, timeout=10)  # its owner is dead: resumed (and found never queued)
    assert (out["status"], out["reason"]) == ("failed", "cancelled"), out
    own = queued(living.message_agent(sender="alice", target="moxie", message="mine"))

    later = start(gateways, root, config={"bot_mode": {"reply_wait_seconds": 300, "rescan_seconds": 300}})
    assert later.stats()["relay"]["waiting"] == 0  # the living gateway's DM is its own
    assert living.stats()["relay"]["waiting"] == 1
    living.stop(timeout=10)  # now dead too: the gateway still running takes its DM over at its next rescan
    rescan(later)
    assert later.stats()["relay"]["waiting"] == 1
    after = start(gateways, root, config={"bot_mode": {"reply_wait_seconds": 300}})
    assert after.stats()["relay"]["waiting"] == 0  # the running gateway's now
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(own, reply="late", now=time.time()))
    assert later.wait_outcome(own, timeout=10)["reply"] == "late"


def test_a_sender_killed_while_other_gateways_run_is_taken_over_by_exactly_one_of_them(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Gateways A and C run on the root; B starts on it, sends a relay DM and is SIGKILLed; then the reply lands.
    At their next rescans (both at once) exactly one of A and C adopts B's sent/ record (under B's shelf lock)
    and reports the reply: one outcome, one wake of the sender. Before, no running gateway took over a writer
    that died after its start: the reply was never reported and the sender never woken until some gateway
    started again on the root."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a_runner, c_runner = RecordingRunner(), RecordingRunner()
    a, c = start(gateways, root, a_runner, config=config), start(gateways, root, c_runner, config=config)
    seen: list[dict[str, Any]] = []
    a.subscribe(seen.append)
    c.subscribe(seen.append)
    with children(tmp_path) as spawn:
        b = spawn("b", [sys.executable, str(Path(__file__).with_name("relay_dying.py")), str(root), "alpha", "send"])
        envelope_id = queued(b.wait_json("ack", timeout=60)["ack"])
        rescan(a, c)  # B lives: its DM is left to it
        assert a.stats()["relay"]["waiting"] == c.stats()["relay"]["waiting"] == 0
        b.proc.kill()
        b.proc.wait(30)
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the dead", now=time.time()))
    rescan(a, c)
    await_condition(lambda: len(a_runner.entered) + len(c_runner.entered) == 1, timeout=20,
                    message="one running gateway took B's DM over and woke its sender")
    rescan(a, c)  # a later rescan takes nothing over again
    for gw in (a, c):
        gw.stop(timeout=10)  # flushes what each published
    assert [(o["status"], o["reply"]) for o in seen if o["delivery_id"] == envelope_id] == [("replied",
                                                                                          "for the dead")]
    (wake,) = a_runner.entered + c_runner.entered
    assert "for the dead" in body_of(wake.content)
    assert not (relay(root) / "sent" / f"{envelope_id}.json").exists()  # forgotten once reported


@pytest.mark.parametrize("sender", ["gateway", "cli"])
def test_a_sender_that_starts_and_stops_cleanly_between_two_rescans_is_taken_over_by_the_running_gateway(
    sender: str, tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    """Gateway A runs on the root; between two of its rescans a second gateway starts, sends a relay DM and
    stops cleanly (``cli``: the real ``hermes-actors send`` without a host, which does exactly that). The reply
    lands; at A's next rescan A takes the DM over and reports it: one outcome, one wake of the sender. Before,
    the clean stop removed its empty shelf, so A, which had never seen that shelf alive, never saw it die: the
    DM's sent/ record named a shelf nobody looked for, its reply was never reported, its sender never woken.
    The command's DM is recorded without a wake (``wake: false``: it says so, "only a host wakes senders"), and
    the taker keeps that decision: reported once, nobody woken."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    if sender == "gateway":
        b = Gateway(root, runner=RecordingRunner(), config=config, connection_id="alpha").start()
        envelope_id = queued(b.message_agent(sender="alice", target="moxie", message="from a short-lived gateway"))
        b.stop(timeout=10)
    else:
        capsys.readouterr()
        assert main(["send", "--root", str(root), "--from", "alice", "--connection-id", "alpha", "--runner", "demo",
                     "moxie", "from the command line"]) == 0
        (envelope_id,) = set(re.findall(r"\b[0-9a-f]{32}\b", capsys.readouterr().out))
    record = relay(root) / "sent" / f"{envelope_id}.json"
    written = json.loads(record.read_text(encoding="utf-8"))
    assert written["wake"] is (sender == "gateway")
    shelf = relay(root) / "taken" / written["owner"]
    assert shelf.is_dir()  # kept by the clean stop while the record names it
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the stopped", now=time.time()))
    rescan(a)
    assert a.wait_outcome(envelope_id, timeout=20)["reply"] == "for the stopped"  # A took the DM over
    if sender == "gateway":
        await_condition(lambda: len(a_runner.entered) == 1, timeout=20, message="A woke the DM's sender")
    rescan(a)  # a later rescan takes nothing over again
    a.stop(timeout=10)  # flushes what it published, and the wake it started
    assert [(o["status"], o["reply"]) for o in seen if o["delivery_id"] == envelope_id] == [("replied",
                                                                                          "for the stopped")]
    assert [body_of(wake.content).count("for the stopped") for wake in a_runner.entered] == (
        [1] if sender == "gateway" else [])
    assert not record.exists() and not shelf.exists()  # forgotten once reported; the kept shelf removed by A


@pytest.mark.parametrize("killed_at", ["relay-before-forget", "after-outcome-before-delivered"])
def test_a_dm_its_killed_sender_reported_is_not_reported_again_by_the_gateway_taking_it_over(
    killed_at: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Gateways A and C run; B sends a relay DM, its reply lands, B reports it and is SIGKILLed before it
    forgot the DM's sent/ record. A and C take the record over at their rescans, and read the root's journals:

    - killed at relay-before-forget: B's journal holds the outcome finished and delivered (published, the
      sender's wake written in one batch with the delivered record, and run: B's runner printed it). Neither
      A nor C reports it again: no second outcome, no second wake; the record is forgotten (consumed). Before,
      the taker published the reply again and woke the sender a second time.
    - killed at after-outcome-before-delivered: finished, not delivered (B published, its wake never written).
      The taker reports it, as a start does with such a journal, and wakes the sender once: forgetting it
      instead would lose that wake for good (a relayed DM's journal has no accepted record to wake from).

    Either way a start after them (adopting every journal) finds the outcome known: it publishes nothing and
    wakes nobody. Across B, the takers and that start: one wake."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    c, c_runner, _ = beside(gateways, root, config)
    c.subscribe(seen.append)
    argv = [sys.executable, str(Path(__file__).with_name("relay_dying.py")), str(root), "alpha", "report"]
    if killed_at != "relay-before-forget":
        argv = ["env", f"HERMES_ACTORS_CRASH_AT={killed_at}", *argv]
    with children(tmp_path) as spawn:
        b = spawn("b", argv)
        envelope_id = queued(b.wait_json("ack", timeout=60)["ack"])
        rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the dead", now=time.time()))
        assert b.proc.wait(60) == -9, b.stderr_tail()  # SIGKILLed at its crashpoint
        b_woke = b.json_lines("woke")
    assert (relay(root) / "sent" / f"{envelope_id}.json").exists()  # B never forgot it
    assert len(b_woke) == (1 if killed_at == "relay-before-forget" else 0)
    rescan(a, c)
    if killed_at != "relay-before-forget":
        await_condition(lambda: len(a_runner.entered) + len(c_runner.entered) == 1, timeout=20,
                        message="one running gateway reported B's DM and woke its sender")
    rescan(a, c)  # a later rescan takes nothing over again
    assert a.stats()["relay"]["waiting"] == c.stats()["relay"]["waiting"] == 0
    for gw in (a, c):
        gw.stop(timeout=10)  # flushes what each published
    reported = [(o["status"], o["reply"]) for o in seen if o["delivery_id"] == envelope_id]
    takers_woke = a_runner.entered + c_runner.entered
    if killed_at == "relay-before-forget":
        assert reported == [] and takers_woke == []
    else:
        assert reported == [("replied", "for the dead")] and len(takers_woke) == 1
    assert not (relay(root) / "sent" / f"{envelope_id}.json").exists()
    assert (relay(root) / "consumed" / f"{envelope_id}.json").exists()

    d, d_runner, seen_d = beside(gateways, root, config)  # adopts B's journal and the takers'
    assert d.wait_outcome(envelope_id, timeout=10)["reply"] == "for the dead"
    d.stop(timeout=10)
    assert [o for o in seen_d if o["delivery_id"] == envelope_id] == [] and d_runner.entered == []
    assert len(b_woke) + len(takers_woke) == 1


def dead_sender_with_a_journaled_reply(tmp_path: Path, root: Path) -> str:
    """B (a child process) sends a relay DM, its reply lands, B journals the outcome ``finished`` and is SIGKILLed
    before its ``delivered`` record and before it forgot the DM's sent/ record (its wake never written).

    Returns:
        The DM's id.
    """
    argv = ["env", "HERMES_ACTORS_CRASH_AT=after-outcome-before-delivered", sys.executable,
            str(Path(__file__).with_name("relay_dying.py")), str(root), "alpha", "report"]
    with children(tmp_path) as spawn:
        b = spawn("b", argv)
        envelope_id = queued(b.wait_json("ack", timeout=60)["ack"])
        rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the dead", now=time.time()))
        assert b.proc.wait(60) == -9, b.stderr_tail()  # SIGKILLed at its crashpoint
    assert (relay(root) / "sent" / f"{envelope_id}.json").exists()  # B never forgot it
    return envelope_id


def adopt_journal_only(root: Path, adopter: Gateway, envelope_id: str) -> None:
    """``adopter``'s rescan adopts B's journal but not B's sent/ record: B's shelf lock is held meanwhile (as if B
    still lived), so another gateway's later rescan takes the record over."""
    record = relay(root) / "sent" / f"{envelope_id}.json"
    owner = json.loads(record.read_text(encoding="utf-8"))["owner"]
    held = os.open(relay(root) / "taken" / owner / ".lock", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rescan(adopter)
    finally:
        os.close(held)
    assert record.exists() and adopter.stats()["relay"]["waiting"] == 0  # left to whoever takes it over


@pytest.mark.parametrize("restarted", ["before-the-adopters-next-rescan", "after-it-and-the-6h-sweep"])
def test_a_relayed_dm_one_gateway_adopted_and_another_reported_is_not_published_again_by_a_restart(
    restarted: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Gateways A and C run; B's relayed DM is journaled finished (not delivered) when B is killed. A adopts B's
    journal (the DM left to the relay: its sent/ record is there), C takes the sent/ record over and reports the
    reply (its journal, its consumed/ mark, alice woken once). A then stops and E starts beside C, adopting A's
    journal: E publishes nothing and wakes nobody, whether A stopped before its next rescan (the start finds the
    consumed/ mark) or after it (A's rescan wrote the DM's ``delivered`` record once C's report cleared the sent/
    record; the mark is then swept, as after 6 h). Before, nothing wrote ``delivered`` into A's journal and E's
    start published the reply a second time."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    c, c_runner, _ = beside(gateways, root, config)
    c.subscribe(seen.append)
    envelope_id = dead_sender_with_a_journaled_reply(tmp_path, root)
    adopt_journal_only(root, a, envelope_id)
    rescan(c)  # C takes B's sent/ record over and reports the reply
    await_condition(lambda: len(c_runner.entered) == 1, timeout=20, message="C reported B's DM and woke alice")
    consumed = relay(root) / "consumed" / f"{envelope_id}.json"
    await_condition(lambda: not (relay(root) / "sent" / f"{envelope_id}.json").exists(), timeout=20,
                    message="C forgot the DM once reported")
    assert consumed.exists()
    if restarted == "after-it-and-the-6h-sweep":
        rescan(a)
        consumed.unlink()
    a.stop(timeout=10)
    e, e_runner, seen_e = beside(gateways, root, config)  # adopts A's journal (C still runs)
    assert e.wait_outcome(envelope_id, timeout=10)["reply"] == "for the dead"
    for gw in (e, c):
        gw.stop(timeout=10)  # flushes what each published
    assert [(o["status"], o["reply"]) for o in seen + seen_e if o["delivery_id"] == envelope_id] == [
        ("replied", "for the dead")]
    assert a_runner.entered == e_runner.entered == [] and len(c_runner.entered) == 1


@pytest.mark.parametrize("how", ["removed-by-hand", "quarantined"])
def test_a_watched_relayed_dm_whose_record_goes_with_nobody_holding_it_is_published_once(
    how: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review diffrev25 (a regression of 1fdca63, reverted): A adopted B's journal and left its relayed DM to the
    relay (its sent/ record there, the reply not yet); the record then went with no relay holding it (removed by
    hand, or quarantined) and no consumed/ mark. Taking every watched DM whose record went as reported published it
    nowhere: an acked DM without an outcome. A's next rescan publishes it, once, and a later start nothing more."""
    from hermes_actors.store.relay_quarantine import quarantine

    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, _a_runner, seen = beside(gateways, root, config)
    envelope_id = dead_sender_with_a_journaled_reply(tmp_path, root)
    (relay(root) / "replies" / f"{envelope_id}.json").unlink()  # not there: nobody reports the DM
    adopt_journal_only(root, a, envelope_id)  # A watches it: its sent/ record is there
    record = relay(root) / "sent" / f"{envelope_id}.json"
    if how == "removed-by-hand":
        record.unlink()
    else:
        quarantine(RelayPaths.from_root(root), record, "not a valid sent record")
    rescan(a)
    a.stop(timeout=10)  # flushes what it published
    e, _e_runner, seen_e = beside(gateways, root, config)  # a later start adopting A's journal
    e.stop(timeout=10)
    assert [(o["status"], o["reply"]) for o in seen + seen_e if o["delivery_id"] == envelope_id] == [
        ("replied", "for the dead")]


def test_an_adoption_whose_look_at_the_relayed_dms_fails_still_tells_its_recovery_and_leaves_them_waiting(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review diffrev25: EACCES on a relayed DM's sent/ record while a running adoption sorted its relayed DMs
    (``JournalTakeover.sort``, in the rescan's ``finally``) raised out of it after the dead journal was retired: the
    Dispatcher was never told ``Recover`` (no recovery line; its local DMs and wakes waited for the next start). Now
    such DMs wait (looked at again at each rescan) and the recovery is told; the reply, once there, is published
    once."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    envelope_id = dead_sender_with_a_journaled_reply(tmp_path, root)
    reply = relay(root) / "replies" / f"{envelope_id}.json"
    reply.unlink()  # not there yet: A's relay, which takes B's sent/ record over, waits for it
    record = relay(root) / "sent" / f"{envelope_id}.json"
    real_exists = Path.exists

    def exists(self: Path, *args: Any, **kwargs: Any) -> bool:
        if self == record:
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    with LogCapture("INFO") as logs:
        rescan(a)
        await_condition(lambda: logs.matching("recovery: adopted the journal"), timeout=20,
                        message="the adoption's recovery was told")
    monkeypatch.undo()
    assert logs.matching("could not look at the sent/ records"), logs.lines
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the dead", now=time.time()))
    rescan(a)
    await_condition(lambda: len(a_runner.entered) == 1, timeout=20, message="A reported the DM and woke alice")
    rescan(a)
    a.stop(timeout=10)  # flushes what it published
    assert [(o["status"], o["reply"]) for o in seen if o["delivery_id"] == envelope_id] == [
        ("replied", "for the dead")]


def test_a_rescan_whose_look_at_watched_relayed_dms_fails_still_does_the_rest_and_says_so_once(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review followfix: the rescan's first step, the look at the relayed DMs adopted journals left to the relay
    (``JournalTakeover.follow``), ran outside any guard: an OSError in it (EACCES on their sent/ records) ended the
    rescan there, so for as long as it lasted nothing else of it ran (journal and shelf takeover, delivered/
    rewrites, the reply check, the inbox takes). Now the rest runs and the failure is said once while it lasts."""
    from hermes_actors.store.journal_records import DeliveryState

    root = sender_root(tmp_path)
    rec = RecordingRunner(lambda turn: f"ok {turn.delivery_id}")
    gw = start(gateways, root, rec, config={"bot_mode": {"rescan_seconds": 300}})  # rescans run when the test says
    assert gw._bridge is not None and gw._system is not None and gw._system.journals is not None
    gw._bridge.paused = True  # events dropped: only the rescan takes the inbox
    watched = "b" * 32  # a relayed DM an adopted journal left to the relay
    gw._system.journals.watch({watched: DeliveryState(outcome={"status": "replied"})}, [watched])
    record = InboxPaths.from_root(root).relay.id_file(InboxPaths.from_root(root).sent, watched)
    real_exists = Path.exists

    def exists(self: Path, *args: Any, **kwargs: Any) -> bool:
        if self == record:
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    paths = InboxPaths.from_root(root)
    incoming = [seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
                for _ in range(2)]
    with LogCapture("WARNING") as logs:
        for env in incoming:
            post_to_inbox(paths, env, "mini")
            rescan(gw)
            delivered = paths.delivered / f"{env['id']}.json"
            await_condition(functools.partial(real_exists, delivered), timeout=10,
                            message=f"delivered/{env['id']}.json")
    said = [line for line in logs.lines if "Permission denied" in line]
    assert len(said) == 1 and "the relayed DMs adopted journals left to the relay failed" in said[0], logs.lines
    assert sorted(t.delivery_id for t in rec.entered) == sorted(e["id"] for e in incoming)


def test_a_start_leaves_a_relayed_dm_of_its_adopted_journal_to_the_running_gateway_that_took_it_over(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """As above, but C took B's sent/ record over before the reply could be read (C waits for it) and A stopped
    before C reported: E's start adopts A's journal, finds the record held by C (alive) and leaves the DM to it;
    C reports the reply once it lands (one outcome, alice woken once), and E's next rescan writes the DM's
    ``delivered`` record, so a start after E (the consumed/ mark swept) publishes nothing either. Before, E's
    start published the journaled reply at once and C reported it again: two outcomes."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    c, c_runner, _ = beside(gateways, root, config)
    c.subscribe(seen.append)
    envelope_id = dead_sender_with_a_journaled_reply(tmp_path, root)
    reply = relay(root) / "replies" / f"{envelope_id}.json"
    reply.unlink()  # not there when C takes the DM over: C waits for it
    adopt_journal_only(root, a, envelope_id)
    rescan(c)
    assert c.stats()["relay"]["waiting"] == 1
    a.stop(timeout=10)
    e, e_runner, seen_e = beside(gateways, root, config)  # adopts A's journal; the sent/ record is C's
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the dead", now=time.time()))
    await_condition(lambda: len(c_runner.entered) == 1, timeout=20, message="C reported B's DM and woke alice")
    await_condition(lambda: not (relay(root) / "sent" / f"{envelope_id}.json").exists(), timeout=20,
                    message="C forgot the DM once reported")
    rescan(e)
    e.stop(timeout=10)
    (relay(root) / "consumed" / f"{envelope_id}.json").unlink()  # swept, as after 6 h
    f, f_runner, seen_f = beside(gateways, root, config)  # adopts E's journal
    for gw in (f, c):
        gw.stop(timeout=10)  # flushes what each published
    assert [(o["status"], o["reply"]) for o in seen + seen_e + seen_f if o["delivery_id"] == envelope_id] == [
        ("replied", "for the dead")]
    assert a_runner.entered == e_runner.entered == f_runner.entered == [] and len(c_runner.entered) == 1


def test_a_relayed_dm_whose_wake_its_killed_sender_never_ran_gets_one_outcome_and_one_wake_from_the_takers(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Gateways A and C run; B sends a relay DM, its reply lands, B reports it (journaled finished and delivered,
    the sender's wake accepted with it) and is SIGKILLed before it forgot the DM's sent/ record and before the
    wake could begin (alice's turn lock is held). At their rescans one of A and C takes the sent/ record over and
    forgets it (the journal says it is settled), and one adopts B's journal and runs the wake: no second outcome,
    one wake. Before, the takers never ran the wake: it waited in B's journal for the next start."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    c, c_runner, _ = beside(gateways, root, config)
    c.subscribe(seen.append)
    lock = turn_lock_path(root, "alice")
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # B's wake of alice cannot begin before B is killed
        argv = ["env", "HERMES_ACTORS_CRASH_AT=relay-before-forget", sys.executable,
                str(Path(__file__).with_name("relay_dying.py")), str(root), "alpha", "report"]
        with children(tmp_path) as spawn:
            b = spawn("b", argv)
            envelope_id = queued(b.wait_json("ack", timeout=60)["ack"])
            rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="for the dead",
                                                                     now=time.time()))
            assert b.proc.wait(60) == -9, b.stderr_tail()  # SIGKILLed at its crashpoint
            assert b.json_lines("woke") == []
    finally:
        os.close(held)
    assert (relay(root) / "sent" / f"{envelope_id}.json").exists()  # B never forgot it
    rescan(a, c)
    await_condition(lambda: len(a_runner.entered) + len(c_runner.entered) == 1, timeout=30,
                    message="one running gateway ran the wake B left")
    rescan(a, c)  # a later rescan takes nothing over again
    for gw in (a, c):
        gw.stop(timeout=10)  # flushes what each published
    assert [o for o in seen if o["delivery_id"] == envelope_id] == []  # B reported it: nobody again
    (wake,) = a_runner.entered + c_runner.entered
    assert wake.profile == "alice" and "for the dead" in body_of(wake.content)
    assert not (relay(root) / "sent" / f"{envelope_id}.json").exists()
    d, d_runner, seen_d = beside(gateways, root, config)  # adopts every journal left: nothing to do
    assert d.wait_outcome(envelope_id, timeout=10)["reply"] == "for the dead"
    d.stop(timeout=10)
    assert [o for o in seen_d if o["delivery_id"] == envelope_id] == [] and d_runner.entered == []


def test_a_gateway_whose_shelf_is_removed_while_it_runs_keeps_its_dms_and_no_other_gateway_takes_them_over(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Gateways A and B run on the root; A sends a relay DM, then A's shelf directory is removed under it and
    both rescan (at once, twice). B leaves A's DM to A (A's heartbeat claims the shelf its record names), A
    takes a new shelf and rewrites its record to name it; the reply lands: one outcome (A's), one wake.
    Before, B took the missing shelf for a stopped gateway's, made it again and adopted A's record while A
    still waited for it: both reported the reply and woke the sender."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen = beside(gateways, root, config)
    b, b_runner, _ = beside(gateways, root, config)
    b.subscribe(seen.append)
    envelope_id = queued(a.message_agent(sender="alice", target="moxie", message="mine"))
    record = relay(root) / "sent" / f"{envelope_id}.json"
    former = json.loads(record.read_text(encoding="utf-8"))["owner"]
    shutil.rmtree(relay(root) / "taken" / former)
    rescan(a, b)
    rescan(a, b)  # whichever ran first above, B now finds A's new shelf
    assert (a.stats()["relay"]["waiting"], b.stats()["relay"]["waiting"]) == (1, 0)
    owner = json.loads(record.read_text(encoding="utf-8"))["owner"]
    assert owner != former and (relay(root) / "taken" / owner / ".lock").exists()  # A's new shelf
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="back", now=time.time()))
    assert a.wait_outcome(envelope_id, timeout=10)["reply"] == "back"
    await_condition(lambda: len(a_runner.entered) == 1, timeout=10, message="A woke its sender")
    for gw in (a, b):
        gw.stop(timeout=10)  # flushes what each published
    assert [(o["status"], o["reply"]) for o in seen if o["delivery_id"] == envelope_id] == [("replied", "back")]
    assert len(a_runner.entered) == 1 and b_runner.entered == []


@pytest.mark.parametrize("found_at", ["the reply", "the rescan finding its shelf gone"])
def test_a_dm_taken_over_while_its_gateway_was_paused_is_reported_only_by_the_gateway_that_took_it_over(
    found_at: str, tmp_path: Path, gateways: list[Gateway], logs: LogCapture
) -> None:
    """Gateways A and B run; A sends a relay DM. A is then paused (SIGSTOP) past its heartbeat's freshness while
    its shelf is removed: its shelf looks like a stopped gateway's, and B takes the DM over (its sent/ record now
    names B's shelf) while A still waits for it. Simulated without a pause: the record is made to name a dead
    gateway's shelf, which B adopts at its rescan. Then A finds out, at the reply (A reads the record before it
    reports) or at its rescan (its shelf gone too): A drops the DM with one WARNING, reports nothing, wakes
    nobody; B reports it once and wakes the sender once. Before, after SIGCONT both reported it: two outcomes,
    two wakes."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says
    a, a_runner, seen_a = beside(gateways, root, config)
    b, b_runner, seen_b = beside(gateways, root, config)
    envelope_id = queued(a.message_agent(sender="alice", target="moxie", message="mine"))
    record = relay(root) / "sent" / f"{envelope_id}.json"
    written = json.loads(record.read_text(encoding="utf-8"))
    dead = relay(root) / "taken" / f"s-{uuid.uuid4().hex}"  # a stopped gateway's shelf: its lock free
    dead.mkdir(mode=0o700)
    (dead / ".lock").touch(mode=0o600)
    record.write_text(json.dumps({**written, "owner": dead.name}), encoding="utf-8")
    rescan(b)  # B adopts it: the record names B's shelf now, B waits for the DM
    assert json.loads(record.read_text(encoding="utf-8"))["owner"] not in (written["owner"], dead.name)
    assert (a.stats()["relay"]["waiting"], b.stats()["relay"]["waiting"]) == (1, 1)
    if found_at != "the reply":
        shutil.rmtree(relay(root) / "taken" / written["owner"])
        rescan(a)  # A takes a new shelf and finds the DM is no longer its own
        assert a.stats()["relay"]["waiting"] == 0
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="back", now=time.time()))
    assert b.wait_outcome(envelope_id, timeout=10)["reply"] == "back"
    await_condition(lambda: len(b_runner.entered) == 1, timeout=10, message="B woke the sender")
    rescan(a, b)  # A's rescan finds the reply too: still nothing reported there
    assert a.stats()["relay"]["waiting"] == b.stats()["relay"]["waiting"] == 0
    for gw in (a, b):
        gw.stop(timeout=10)  # flushes what each published
    assert [o for o in seen_a if o["delivery_id"] == envelope_id] == [] and a_runner.entered == []
    assert [(o["status"], o["reply"]) for o in seen_b if o["delivery_id"] == envelope_id] == [("replied", "back")]
    assert len(b_runner.entered) == 1
    assert len(logs.matching(envelope_id, "was taken over by another gateway")) == 1


@pytest.mark.parametrize("owner", ["gone", "unlocked"])
def test_a_dm_whose_record_names_a_shelf_nobody_holds_is_still_reported_here(
    owner: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (diffrev18): A alone on its root sends a relay DM; a hand rewrites its sent/ record to name a
    shelf that does not exist, or one whose lock nobody holds. No gateway waits for the DM there, yet A took any
    other shelf's name for a takeover and dropped the DM unreported: its sender waited for nobody until a
    restart. A drops a DM only for a shelf a living gateway holds; here it reports the reply once."""
    root = sender_root(tmp_path)
    a, _runner, seen = beside(gateways, root, {"bot_mode": {"rescan_seconds": 300}})
    envelope_id = queued(a.message_agent(sender="alice", target="moxie", message="mine"))
    record = relay(root) / "sent" / f"{envelope_id}.json"
    name = f"s-{uuid.uuid4().hex}"
    if owner == "unlocked":
        (relay(root) / "taken" / name).mkdir(mode=0o700)
        (relay(root) / "taken" / name / ".lock").touch(mode=0o600)
    record.write_text(json.dumps({**json.loads(record.read_text(encoding="utf-8")), "owner": name}),
                      encoding="utf-8")
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="back", now=time.time()))
    assert a.wait_outcome(envelope_id, timeout=10)["reply"] == "back"
    a.stop(timeout=10)
    assert [(o["status"], o["reply"]) for o in seen if o["delivery_id"] == envelope_id] == [("replied", "back")]


def test_envelopes_taken_by_a_gateway_killed_while_another_runs_are_adopted_by_it_at_its_next_rescan(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Target side: gateway B took two relayed-in envelopes onto its shelf, the first one's turn running (its
    start mark written), the second queued behind it, never run; gateway A starts beside it (B lives: A leaves
    them), then B is SIGKILLed. At A's next rescan A adopts B's shelf by the start's rule: the started one is
    answered ambiguous (never run twice), the other runs once, on A. Before, they stayed on the dead shelf
    until some gateway started again on the root: their senders waited for nobody."""
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    paths = InboxPaths.from_root(mini).ensure()
    envelopes = [seed_envelope(target_connection="mini", target_profile="moxie", message=f"m{n}") for n in range(2)]
    with children(tmp_path) as spawn:
        b = spawn("b", [sys.executable, str(Path(__file__).with_name("relay_dying.py")), str(mini), "mini", "hold"])
        b.wait_json("started", timeout=60)
        for envelope in envelopes:
            post_to_inbox(paths, envelope, "alpha")
        running = b.wait_json("running", timeout=30)["running"]
        (waiting,) = [envelope["id"] for envelope in envelopes if envelope["id"] != running]
        await_condition(lambda: find_on_shelves(paths.taken_parent, f"{waiting}.json")
                        and not (paths.inbox / f"{waiting}.json").exists(), timeout=30,
                        message="B took the second envelope onto its shelf")
        a_runner = RecordingRunner()
        a = start(gateways, mini, a_runner, config={"bot_mode": {"rescan_seconds": 300}}, connection_id="mini")
        assert a_runner.entered == [] and find_on_shelves(paths.taken_parent, f"{waiting}.json")  # B's still
        b.proc.kill()
        b.proc.wait(30)
    rescan(a)
    await_condition(lambda: all(_delivered(mini, envelope["id"]) for envelope in envelopes), timeout=20,
                    message="both envelopes answered")
    a.stop(timeout=10)
    assert [turn.delivery_id for turn in a_runner.entered] == [waiting]  # run once, on A; the started one never
    answered = {envelope["id"]: (_delivered(mini, envelope["id"]) or {}) for envelope in envelopes}
    assert answered[running]["reply"] == "" and "may have been delivered" in answered[running]["error"]
    message = next(envelope["message"] for envelope in envelopes if envelope["id"] == waiting)
    assert answered[waiting]["reply"] == f"ok: {message}"
    assert list((relay(mini) / "taken").iterdir()) == []  # B's shelf adopted and removed, A's closed


def _delivered(root: Path, envelope_id: str) -> dict[str, Any] | None:
    path = relay(root) / "delivered" / f"{envelope_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def test_an_undrained_envelope_whose_reply_budget_ends_with_its_ttl_is_queued_expired(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Equal budgets (the defaults are 900 s and 900 s): never drained means NOT delivered, whichever deadline
    fires first; the reply budget alone (delivery_timeout, "may still be delivered") is for a drained one."""
    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"envelope_ttl_seconds": 1, "reply_wait_seconds": 1}})
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="anyone?"))
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reason"]) == ("failed", "queued_expired"), out
    assert outbox_ids(root) == [] and (relay(root) / "claimed" / f"{envelope_id}.json").exists()


def test_only_a_restart_adopts_an_envelope_found_in_expiring(tmp_path: Path) -> None:
    """At run time only the rename out of outbox/ makes an envelope ours to expire: a file found in
    expiring/ after a drain won the rename (planted, or a copy) is not taken for ours. A restart, whose
    resumed envelope may have been taken by the killed gateway, adopts it."""
    paths = InboxPaths.from_root(make_root(tmp_path, name="alpha")).ensure()
    envelope = seed_envelope(target_connection="mini", target_profile="moxie")
    rf.enqueue_envelope(paths.relay, envelope)
    shutil.copy(paths.relay.outbox / f"{envelope['id']}.json", paths.expiring / f"{envelope['id']}.json")
    assert rf.claim_envelope(paths.relay, envelope["id"]) is not None  # a drain wins the rename
    assert claim_for_expiry(paths, envelope["id"]) is None
    assert claim_for_expiry(paths, envelope["id"], adopt=True) == paths.expiring / f"{envelope['id']}.json"


def test_ttl_zero_disables_expiry(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"envelope_ttl_seconds": 0, "reply_wait_seconds": 0.6}})
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="hold on"))
    out = gw.wait_outcome(envelope_id, timeout=5)
    assert out["reason"] == "delivery_timeout"  # the reply budget ended it, not a TTL
    assert outbox_ids(root) == [envelope_id]  # still queued for a late drain
    assert not (relay(root) / "replies" / f"{envelope_id}.json").exists()


def test_the_drain_side_refuses_an_expired_envelope_and_does_not_run_it(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path, name="alpha")
    rec = RecordingRunner()
    start(gateways, root, rec)  # default TTL: 900 s
    paths = InboxPaths.from_root(root)
    old = seed_envelope(target_connection="alpha", target_profile="bob", created_at=time.time() - 10_000)
    post_to_inbox(paths, old, "mini")
    await_condition((paths.delivered / f"{old['id']}.json").exists, timeout=5, message="the refusal record")
    record = json.loads((paths.delivered / f"{old['id']}.json").read_text(encoding="utf-8"))
    assert record["reason"] == "queued_expired" and record["reply"] == ""
    assert record["error"] == (
        "queued message to @bob on alpha expired after 900s waiting for the Desktop to drain it — "
        "it was NOT delivered. Resend once the Desktop reconnects."
    )
    fresh = seed_envelope(target_connection="alpha", target_profile="bob")
    post_to_inbox(paths, fresh, "mini")
    await_condition((paths.delivered / f"{fresh['id']}.json").exists, timeout=5, message="the fresh reply")
    assert [t.delivery_id for t in rec.entered] == [fresh["id"]]
    assert not find_on_shelves(paths.taken_parent, f"{old['id']}.json")  # taken off the shelf once answered


def test_housekeep_sweeps_only_stale_relay_files(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, name="alpha")
    gw = start(gateways, root)
    # the sweep of the first tick after the start, done now: it cannot take the old files below before the
    # count is asked for (the next tick's sweep is an hour away)
    gw.housekeep()
    paths = RelayPaths.from_root(root)
    files: dict[str, list[Path]] = {"old": [], "new": []}
    for age in ("old", "new"):
        env = seed_envelope(target_connection="mini", target_profile="moxie", from_profile="zed")
        files[age].append(rf.enqueue_envelope(paths, env))
        claimed_env = seed_envelope(target_connection="mini", target_profile="moxie", from_profile="zed")
        claimed = rf.claim_envelope(paths, claimed_env["id"]) if rf.enqueue_envelope(paths, claimed_env) else None
        assert claimed is not None
        files[age].append(claimed)
        rid = uuid.uuid4().hex
        rf.write_reply(paths, rp.make_reply(rid, reply="x", now=time.time()))
        files[age].append(paths.replies / f"{rid}.json")
        leftover = InboxPaths.from_root(root).expiring / f"{uuid.uuid4().hex}.json"  # a kill left it behind
        leftover.write_text("{}", encoding="utf-8")
        files[age].append(leftover)
    seven_hours_ago = time.time() - 7 * 3600
    for path in files["old"]:
        os.utime(path, (seven_hours_ago, seven_hours_ago))

    removed = gw.housekeep()
    assert removed >= 4
    assert [p.exists() for p in files["old"]] == [False, False, False, False]
    assert [p.exists() for p in files["new"]] == [True, True, True, True]


def test_a_gateway_started_just_now_sweeps_artifacts_older_than_6_h(tmp_path: Path, gateways: list[Gateway]) -> None:
    """Regression (soak review): the sweep ran only after an hour of uptime, timed from the start, so a gateway
    run for minutes or restarted more often than hourly never swept, and ``claimed/``, ``replies/`` and
    ``consumed/`` (each relay DM's text among them) only grew. The first tick after the start sweeps now."""
    root = make_root(tmp_path, name="alpha")
    inbox = InboxPaths.from_root(root).ensure()  # as an earlier run left it
    paths = inbox.relay
    seven_hours_ago = time.time() - 7 * 3600
    files: dict[str, list[Path]] = {"old": [], "new": []}
    for age in ("old", "new"):
        envelope = seed_envelope(target_connection="mini", target_profile="moxie", from_profile="zed")
        claimed = paths.claimed / f"{envelope['id']}.json"
        seed_write_json(claimed, envelope, prefix=".env-")
        rid = uuid.uuid4().hex
        rf.write_reply(paths, rp.make_reply(rid, reply="the text of a DM", now=time.time()))
        consumed = inbox.consumed / f"{rid}.json"
        seed_write_json(consumed, {"id": rid, "at": int(time.time())})
        delivered = inbox.delivered / f"{uuid.uuid4().hex}.json"
        seed_write_json(delivered, {"id": delivered.stem, "at": 1, "reply": "x", "error": "", "reason": "",
                                    "reply_connection": "mini"})
        files[age] += [claimed, paths.replies / f"{rid}.json", consumed, delivered]
    for path in files["old"]:
        os.utime(path, (seven_hours_ago, seven_hours_ago))

    start(gateways, root)
    await_condition(lambda: not any(p.exists() for p in files["old"]), timeout=30,
                    message="the artifacts older than 6 h swept soon after the start")
    assert [p.exists() for p in files["new"]] == [True, True, True, True]


def test_a_failing_housekeeping_is_logged_and_the_relay_goes_on(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep runs on the RelayActor's tick: an error in it (a bug, as a directory outside bot_relay/ handed to
    a check that wants it inside) stopped the RelayActor, and with it every relayed DM of the root."""
    def broken(*_args: Any, **_kwargs: Any) -> int:
        raise ValueError("a sweep's own bug")

    monkeypatch.setattr(rf, "sweep_stale", broken)
    root = make_root(tmp_path, {"moxie": {}}, name="mini")
    with LogCapture("ERROR") as logs:
        start(gateways, root, RecordingRunner(), connection_id="mini")
        await_condition(lambda: logs.matching("relay housekeeping failed"), timeout=30,
                        message="the housekeeping failure logged")
    envelope = seed_envelope(target_connection="mini", target_profile="moxie", message="still relayed")
    post_to_inbox(InboxPaths.from_root(root), envelope, "alpha")
    delivered = relay(root) / "delivered" / f"{envelope['id']}.json"
    await_condition(delivered.exists, timeout=30, message="the DM relayed after the failed sweep")


def test_the_first_reply_written_wins(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"rescan_seconds": 300}})
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="who wins?"))
    writer = (
        "import sys, time\n"
        "from hermes_actors.store import relay_files as rf, relay_protocol as rp\n"
        "from hermes_actors.store.relay_paths import RelayPaths\n"
        "paths = RelayPaths.from_root(sys.argv[1])\n"
        "ok = rf.write_reply(paths, rp.make_reply(sys.argv[2], reply=sys.argv[3], now=time.time()))\n"
        "print('stored' if ok else 'lost')\n"
    )
    results = [
        subprocess.run([sys.executable, "-c", writer, str(root), envelope_id, text], capture_output=True, text=True,
                       check=True, timeout=30).stdout.strip()
        for text in ("first", "second")
    ]
    assert results == ["stored", "lost"]
    out = gw.wait_outcome(envelope_id, timeout=5)
    assert out["reply"] == "first"
    stored = json.loads((relay(root) / "replies" / f"{envelope_id}.json").read_text(encoding="utf-8"))
    assert stored["reply"] == "first"


def test_a_reply_planted_for_an_id_this_root_never_sent_is_no_outcome(tmp_path: Path, gateways: list[Gateway]) -> None:
    """Regression (hostile review): a ``replies/<id>.json`` for an id nobody sent on this root made
    ``wait_outcome`` (and ``hermes-actors outcome``) answer ``replied`` with its text, where DESIGN 3 says
    ``KeyError``. A reply counts only for an envelope the root sent (its ``sent/`` record, then its
    ``consumed/`` mark): in memory (``durable=False``, no journal) a real relayed DM is still answered from
    the files once it settled, by the stopped gateway and by one not started yet."""
    root = sender_root(tmp_path)
    gw = start_gateway(gateways, root, connection_id="alpha", durable=False)
    never = uuid.uuid4().hex
    seed_write_json(relay(root) / "replies" / f"{never}.json", reply_record(never, reply="UNSOLICITED"))
    with pytest.raises(KeyError):
        gw.wait_outcome(never, timeout=0)
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="ping"))
    seed_write_json(relay(root) / "replies" / f"{envelope_id}.json", reply_record(envelope_id, reply="pong"))
    assert gw.wait_outcome(envelope_id, timeout=20)["reply"] == "pong"
    # reported: the relay marks it consumed/, then drops its sent/ record (no journal keeps it in memory)
    await_condition(lambda: not (relay(root) / "sent" / f"{envelope_id}.json").exists(), timeout=10,
                    message="the sent record of the settled DM cleared")
    assert (relay(root) / "consumed" / f"{envelope_id}.json").exists()
    gw.stop()
    with pytest.raises(KeyError):
        gw.wait_outcome(never, timeout=0)
    unknown = find_outcome(root, never)
    assert unknown["status"] == "unknown" and "this root never sent it" in unknown["error"], unknown
    found = find_outcome(root, envelope_id)
    assert (found["status"], found["reply"]) == ("replied", "pong"), found
    fresh = Gateway(root, runner=RecordingRunner(), connection_id="alpha", durable=False)  # never started
    assert fresh.wait_outcome(envelope_id, timeout=0)["reply"] == "pong"
    with pytest.raises(KeyError):
        fresh.wait_outcome(never, timeout=0)


# ── 6. the reply budget ─────────────────────────────────────────────────────


def test_no_reply_within_the_budget_is_a_non_retryable_delivery_timeout(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"reply_wait_seconds": 1.0}})
    started = time.monotonic()  # before the send: the reply budget (on the same monotonic clock) begins after it
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="hello?"))
    out = gw.wait_outcome(envelope_id, timeout=10)
    # It waited its whole budget: exact, so a slow machine cannot fail it; and 1 s, so that a budget that ran out
    # at once could pass only on a machine that took a second to send one DM.
    assert time.monotonic() - started >= 1.0
    assert out["status"] == "failed" and out["reason"] == "delivery_timeout"
    assert out["retryable"] is False
    assert "do not resend blindly" in out["text"] and "within 1s" in out["error"]
    assert outbox_ids(root) == [envelope_id]  # the envelope may still be drained: hence "do not resend"
    # A reply arriving after the budget changes nothing.
    seed_write_json(relay(root) / "replies" / f"{envelope_id}.json", reply_record(envelope_id, reply="late"))
    assert gw.wait_outcome(envelope_id, timeout=1)["reason"] == "delivery_timeout"


def test_a_taken_envelope_unanswered_past_its_ttl_and_the_grace_says_so(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (uxbatch): past its TTL, an envelope someone took from our outbox/ gets a grace for its taker's
    queued_expired; when none came, the delivery_timeout still said "No reply ... within {reply_wait}s", hiding
    the grace and that the envelope had been taken past its TTL. The text now says what happened."""
    monkeypatch.setattr(outbound_module, "EXPIRY_ANSWER_GRACE_SECONDS", 0.5)
    root = sender_root(tmp_path)
    # 3 s: the drain below takes the envelope long before the TTL, even on a loaded machine
    gw = start(gateways, root, config={"bot_mode": {"envelope_ttl_seconds": 3, "reply_wait_seconds": 3}})
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="anyone?"))
    assert rf.claim_envelope(RelayPaths.from_root(root), envelope_id) is not None  # the Desktop takes it, mute
    out = gw.wait_outcome(envelope_id, timeout=20)
    assert (out["status"], out["reason"]) == ("failed", "delivery_timeout"), out
    assert out["error"].startswith("No reply from @moxie on mini within 3.5s: its 3s TTL ran out after the "
                                   "Desktop or the hub had taken it from the relay's outbox/, and no "
                                   "queued_expired answer came in the 0.5s after.")
    assert out["error"] == outbound_module.no_reply_text("@moxie on mini", 3, ttl=3, grace=0.5)
    assert "do not resend blindly" in out["text"]


def test_the_sender_side_expiry_text_names_the_connection_id_like_the_seed(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = sender_root(tmp_path, [remote_row("moxie", "mini", online=True, label="Mini Mac")])
    gw = start(gateways, root, config={"bot_mode": {"envelope_ttl_seconds": 1}})
    ack = gw.message_agent(sender="alice", target="moxie", message="anyone?")
    assert ack["to"] == "@moxie on Mini Mac"  # the label is for people ...
    out = gw.wait_outcome(queued(ack), timeout=5)
    # ... the reply file carries the seed's text, built from the envelope (target_connection), as a drain writes it.
    assert out["error"] == rp.expired_error_text("moxie", "mini", 1)


@pytest.mark.parametrize(
    ("behave", "expected"),
    [
        ("[SILENT]", ("silent", "", "")),
        ("", ("silent", "", "")),
        ("raise", ("failed", "", "target_busy")),
    ],
)
def test_silence_and_failures_travel_back_through_the_relay(
    behave: str, expected: tuple[str, str, str], tmp_path: Path, gateways: list[Gateway]
) -> None:
    from hermes_actors import TurnFailed

    alpha = make_root(tmp_path, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")

    def runner(turn: Any) -> str:
        if behave == "raise":
            raise TurnFailed("moxie's session is owned elsewhere", reason="target_busy")
        return behave

    start(gateways, mini, runner, connection_id="mini")
    gw = start(gateways, alpha)
    with hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: any(r["handle"] == "moxie" and r["online"] is True for r in gw.roster()),
                        timeout=10, message="moxie online through the hub")
        out = gw.wait_outcome(queued(gw.message_agent(sender="alice", target="moxie", message="fyi")), timeout=10)
    assert (out["status"], out["reply"], out["reason"]) == expected
    if behave == "raise":
        assert "moxie's session is owned elsewhere" in out["error"]


def test_a_failing_expiry_write_still_reports_queued_expired_and_the_relay_keeps_running(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.errors import StoreError

    root = sender_root(tmp_path)
    gw = start(gateways, root, config={"bot_mode": {"envelope_ttl_seconds": 1, "rescan_seconds": 300}})
    real_write_reply = rf.write_reply

    def disk_full(*args: Any, **kwargs: Any) -> bool:
        raise StoreError("cannot create replies/x.json: No space left on device (ENOSPC)")

    monkeypatch.setattr(rf, "write_reply", disk_full)
    expired = queued(gw.message_agent(sender="alice", target="moxie", message="anyone?"))
    out = gw.wait_outcome(expired, timeout=5)
    assert (out["status"], out["reason"]) == ("failed", "queued_expired")
    assert (relay(root) / "claimed" / f"{expired}.json").exists()  # we hold the claim: never delivered late
    monkeypatch.setattr(rf, "write_reply", real_write_reply)
    assert gw.stats()["relay_alive"]
    # The relay still works once the disk does: the next expiry writes its reply file. (Not a reply race
    # against the 1 s TTL, which a loaded machine can lose.)
    later = queued(gw.message_agent(sender="alice", target="moxie", message="again"))
    out = gw.wait_outcome(later, timeout=10)
    assert (out["status"], out["reason"]) == ("failed", "queued_expired")
    assert (relay(root) / "replies" / f"{later}.json").exists()


def test_an_ambiguous_turn_on_the_receiving_side_is_ambiguous_for_the_sender(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: the receiver killed mid-turn answered 'may have been delivered — do not resend', and the
    sender reported it failed [unknown] (the reply file has no status field)."""
    from hermes_actors.core import outcomes
    from hermes_actors.relay.relay_actor import reply_from_outcome

    root = sender_root(tmp_path)
    gw = start(gateways, root)
    envelope_id = queued(gw.message_agent(sender="alice", target="moxie", message="ping"))
    answered = outcomes.ambiguous(envelope_id, "@moxie", "The receiving gateway stopped or crashed during the turn.")
    seed_write_json(relay(root) / "replies" / f"{envelope_id}.json",
                    {"id": envelope_id, "at": int(time.time()), **reply_from_outcome(answered)})
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["retryable"]) == ("ambiguous", False)
    assert out["text"] == ("Delivery to @moxie on mini is ambiguous: The receiving gateway stopped or crashed "
                           "during the turn. The message may have been delivered — do not resend.")
    gw.stop()
    assert find_outcome(root, envelope_id)["status"] == "ambiguous"  # `outcome` reads the files the same way
