"""A relayed DM whose ``sent/`` record is damaged while its gateway is down still gets its outcome after the restart.

The fuzz review's case (``repro_sent.py``): a gateway sends one DM to ``moxie@mini`` through the file relay, goes
down (killed, or stopped: either leaves the ``sent/`` record and the envelope in ``outbox/``), its
``sent/<id>.json`` is truncated, replaced by a FIFO or by another user's file, and it starts again. The start
quarantines the record ("not a valid sent record"), as before, never following it; before, nothing settled the DM
from then on: ``pending: relayed; waiting for the reply`` for good, its envelope never expired, and a reply written
afterwards did not settle it either. Now the start rebuilds the record from the DM's envelope (validated as any
envelope is) and waits for the DM as for any of its own; with no envelope left to rebuild it from, the DM is
settled ``ambiguous`` ("may still be delivered; do not resend blindly") unless its reply is already there.
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
def test_a_reply_settles_a_relayed_dm_whose_sent_record_was_damaged_and_wakes_its_sender(
    durable: bool, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Fuzz review: a reply written into replies/ after the restart did not settle the DM whose record the start
    quarantined. Now it does, in durable and in memory mode alike (the relay's files are the same), and the
    record rebuilt from the envelope names the DM's sender: its outcome wakes alice as it would have."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 0, "reply_wait_seconds": 60, "wake_sender": True}}
    envelope_id = sent_then_down(root, config, durable=durable)
    _truncate(relay(root) / "sent" / f"{envelope_id}.json")
    runner = RecordingRunner(lambda turn: "noted")
    gw = start_gateway(gateways, root, runner, config, connection_id="alpha", durable=durable)
    rf.write_reply(RelayPaths.from_root(root), rp.make_reply(envelope_id, reply="late but here", now=time.time()))
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reply"], out["from"]) == ("replied", "late but here", "@moxie on mini"), out
    assert gw.wait_outcome(wake_id(envelope_id), timeout=10)["status"] == "replied"  # the sender's wake ran
    (turn,) = [t for t in runner.entered if t.profile == "alice"]
    assert "late but here" in turn.content


def test_a_damaged_record_whose_envelope_left_outbox_is_settled_ambiguous_not_left_pending(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """The record damaged and the envelope no longer anywhere in this root's relay (the hub took it on, say): where
    the DM is cannot be known, so the start settles it ``ambiguous`` at once ("may still be delivered; do not
    resend blindly"), never leaves it pending. Before, ``wait_outcome`` said another gateway held it."""
    root = sender_root(tmp_path)
    config = {"bot_mode": {"envelope_ttl_seconds": 1, "reply_wait_seconds": 60}}
    envelope_id = sent_then_down(root, config)
    _truncate(relay(root) / "sent" / f"{envelope_id}.json")
    (relay(root) / "outbox" / f"{envelope_id}.json").unlink()
    with LogCapture("WARNING") as logs:
        gw = start_gateway(gateways, root, RecordingRunner(), config, connection_id="alpha")
    out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["retryable"], out["from"]) == ("ambiguous", False, "the relayed target"), out
    assert "may still be delivered; do not resend blindly" in out["error"], out
    assert any(envelope_id in line and "ambiguous" in line for line in logs.lines), logs.lines
    await_condition(lambda: record_gone(root, envelope_id), timeout=10, message="the record dropped once reported")


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
    """``scan_sent`` on damaged records (each truncated): one whose envelope is in outbox/ is rebuilt from it and
    waited for, its record written again naming our shelf; one with no envelope left is ``blind``; one whose outcome
    was reported (``consumed/``) is left alone; one its killed sender never queued (its staged file there, the lock
    free) is ``never_queued`` as with an intact record; one a living sender is queueing (its staged file locked) is
    left to it, and no record naming our shelf is written for it (that sender would then drop its DM unreported)."""
    root = sender_root(tmp_path)
    plain = InboxPaths.from_root(root).ensure()
    paths = dataclasses.replace(plain, taken=plain.taken_parent / f"s-{uuid.uuid4().hex}")
    paths.taken.mkdir(mode=0o700)

    def damaged(envelope_id: str) -> None:
        (paths.sent / f"{envelope_id}.json").write_text('{"id": "' + envelope_id[:5])

    queued_env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=1_790_000_000)
    rf.enqueue_envelope(paths.relay, queued_env)
    gone, reported, unqueued = (uuid.uuid4().hex for _ in range(3))
    for envelope_id in (queued_env["id"], gone, reported, unqueued):
        damaged(envelope_id)
    mark_consumed(paths, reported, now=time.time())
    (paths.relay.tmp / queueing_name(unqueued)).write_text("{}")  # staged by a sender killed before the rename

    living = seed_envelope(target_connection="mini", target_profile="moxie")
    scans: list[SentScan] = []

    def damaged_then_a_start_scans() -> None:  # the living sender's record, damaged while it queues the envelope
        damaged(living["id"])
        scans.append(scan_sent(paths))

    rf.enqueue_envelope(paths.relay, living, staged_as=queueing_name(living["id"]),
                        before_queued=damaged_then_a_start_scans)
    (scan,) = scans
    rebuilt = SentRecord(queued_env["id"], 1_790_000_000.0, "@moxie on mini", "alice", "alice", 0, None,
                         paths.taken.name)
    assert scan.ours == [rebuilt] and read_sent(paths, queued_env["id"]) == rebuilt
    assert [r.envelope_id for r in scan.blind] == [gone]
    assert read_sent(paths, gone) == SentRecord(gone, int(scan.blind[0].at), "the relayed target",
                                                owner=paths.taken.name)
    assert [r.envelope_id for r in scan.never_queued] == [unqueued] and list(scan.withdrawn) == [unqueued]
    os.close(scan.withdrawn[unqueued])
    assert read_sent(paths, unqueued) is not None
    assert read_sent(paths, reported) is None  # reported already: nothing to rebuild
    assert scan.live == 1 and read_sent(paths, living["id"]) is None  # left to its living sender
    assert scan.quarantined == 5 and scan.not_ours == 0
