"""A relayed DM whose ``sent/`` record is damaged while its gateway is down still gets its outcome after the restart.

The fuzz review's case (``repro_sent.py``): a gateway sends one DM to ``moxie@mini`` through the file relay, goes
down (killed, or stopped: either leaves the ``sent/`` record and the envelope in ``outbox/``), its
``sent/<id>.json`` is truncated, replaced by a FIFO or by another user's file, and it starts again. The start
quarantines the record ("not a valid sent record"), as before, never following it; before, nothing settled the DM
from then on: ``pending: relayed; waiting for the reply`` for good, its envelope never expired, and a reply written
afterwards did not settle it either. Now the start rebuilds the record from the DM's envelope (validated as any
envelope is) and waits for the DM as for any of its own; with no envelope left to rebuild it from, the DM is
settled ``ambiguous`` ("may still be delivered; do not resend blindly") unless its reply is already there.

The file name is the only evidence such a record gives, so (diffrev29 review) the start takes the DM only when it
is provably this root's gateways' and no other gateway of ours running on the root may own it: another gateway
alive → the record is left to it; an envelope that is not ours (a seed gateway's: no ``hop``) → left alone; no
envelope and nothing else naming the id → no outcome is invented; the rebuilt record wakes nobody unless the
envelope says so (the sender may have sent it with wake off).
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import remote_row, seed_envelope, write_roster_file
from roots import LogCapture, RecordingRunner, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core.wake import wake_id
from hermes_actors.relay.restart import SentScan, scan_sent
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_inbox import InboxPaths, mark_consumed
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_sent import SentRecord, queueing_name, read_sent

NOBODY = 65534


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 5)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _another_users(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving the record to another user (nobody) needs root; this test runs as uid "
                    f"{os.geteuid()}")
    os.chown(path, NOBODY, NOBODY)


DAMAGE = {"trunc": _truncate, "fifo": _fifo, "another-users": _another_users}


def relay(root: Path) -> Path:
    return root / "bot_relay"


def sender_root(tmp_path: Path) -> Path:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    return root


def sent_then_down(root: Path, config: dict[str, Any], *, durable: bool = True) -> str:
    """A gateway on ``root`` sends one DM to moxie@mini and stops: its sent/ record and envelope stay."""
    with Gateway(root, runner=RecordingRunner(), config=config, connection_id="alpha", durable=durable) as gw:
        ack = gw.message_agent(sender="alice", target="moxie", message="are you there?")
    assert ack.get("status") == "queued", ack
    envelope_id = str(ack["delivery_id"])
    assert (relay(root) / "sent" / f"{envelope_id}.json").is_file()
    assert (relay(root) / "outbox" / f"{envelope_id}.json").is_file()
    return envelope_id


def quarantined(root: Path, envelope_id: str) -> list[str]:
    return [p.name for p in (relay(root) / "quarantine").iterdir() if p.name.startswith(f"{envelope_id}.json.")]


def record_gone(root: Path, envelope_id: str) -> bool:
    return not os.path.lexists(relay(root) / "sent" / f"{envelope_id}.json")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_relayed_dm_whose_sent_record_is_damaged_still_expires_not_delivered_after_the_restart(
    damage: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Fuzz review (``repro_sent.py trunc|fifo|nobody``): the record quarantined, the DM was pending for good and
    its envelope never expired. Now the restart waits for it from its envelope, and its TTL ends it
    ``queued_expired`` (NOT delivered): the envelope was still in our outbox/, and we took it out."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 1, "reply_wait_seconds": 60}}
    envelope_id = sent_then_down(root, config)
    DAMAGE[damage](relay(root) / "sent" / f"{envelope_id}.json")
    gw = start_gateway(gateways, root, RecordingRunner(), config, connection_id="alpha")
    assert quarantined(root, envelope_id)  # the damaged record is moved aside, never followed
    out = gw.wait_outcome(envelope_id, timeout=20)
    assert (out["status"], out["reason"]) == ("failed", "queued_expired"), out
    assert out["from"] == "@moxie on mini" and "it was NOT delivered" in out["error"], out
    assert rf.list_ids(relay(root) / "outbox") == []  # taken back: nobody drains it late
    assert (relay(root) / "claimed" / f"{envelope_id}.json").is_file()
    await_condition(lambda: record_gone(root, envelope_id), timeout=10, message="the rebuilt record dropped once "
                    "reported")


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "memory"])
def test_a_reply_settles_a_relayed_dm_whose_sent_record_was_damaged_and_wakes_nobody(
    durable: bool, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Fuzz review: a reply written into replies/ after the restart did not settle the DM whose record the start
    quarantined. Now it does, in durable and in memory mode alike (the relay's files are the same). Whether its
    outcome wakes alice was in the damaged record only: the rebuilt one says no wake (diffrev29: it said "the host
    decides", and a host with ``wake_sender`` on ran a wake turn nobody may have asked for)."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 0, "reply_wait_seconds": 60, "wake_sender": True}}
    envelope_id = sent_then_down(root, config, durable=durable)
    _truncate(relay(root) / "sent" / f"{envelope_id}.json")
    runner = RecordingRunner(lambda turn: "noted")
    gw = start_gateway(gateways, root, runner, config, connection_id="alpha", durable=durable)
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="late but here", now=time.time()))
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reply"], out["from"]) == ("replied", "late but here", "@moxie on mini"), out
    assert gw.stats()["wakes_sent"] == 0  # decided when the outcome was published, before wait_outcome answered
    with pytest.raises(KeyError):
        gw.wait_outcome(wake_id(envelope_id), timeout=1)
    assert runner.entered == []


def test_a_dm_sent_with_wake_off_whose_record_is_damaged_does_not_wake_its_sender(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """diffrev29 (``s2_wake.py``): a DM sent with wake off (``"wake": false`` in its record, as ``hermes-actors
    send`` sends) whose record was then damaged was rebuilt with the wake undecided, and the next host, with
    ``wake_sender`` on, woke alice with its outcome: a turn nobody asked for. Now the rebuilt record wakes nobody."""
    root = sender_root(tmp_path)
    envelope_id = sent_then_down(root, {"bot_mode": {"envelope_ttl_seconds": 0, "wake_sender": False}})
    record = relay(root) / "sent" / f"{envelope_id}.json"
    assert '"wake":false' in record.read_text().replace(" ", "")
    _truncate(record)
    runner = RecordingRunner(lambda turn: "noted")
    gw = start_gateway(gateways, root, runner, {"bot_mode": {"envelope_ttl_seconds": 0, "wake_sender": True}},
                       connection_id="alpha")
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="here", now=time.time()))
    assert gw.wait_outcome(envelope_id, timeout=10)["status"] == "replied"
    assert gw.stats()["wakes_sent"] == 0
    with pytest.raises(KeyError):
        gw.wait_outcome(wake_id(envelope_id), timeout=1)
    assert [t.profile for t in runner.entered] == []


def test_a_damaged_record_whose_envelope_cannot_be_read_is_settled_ambiguous_not_left_pending(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """The record damaged and the DM's envelope no longer readable (claimed by a drain, then damaged too): the relay
    still names the DM, but where it is cannot be known, so the start settles it ``ambiguous`` at once ("may still
    be delivered; do not resend blindly"), never leaves it pending. Before, ``wait_outcome`` said another gateway
    held it. (7856f9d's version removed the envelope outright: nothing left naming the id, now no outcome at all.)"""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 1, "reply_wait_seconds": 60}}
    envelope_id = sent_then_down(root, config)
    _truncate(relay(root) / "sent" / f"{envelope_id}.json")
    claimed = relay(root) / "claimed" / f"{envelope_id}.json"
    (relay(root) / "outbox" / f"{envelope_id}.json").rename(claimed)
    _truncate(claimed)
    with LogCapture("WARNING") as logs:
        gw = start_gateway(gateways, root, RecordingRunner(), config, connection_id="alpha")
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["retryable"], out["from"]) == ("ambiguous", False, "the relayed target"), out
    assert "may still be delivered; do not resend blindly" in out["error"], out
    assert any(envelope_id in line and "ambiguous" in line for line in logs.lines), logs.lines
    # dropped once the outcome and the wake it starts are on disk (ForgetSent): a stress run under two busy loops
    # once took longer than 10 s to get there
    await_condition(lambda: record_gone(root, envelope_id), timeout=30, message="the record dropped once reported")


@pytest.mark.parametrize("content", ["garbage", "{"], ids=["garbage", "truncated"])
def test_a_junk_sent_file_for_an_id_nobody_sent_gets_no_outcome(
    content: str, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """diffrev29 (``s2_junk.py``): a junk ``sent/<id>.json`` for an id never acked on the root made the start
    publish an ``ambiguous`` outcome for it (and answer ``wait_outcome``); its file name was the only evidence. Now
    nothing else naming the id, no outcome is invented: a WARNING names the id and the quarantined file."""
    root = sender_root(tmp_path)
    relay(root).joinpath("sent").mkdir(parents=True, exist_ok=True, mode=0o700)
    junk = uuid.uuid4().hex
    (relay(root) / "sent" / f"{junk}.json").write_text(content)
    seen: list[dict[str, Any]] = []
    with LogCapture("WARNING") as logs:
        gw = start_gateway(gateways, root, RecordingRunner(), {"bot_mode": {"wake_sender": True}},
                           connection_id="alpha")
    gw.subscribe(seen.append)
    with pytest.raises(KeyError):  # on the tree before: ambiguous, "may still be delivered"
        gw.wait_outcome(junk, timeout=5)
    assert record_gone(root, junk)  # not written again
    (moved,) = quarantined(root, junk)
    assert any(junk in line and moved in line and "no outcome" in line for line in logs.lines), logs.lines
    gw.stop()
    assert seen == []


def test_a_damaged_record_naming_a_seed_gateways_envelope_leaves_that_envelope_alone(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """diffrev29 (``s2_seed.py``): a seed gateway's envelope in outbox/ (seeds write no sent/ record, and no
    ``hop``) and a junk ``sent/<its id>.json``: the start rebuilt a record from the seed's envelope, took it out of
    outbox/ at our TTL (never delivered), answered it ``queued_expired`` and woke alice. Now an envelope that is not
    provably ours is left to the Desktop or the hub: no record, no outcome, no expiry here."""
    root = sender_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time())
    rf.enqueue_envelope(paths.relay, env)
    (paths.sent / f"{env['id']}.json").write_text("{")
    with LogCapture("WARNING") as logs:
        gw = start_gateway(gateways, root, RecordingRunner(), {"bot_mode": {"envelope_ttl_seconds": 1,
                                                                           "wake_sender": True}},
                           connection_id="alpha")
    # not this gateway's (on the tree before: waited for, then queued_expired): pending in outbox/ for its taker
    with pytest.raises(TimeoutError, match="another gateway"):
        gw.wait_outcome(env["id"], timeout=5)
    assert any(env["id"] in line and "not one of ours" in line for line in logs.lines), logs.lines
    assert record_gone(root, env["id"])
    assert rf.list_ids(relay(root) / "outbox") == [env["id"]]  # nobody of ours took it out


def test_a_damaged_record_is_left_to_the_other_gateway_running_on_the_root(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """diffrev29 (``s2_live.py``): G1, alive, sends a DM; its record is damaged; G2 starts on the same root. G2 took
    the DM over (rewrote the record naming its own shelf) and G1, its sender, dropped its outcome as taken over:
    ``g1.wait_outcome`` timed out. Now G2 leaves the record to the gateway running beside it, unread (a WARNING
    says so), and G1 reports its DM; G2 reports nothing."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 0, "reply_wait_seconds": 60, "rescan_seconds": 0.5}}
    g1 = start_gateway(gateways, root, RecordingRunner(), config, connection_id="alpha")
    envelope_id = queued_id(g1.message_agent(sender="alice", target="moxie", message="are you there?"))
    record = relay(root) / "sent" / f"{envelope_id}.json"
    _truncate(record)
    with LogCapture("WARNING") as logs:
        g2 = start_gateway(gateways, root, RecordingRunner(), config, connection_id="alpha")
    seen2: list[dict[str, Any]] = []
    g2.subscribe(seen2.append)
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="late but here", now=time.time()))
    out = g1.wait_outcome(envelope_id, timeout=10)  # on the tree before: TimeoutError (G1 dropped it, taken over)
    assert (out["status"], out["reply"]) == ("replied", "late but here"), out
    g2.stop()
    assert seen2 == []
    assert quarantined(root, envelope_id) == []  # left in place by G2, unread (G1 removed it once reported)
    assert any(str(record) in line and "another gateway of ours runs on this root" in line for line in logs.lines), \
        logs.lines


def queued_id(ack: dict[str, Any]) -> str:
    assert ack.get("status") == "queued", ack
    return str(ack["delivery_id"])


def test_a_damaged_record_whose_reply_is_already_there_gets_that_reply(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """No envelope left to rebuild the record from, but the reply came while the gateway was down: that reply is the
    DM's outcome, not ``ambiguous``."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 1, "reply_wait_seconds": 60}}
    envelope_id = sent_then_down(root, config)
    _fifo(relay(root) / "sent" / f"{envelope_id}.json")
    (relay(root) / "outbox" / f"{envelope_id}.json").unlink()
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="answered meanwhile",
                                                              now=time.time()))
    gw = start_gateway(gateways, root, RecordingRunner(), config, connection_id="alpha")
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reply"]) == ("replied", "answered meanwhile"), out


def test_a_start_sorts_the_dms_of_damaged_sent_records_and_writes_their_records_again(tmp_path: Path) -> None:
    """``scan_sent`` on damaged records (each truncated): one whose envelope of ours (``hop``, a sender of this root)
    is in outbox/ is rebuilt from it and waited for, its record written again naming our shelf (wake off); one whose
    envelope is a seed's (no ``hop``) is left alone, counted as not ours; one with no envelope but its reply there is
    ``blind``; one that nothing on the relay names is left alone (no outcome invented: 7856f9d made it ``blind``);
    one whose outcome was reported (``consumed/``) is left alone; one its killed sender never queued (its staged file
    there, the lock free) is ``never_queued`` as with an intact record; one a living sender is queueing (its staged
    file locked) is left to it, and no record naming our shelf is written for it (that sender would then drop its
    DM unreported)."""
    root = sender_root(tmp_path)
    plain = InboxPaths.from_root(root).ensure()
    paths = dataclasses.replace(plain, taken=plain.taken_parent / f"s-{uuid.uuid4().hex}")
    paths.taken.mkdir(mode=0o700)

    def damaged(envelope_id: str) -> None:
        (paths.sent / f"{envelope_id}.json").write_text('{"id": "' + envelope_id[:5])

    queued_env = {**seed_envelope(target_connection="mini", target_profile="moxie", created_at=1_790_000_000),
                  "hop": 2}
    seeds_env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=1_790_000_000)
    rf.enqueue_envelope(paths.relay, queued_env)
    rf.enqueue_envelope(paths.relay, seeds_env)
    replied, untraced, reported, unqueued = (uuid.uuid4().hex for _ in range(4))
    for envelope_id in (queued_env["id"], seeds_env["id"], replied, untraced, reported, unqueued):
        damaged(envelope_id)
    rf.write_reply(paths.relay, rp.make_reply(replied, reply="here", now=time.time()))
    mark_consumed(paths, reported, now=time.time())
    (paths.relay.tmp / queueing_name(unqueued)).write_text("{}")  # staged by a sender killed before the rename

    living = seed_envelope(target_connection="mini", target_profile="moxie")
    scans: list[SentScan] = []

    def damaged_then_a_start_scans() -> None:  # the living sender's record, damaged while it queues the envelope
        damaged(living["id"])
        scans.append(scan_sent(paths, profiles={"alice", "bob"}))

    rf.enqueue_envelope(paths.relay, living, staged_as=queueing_name(living["id"]),
                        before_queued=damaged_then_a_start_scans)
    (scan,) = scans
    rebuilt = SentRecord(queued_env["id"], 1_790_000_000.0, "@moxie on mini", "alice", "alice", 2, False,
                         paths.taken.name)
    assert scan.ours == [rebuilt] and read_sent(paths, queued_env["id"]) == rebuilt
    assert read_sent(paths, seeds_env["id"]) is None  # a seed's DM: not ours to write a record for
    assert [r.envelope_id for r in scan.blind] == [replied]
    assert read_sent(paths, replied) == SentRecord(replied, int(scan.blind[0].at), "the relayed target", wake=False,
                                                   owner=paths.taken.name)
    assert read_sent(paths, untraced) is None  # nothing names it: no record, no outcome
    assert [r.envelope_id for r in scan.never_queued] == [unqueued] and list(scan.withdrawn) == [unqueued]
    os.close(scan.withdrawn[unqueued])
    assert read_sent(paths, unqueued) is not None
    assert read_sent(paths, reported) is None  # reported already: nothing to rebuild
    assert scan.live == 1 and read_sent(paths, living["id"]) is None  # left to its living sender
    assert scan.quarantined == 7 and scan.not_ours == 1 and scan.left == 0
