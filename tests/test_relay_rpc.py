"""The seed's relay RPC operations on the Gateway: roster sync, outbox drain, deliver, reply."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from roots import RecordingRunner, make_root

from hermes_actors import Gateway, ValidationError
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_roster import normalize_roster_row


def test_a_desktop_style_round_trip_through_the_rpc_methods(tmp_path: Path) -> None:
    sender_root, target_root = make_root(tmp_path / "a"), make_root(tmp_path / "b")
    runner = RecordingRunner(lambda turn: "from bob over the relay")
    with Gateway(sender_root, runner=lambda t: "x", durable=False) as sender, \
            Gateway(target_root, runner=runner, durable=False) as target:
        kept = sender.relay_sync_roster([
            {"profile": "bob", "handle": "bob", "connection_id": "mini", "online": True},
            {"profile": "../evil", "connection_id": "mini"},  # refused by the seed's normalization
            {"profile": "carol", "connection_id": "mini", "online": "yes"},  # online dropped: not a bool
        ])
        assert kept == 2
        ack = sender.message_agent(sender="alice", target="bob@mini", message="hello across")
        assert ack["status"] == "queued"
        drained = sender.relay_drain_outbox()
        assert [e["id"] for e in drained] == [ack["delivery_id"]]
        assert sender.relay_drain_outbox() == []  # claimed by rename: a second drain gets nothing
        fields = target.relay_deliver(drained[0], timeout=10)
        assert fields == {"reply": "from bob over the relay", "error": "", "reason": ""}
        assert target.relay_deliver(drained[0], timeout=10) == fields  # idempotent: no second turn
        assert len(runner.entered) == 1
        assert sender.relay_reply(ack["delivery_id"], **fields) is True
        assert sender.relay_reply(ack["delivery_id"], error="late") is False  # the first reply wins
        outcome = sender.wait_outcome(ack["delivery_id"], timeout=10)
    assert outcome["status"] == "replied"
    assert outcome["text"] == "Reply from @bob on mini: from bob over the relay"


def test_drain_expires_old_envelopes_and_reply_classifies_a_missing_reason(tmp_path: Path) -> None:
    root = make_root(tmp_path / "a")
    paths = RelayPaths.from_root(root).ensure()
    old = rp.make_envelope(target=normalize_roster_row({"profile": "bob", "connection_id": "mini"}),  # type: ignore[arg-type]
                           message="stale", sender_profile="alice", sender_handle="alice", now=time.time() - 3600)
    rf.enqueue_envelope(paths, old)
    with Gateway(root, runner=lambda t: "x", durable=False) as gw:
        assert gw.relay_drain_outbox() == []
        expired = rf.read_reply(paths, old["id"])
        assert expired is not None and expired["reason"] == "queued_expired"
        other = uuid.uuid4().hex
        assert gw.relay_reply(other, error="429 Too Many Requests") is True
        assert rf.read_reply(paths, other)["reason"] == "provider_rate_limit"  # type: ignore[index]
        with pytest.raises(ValidationError):
            gw.relay_reply("../../etc", reply="x")
        with pytest.raises(ValidationError):
            gw.relay_deliver({"id": "nope"})


def test_deliver_to_an_unknown_profile_answers_the_call_with_the_failure(tmp_path: Path) -> None:
    root = make_root(tmp_path / "b")
    target = normalize_roster_row({"profile": "nobody", "connection_id": "mini"})
    assert target is not None
    envelope = rp.make_envelope(target=target, message="hi", sender_profile="alice", sender_handle="alice",
                                now=time.time())
    runner = RecordingRunner(lambda turn: "never")
    with Gateway(root, runner=runner, durable=False) as gw:
        fields = gw.relay_deliver(envelope, timeout=10)
    assert fields["reply"] == "" and fields["reason"] == "unknown"
    assert fields["error"] == "No agent 'nobody' on this gateway; the message was NOT delivered."
    assert runner.entered == []
