"""The one relay drain step (relay/drain.py): claim by rename → read → quarantine → expire."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hermes_actors.core.ids import new_delivery_id
from hermes_actors.relay.drain import Expired, NotOurs, Quarantined, ToDeliver, drain_envelope, drain_outbox
from hermes_actors.store import relay_files as rf
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.relay_protocol import make_envelope
from hermes_actors.store.relay_roster import normalize_roster_row

NOW = 1_700_000_000.0
TTL = 900.0


def _envelope(age: float) -> dict[str, Any]:
    target = normalize_roster_row({"profile": "bob", "connection_id": "mini"})
    assert target is not None
    return make_envelope(target=target, message="hi", sender_profile="alice", sender_handle="alice", now=NOW - age)


@pytest.fixture
def paths(tmp_path: Path) -> InboxPaths:
    return InboxPaths.from_root(tmp_path).ensure()


def _queue(paths: InboxPaths, box: str, envelope: dict[str, Any]) -> None:
    if box == "outbox":
        rf.enqueue_envelope(paths.relay, envelope)
    else:
        post_to_inbox(paths, envelope, "studio")


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize(
    ("age", "ttl", "expected"),
    [
        (10.0, TTL, ToDeliver),  # fresh
        (TTL + 10, TTL, Expired),  # waited past the TTL: answered, not delivered
        (TTL + 10, 0.0, ToDeliver),  # ttl <= 0 never expires
    ],
)
def test_a_queued_envelope_is_claimed_once_and_delivered_or_expired(
    paths: InboxPaths, box: Any, age: float, ttl: float, expected: type
) -> None:
    envelope = _envelope(age)
    _queue(paths, box, envelope)
    result = drain_envelope(paths, box, envelope["id"], ttl=ttl, now=NOW)
    assert type(result) is expected
    assert isinstance(result, ToDeliver | Expired) and result.envelope["id"] == envelope["id"]
    assert result.reply_connection == ("studio" if box == "inbox" else "")
    if isinstance(result, Expired):
        assert result.reply["reason"] == "queued_expired" and "expired after 900s" in result.reply["error"]
    # The rename decided: a second drainer finds nothing.
    assert drain_envelope(paths, box, envelope["id"], ttl=ttl, now=NOW) == NotOurs(envelope["id"])


@pytest.mark.parametrize("box", ["outbox", "inbox"])
def test_a_corrupt_envelope_is_quarantined_not_delivered(paths: InboxPaths, box: Any) -> None:
    envelope_id = new_delivery_id()
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    (directory / f"{envelope_id}.json").write_text(json.dumps({"id": envelope_id, "message": 7}))
    result = drain_envelope(paths, box, envelope_id, ttl=TTL, now=NOW)
    assert isinstance(result, Quarantined) and result.envelope_id == envelope_id
    assert [name for name in os.listdir(paths.relay.quarantine) if name.startswith(envelope_id)]


def test_a_missing_envelope_is_not_ours(paths: InboxPaths) -> None:
    envelope_id = new_delivery_id()
    assert drain_envelope(paths, "outbox", envelope_id, ttl=TTL, now=NOW) == NotOurs(envelope_id)


def test_a_bad_id_is_not_ours_and_names_why(paths: InboxPaths) -> None:
    result = drain_envelope(paths, "inbox", "../etc", ttl=TTL, now=NOW)
    assert isinstance(result, NotOurs) and "invalid envelope id" in result.why


def test_drain_outbox_returns_the_fresh_and_answers_the_expired(paths: InboxPaths) -> None:
    fresh, stale = _envelope(10.0), _envelope(TTL + 10)
    for envelope in (fresh, stale):
        rf.enqueue_envelope(paths.relay, envelope)
    assert drain_outbox(paths, ttl=TTL, now=NOW) == [fresh]
    reply = rf.read_reply(paths.relay, stale["id"])
    assert reply is not None and reply["reason"] == "queued_expired"
    assert rf.read_reply(paths.relay, fresh["id"]) is None
    assert drain_outbox(paths, ttl=TTL, now=NOW) == []
