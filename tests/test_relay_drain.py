"""The one relay drain step (relay/drain.py): claim by rename → read → quarantine → expire."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hostile_files import kind_param, place

from hermes_actors.core.ids import new_delivery_id
from hermes_actors.relay import drain as drain_module
from hermes_actors.relay.drain import Expired, NotOurs, Quarantined, ToDeliver, drain_envelope, drain_outbox
from hermes_actors.store import relay_files as rf
from hermes_actors.store import safe_read
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.relay_protocol import make_envelope
from hermes_actors.store.relay_roster import normalize_roster_row
from hermes_actors.store.relay_sent import record_sent
from hermes_actors.store.relay_shelf import Shelf

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


MALFORMED = [
    ({"hop": 1001}, "'hop'"), ({"hop": "3"}, "'hop'"), ({"hop": True}, "'hop'"), ({"hop": -1}, "'hop'"),
    ({"hop": 2.0}, "'hop'"), ({"created_at": [1]}, "'created_at'"), ({"created_at": {"t": 1}}, "'created_at'"),
]


def _plant(paths: InboxPaths, box: str, record: dict[str, Any]) -> None:
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    path = directory / f"{record['id']}.json"
    path.write_text(json.dumps(record))
    path.chmod(0o600)


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize(("bad", "field"), MALFORMED)
def test_a_malformed_envelope_is_quarantined_and_its_sender_told_it_was_not_delivered(
    paths: InboxPaths, box: Any, bad: dict[str, Any], field: str,
) -> None:
    """Regression (seed-interop review, s3): an envelope quarantined for a bad field got no reply, so its sender
    (seed or ours) waited reply_wait_seconds and was then told it "may still be delivered", which is false. Its
    sender is now owed an error reply (reason unknown) naming the field; from inbox/ it goes to its connection."""
    record = {**_envelope(10.0), **bad, **({"reply_connection": "studio"} if box == "inbox" else {})}
    _plant(paths, box, record)
    result = drain_envelope(paths, box, record["id"], ttl=TTL, now=NOW)
    assert isinstance(result, Quarantined) and result.reply is not None
    assert [name for name in os.listdir(paths.relay.quarantine) if name.startswith(record["id"])]
    assert (result.reply["id"], result.reply["reply"], result.reply["reason"]) == (record["id"], "", "unknown")
    error = result.reply["error"]
    assert "malformed" in error and field in error and "NOT delivered" in error, error
    assert result.reply_connection == ("studio" if box == "inbox" else "")


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize("twist", ["id not its file's", "id not hex", "not an object", "no reply_connection"])
def test_a_malformed_envelope_whose_id_or_sender_is_not_sound_gets_no_reply(
    paths: InboxPaths, box: Any, twist: str,
) -> None:
    """Never a reply for an id that fails validation (it would name a file nobody waits for, or worse), nor,
    from inbox/, for one whose reply connection is not a valid connection id (nobody to send it to)."""
    if twist == "no reply_connection" and box == "outbox":
        pytest.skip("outbox envelopes carry no reply connection")
    envelope_id = new_delivery_id()
    record: Any = {**_envelope(10.0), "hop": 1001, "id": envelope_id}
    if box == "inbox" and twist != "no reply_connection":
        record["reply_connection"] = "studio"
    if twist == "id not its file's":
        record["id"] = new_delivery_id()
    elif twist == "id not hex":
        record["id"] = "../" + envelope_id[3:]
    elif twist == "not an object":
        record = [record]
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    (directory / f"{envelope_id}.json").write_text(json.dumps(record))
    (directory / f"{envelope_id}.json").chmod(0o600)
    result = drain_envelope(paths, box, envelope_id, ttl=TTL, now=NOW)
    assert isinstance(result, Quarantined) and result.reply is None


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize("kind", [kind_param("other-uid"), "group-writable", "not JSON"])
def test_an_envelope_file_refused_unread_is_answered_from_an_outbox_not_from_an_inbox(
    paths: InboxPaths, tmp_path: Path, box: Any, kind: str,
) -> None:
    """Regression (hostile review, b5): an acked DM's ``outbox/<id>.json`` replaced by another uid's file was
    quarantined with no answer, so its sender waited ``reply_wait_seconds`` (900 s) and was told it "may still
    be delivered". From an outbox the sender is the root whose outbox it was, waiting on the id of the file's
    name: it is answered at once (``unknown``, NOT delivered, the reason in the text). From an inbox only the
    unread file names its sender's root: still no answer."""
    envelope = {**_envelope(10.0), "id": new_delivery_id()}
    if box == "inbox":
        envelope["reply_connection"] = "studio"
    else:  # our DM, in flight: its sent/ record proves it (one of another DM is never answered: see below)
        record_sent(paths, envelope["id"], "@bob on mini", now=NOW)
    body = b"{not json" if kind == "not JSON" else json.dumps(envelope).encode()
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    place(kind, body, directory / f"{envelope['id']}.json", tmp_path / "staging",
          mode=0o664 if kind == "group-writable" else 0o600)
    result = drain_envelope(paths, box, envelope["id"], ttl=TTL, now=NOW)
    assert isinstance(result, Quarantined), result
    assert [name for name in os.listdir(paths.relay.quarantine) if name.startswith(envelope["id"])]
    if box == "inbox":
        assert result.reply is None
        return
    assert result.reply is not None
    assert (result.reply["id"], result.reply["reply"], result.reply["reason"]) == (envelope["id"], "", "unknown")
    error = result.reply["error"]
    assert "refused the message" in error and "NOT delivered" in error and result.why in error, error
    why = {"other-uid": "is owned by uid 65534", "group-writable": "is writable by group or others (mode 0664)",
           "not JSON": "is not valid JSON"}[kind]
    assert why in error, error


@pytest.mark.parametrize("taken", ["filed in claimed/", "on a hub's shelf", "replied", "no sent/ record"])
def test_an_unreadable_outbox_file_under_the_id_of_a_dm_not_provably_undelivered_is_quarantined_unanswered(
    paths: InboxPaths, tmp_path: Path, taken: str,
) -> None:
    """Regression (review diffrev17, s6): a file nobody can read put in a sender's ``outbox/`` under the id of a
    DM a hub already took (its turn running, its real reply on the way) was answered "NOT delivered", and that
    reply, written first, won over the real one: the sender heard NOT delivered for a DM that ran, and could
    resend it. It is answered only when the DM is provably still undelivered (the previous test): recorded in
    ``sent/``, and held by no taker (no ``claimed/`` entry, on no hub's shelf, no reply). Otherwise it is
    quarantined silently. Drained as the hub drains, its shelf as the layout's ``claimed``."""
    envelope = _envelope(10.0)
    envelope_id = envelope["id"]
    if taken != "no sent/ record":
        record_sent(paths, envelope_id, "@bob on mini", now=NOW)
    if taken == "filed in claimed/":
        (paths.relay.claimed / f"{envelope_id}.json").write_text(json.dumps(envelope), encoding="utf-8")
    elif taken == "replied":
        rf.write_reply(paths.relay, {"id": envelope_id, "at": int(NOW), "reply": "done", "error": "", "reason": ""})
    other_hub = Shelf(paths.hubclaims, within=paths.relay.root)
    if taken == "on a hub's shelf":
        (other_hub.open() / f"{envelope_id}.json").write_text(json.dumps(envelope), encoding="utf-8")
    hub = replace(paths, relay=replace(paths.relay, claimed=Shelf(paths.hubclaims, within=paths.relay.root).open()))
    place("group-writable", json.dumps(envelope).encode(), paths.relay.outbox / f"{envelope_id}.json",
          tmp_path / "staging", mode=0o664)
    result = drain_envelope(hub, "outbox", envelope_id, ttl=TTL, now=NOW)
    assert isinstance(result, Quarantined) and result.reply is None, result
    assert [name for name in os.listdir(paths.relay.quarantine) if name.startswith(envelope_id)]
    assert rf.read_reply(paths.relay, envelope_id) == (
        {"id": envelope_id, "at": int(NOW), "reply": "done", "error": "", "reason": ""} if taken == "replied" else None)


def test_drain_outbox_answers_a_malformed_envelope_in_replies(paths: InboxPaths) -> None:
    """The Desktop's drain RPC: the malformed envelope is not returned, and its sender's reply is written."""
    bad = {**_envelope(10.0), "hop": "3"}
    _plant(paths, "outbox", bad)
    assert drain_outbox(paths, ttl=TTL, now=NOW) == []
    reply = rf.read_reply(paths.relay, bad["id"])
    assert reply is not None and reply["reason"] == "unknown" and "'hop'" in reply["error"]


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize(("age", "expected"), [(10.0, ToDeliver), (TTL + 10, Expired)])
def test_a_numeric_string_created_at_is_delivered_or_expired_by_its_value(
    paths: InboxPaths, box: Any, age: float, expected: type,
) -> None:
    """Regression (seed-interop review, s3): the seed's reader takes ``"created_at": "1796595038"``; we quarantined
    such an envelope unanswered. It is now delivered, or expired by that time, as the seed would."""
    record = {**_envelope(0.0), "created_at": str(int(NOW - age)),
              **({"reply_connection": "studio"} if box == "inbox" else {})}
    _plant(paths, box, record)
    result = drain_envelope(paths, box, record["id"], ttl=TTL, now=NOW)
    assert type(result) is expected
    assert isinstance(result, ToDeliver | Expired) and result.envelope["created_at"] == int(NOW - age)


@pytest.mark.parametrize(("sender_ttl", "expected"), [(60, Expired), (3600, ToDeliver), (0, ToDeliver)])
def test_an_inbox_envelope_expires_at_the_sender_ttl_its_record_carries_not_the_takers(
    paths: InboxPaths, sender_ttl: int, expected: type,
) -> None:
    """The one rule for an envelope in ``inbox/`` (review diffrev11 of bb85b7a): its sender root's TTL, which the hub
    writes in the record, whatever the taker's own (here 900 s; 0: the sender's expiry is off)."""
    record = {**_envelope(120.0), "reply_connection": "studio", "sender_ttl": sender_ttl}
    _plant(paths, "inbox", record)
    result = drain_envelope(paths, "inbox", record["id"], ttl=TTL, now=NOW)
    assert type(result) is expected
    if isinstance(result, Expired):
        assert "expired after 60s" in result.reply["error"]


@pytest.mark.parametrize("sender_ttl", ["60", True, None, [60], {}])
def test_an_inbox_record_whose_sender_ttl_is_no_number_is_quarantined_and_answered(
    paths: InboxPaths, sender_ttl: Any,
) -> None:
    """Only the hub writes ``sender_ttl`` (a number): anything else is a malformed record, never read as a TTL."""
    record = {**_envelope(10.0), "reply_connection": "studio", "sender_ttl": sender_ttl}
    _plant(paths, "inbox", record)
    result = drain_envelope(paths, "inbox", record["id"], ttl=TTL, now=NOW)
    assert isinstance(result, Quarantined) and result.reply is not None, result
    assert "'sender_ttl'" in result.reply["error"]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every read of a relay file's bytes (safe_read's one reader), by file descriptor."""
    seen: list[int] = []
    real = safe_read._read_limited

    def counted(fd: int, max_bytes: int) -> bytes:
        seen.append(fd)
        return real(fd, max_bytes)

    monkeypatch.setattr(safe_read, "_read_limited", counted)
    return seen


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize(("age", "expected"), [(10.0, ToDeliver), (TTL + 10, Expired)])
def test_an_envelope_is_read_once_per_drain(paths: InboxPaths, reads: list[int], box: Any, age: float,
                                            expected: type) -> None:
    """Regression (relayread): every envelope the hub or a gateway drained was read and parsed twice (once where
    it waits, for the write grace, then again once claimed). It is read once."""
    envelope = _envelope(age)
    _queue(paths, box, envelope)
    result = drain_envelope(paths, box, envelope["id"], ttl=TTL, now=NOW)
    assert type(result) is expected and result.envelope["id"] == envelope["id"], result  # type: ignore[union-attr]
    assert len(reads) == 1


def _rewrite(path: Path, how: str, message: str) -> None:
    """Change the envelope file at ``path`` to carry ``message``: replaced by rename, or rewritten in place."""
    data = json.loads(path.read_text(encoding="utf-8"))
    body = json.dumps({**data, "message": message}).encode()
    if how == "replaced":
        fresh = path.with_name(".fresh.tmp")
        fresh.write_bytes(body)
        fresh.chmod(0o600)
        os.replace(fresh, path)
    else:  # the same inode, written again (another size, so a coarse mtime cannot hide it)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)


@pytest.mark.parametrize("box", ["outbox", "inbox"])
@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_an_envelope_changed_between_its_read_and_its_claim_is_delivered_as_claimed(
    paths: InboxPaths, monkeypatch: pytest.MonkeyPatch, box: Any, how: str
) -> None:
    """The one read is made before the claim: what is delivered must still be what was claimed. A file replaced
    or rewritten after it was read is read again once claimed."""
    envelope = _envelope(10.0)
    _queue(paths, box, envelope)
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    real_claim = drain_module._claim

    def claim_after_a_change(paths_: InboxPaths, box_: Any, envelope_id: str) -> Path | None:
        _rewrite(directory / f"{envelope_id}.json", how, "changed before the claim")
        return real_claim(paths_, box_, envelope_id)

    monkeypatch.setattr(drain_module, "_claim", claim_after_a_change)
    result = drain_envelope(paths, box, envelope["id"], ttl=TTL, now=NOW)
    assert isinstance(result, ToDeliver) and result.envelope["message"] == "changed before the claim", result


@pytest.mark.parametrize("box", ["outbox", "inbox"])
def test_a_second_drainer_racing_between_the_read_and_the_claim_never_claims_it_twice(
    paths: InboxPaths, monkeypatch: pytest.MonkeyPatch, box: Any
) -> None:
    """Two drainers read the same envelope where it waits; the rename decides: one delivers it, the other finds
    it gone (not ours), and nothing is left behind or lost."""
    envelope = _envelope(10.0)
    _queue(paths, box, envelope)
    real_claim = drain_module._claim
    second: list[Any] = []

    def claim_after_a_rival(paths_: InboxPaths, box_: Any, envelope_id: str) -> Path | None:
        if not second:  # the first drainer read it; the second runs whole before the first renames
            monkeypatch.setattr(drain_module, "_claim", real_claim)
            second.append(drain_envelope(paths_, box_, envelope_id, ttl=TTL, now=NOW))
        return real_claim(paths_, box_, envelope_id)

    monkeypatch.setattr(drain_module, "_claim", claim_after_a_rival)
    first = drain_envelope(paths, box, envelope["id"], ttl=TTL, now=NOW)
    assert isinstance(first, NotOurs), first
    assert isinstance(second[0], ToDeliver) and second[0].envelope["id"] == envelope["id"], second
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    shelf = paths.relay.claimed if box == "outbox" else paths.taken
    assert not list(directory.glob("*.json")) and [p.name for p in shelf.glob("*.json")] == [f"{envelope['id']}.json"]
