"""A relay file another program writes in place (created, then written): left alone while it may still be being
written, read once complete; one that stays bad is still quarantined after the grace (store.safe_read's rule).

The seed and we write relay files atomically (a temp file, then a rename); a non-conforming writer that opens
``<id>.json`` with ``O_CREAT|O_EXCL`` and writes it later shows a watcher an empty file first. Each test below
holds such a file open and empty until the reader has looked at it (its debug line, or, without the rule, its
quarantine line), then writes it: the synchronization is the reader's own log, never a sleep.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import hub_thread, remote_row, seed_envelope, write_roster_file
from roots import LogCapture, RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.errors import HostileFileError, UnfinishedFileError
from hermes_actors.relay.drain import Quarantined, ToDeliver, Unfinished, drain_envelope
from hermes_actors.store import safe_read
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.safe_read import WRITE_GRACE_SECONDS, BadSightings, may_be_unfinished, read_json_file

GRACE = WRITE_GRACE_SECONDS


@pytest.mark.parametrize(
    ("changed_at", "now", "first_seen_bad", "expected"),
    [
        (100.0, 100.0, None, True),  # changed this instant: its writer may be writing it
        (100.0, 100.0 + GRACE / 2, None, True),
        (100.0, 100.0 + GRACE - 0.001, None, True),
        (100.0, 100.0 + GRACE, None, False),  # still bad once the grace is over: refused
        (100.0, 100.0 + 3600, None, False),
        (100.0 + GRACE / 2, 100.0, None, True),  # a clock set back a little: still within the grace
        (100.0 + 3600, 100.0, None, False),  # a change far "in the future" buys no grace
        (100.0, 100.0 + GRACE / 2, 100.0 + GRACE / 2, True),  # first seen bad now
        (100.0, 100.0 + GRACE / 2, 100.0, True),  # first seen bad within the grace
        (100.0, 100.0, 100.0 - GRACE + 0.001, True),
        (100.0, 100.0, 100.0 - GRACE, False),  # changed just now, but first seen bad a grace ago: refused
        (100.0, 100.0, 100.0 - 3600, False),  # a ctime that keeps changing buys no more grace
        (100.0, 100.0 + GRACE, 100.0 + GRACE, False),  # first seen now, but its last change is past the grace
    ],
)
def test_may_be_unfinished(changed_at: float, now: float, first_seen_bad: float | None, expected: bool) -> None:
    assert may_be_unfinished(changed_at, now, first_seen_bad=first_seen_bad) is expected


def test_bad_sightings_remember_the_first_and_stay_bounded() -> None:
    sightings = BadSightings(limit=2)
    assert sightings.first_seen((1, 1, "a.json"), 10.0) == 10.0
    assert sightings.first_seen((1, 1, "a.json"), 12.0) == 10.0  # the first sighting stays
    assert sightings.first_seen((1, 1, "b.json"), 13.0) == 13.0  # same inode, another name: another file
    assert sightings.first_seen((1, 2, "c.json"), 14.0) == 14.0  # a third: the oldest is dropped
    assert len(sightings) == 2 and sightings.first_seen((1, 1, "a.json"), 15.0) == 15.0
    sightings.forget((1, 1, "a.json"))
    assert sightings.first_seen((1, 1, "a.json"), 16.0) == 16.0  # forgotten: a new grace


def _empty(path: Path) -> Path:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


@pytest.mark.parametrize("body", [b"", b'{"id": "ab', b"\xef\xbb\xbf"])
def test_an_empty_or_half_written_file_is_unfinished_within_the_grace_and_refused_after_it(
    tmp_path: Path, body: bytes
) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(body)
    path.chmod(0o600)
    changed = os.stat(path).st_ctime
    with pytest.raises(UnfinishedFileError, match="may still be being written"):
        read_json_file(path, unfinished_at=changed + GRACE / 2)
    for refused in ({"unfinished_at": changed + GRACE + 1}, {}):  # past the grace, or a reader that asks for none
        with pytest.raises(HostileFileError, match="is not valid JSON") as caught:
            read_json_file(path, **refused)  # type: ignore[arg-type]
        assert not isinstance(caught.value, UnfinishedFileError)


def test_a_file_whose_ctime_keeps_changing_is_refused_once_first_seen_bad_past_the_grace(tmp_path: Path) -> None:
    """Regression (relayread): a relay file left empty whose ctime its owner keeps changing (a chmod every second)
    was judged by that ctime alone: it stayed "may still be being written" at every event and rescan, never
    quarantined. Once this process first saw it bad longer ago than the grace, it is refused, whatever its ctime."""
    path = _empty(tmp_path / "a.json")
    created = os.stat(path).st_ctime
    with pytest.raises(UnfinishedFileError):  # first seen bad (the clock a little behind its ctime)
        read_json_file(path, unfinished_at=created - GRACE / 2)
    path.chmod(0o400)  # its ctime moves on
    changed = os.stat(path).st_ctime
    assert changed >= created
    with pytest.raises(HostileFileError, match="is not valid JSON") as caught:  # fresh ctime, old first sighting
        read_json_file(path, unfinished_at=changed + GRACE / 2)
    assert not isinstance(caught.value, UnfinishedFileError)


def test_a_file_read_whole_is_forgotten_so_its_next_bad_spell_gets_a_whole_grace(tmp_path: Path) -> None:
    path = _empty(tmp_path / "a.json")
    created = os.stat(path).st_ctime
    with pytest.raises(UnfinishedFileError):
        read_json_file(path, unfinished_at=created - GRACE / 2)
    path.write_text("{}")
    assert read_json_file(path, unfinished_at=created) == {}
    path.write_text("")  # bad again, written just now
    with pytest.raises(UnfinishedFileError):
        read_json_file(path, unfinished_at=os.stat(path).st_ctime + GRACE / 2)


@pytest.mark.parametrize("box", ["outbox", "inbox"])
def test_drain_quarantines_an_envelope_whose_ctime_keeps_changing_once_first_seen_bad_past_the_grace(
    tmp_path: Path, box: Any
) -> None:
    """The same rule for the hub's and a gateway's drain: left unclaimed at first, quarantined after."""
    paths = InboxPaths.from_root(tmp_path).ensure()
    envelope = seed_envelope(target_connection="mini", target_profile="moxie")
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    path = _empty(directory / f"{envelope['id']}.json")
    created = os.stat(path).st_ctime
    assert isinstance(drain_envelope(paths, box, envelope["id"], ttl=900, now=created - GRACE / 2), Unfinished)
    path.chmod(0o400)
    result = drain_envelope(paths, box, envelope["id"], ttl=900, now=os.stat(path).st_ctime + GRACE / 2)
    assert isinstance(result, Quarantined) and "is not valid JSON" in result.why, result
    assert not path.exists() and [n for n in os.listdir(paths.relay.quarantine) if n.startswith(envelope["id"])]


def test_the_grace_spares_no_other_refusal(tmp_path: Path) -> None:
    """Huge, group-writable and symlinked files are refused at once, however fresh: only "not JSON yet" waits."""
    huge = tmp_path / "huge.json"
    huge.write_bytes(b"{" + b" " * 2048)
    huge.chmod(0o600)
    loose = _empty(tmp_path / "loose.json")
    loose.chmod(0o666)
    link = tmp_path / "link.json"
    link.symlink_to(_empty(tmp_path / "target.json"))
    now = time.time()
    for path, why in ((huge, "is too large"), (loose, "writable by group or others"), (link, "is a symlink")):
        with pytest.raises(HostileFileError, match=why) as caught:
            read_json_file(path, max_bytes=1024, unfinished_at=now)
        assert not isinstance(caught.value, UnfinishedFileError)


@pytest.mark.parametrize("box", ["outbox", "inbox"])
def test_drain_leaves_an_unfinished_envelope_unclaimed_then_takes_it_whole_or_quarantines_it(
    tmp_path: Path, box: Any
) -> None:
    paths = InboxPaths.from_root(tmp_path).ensure()
    envelope = seed_envelope(target_connection="mini", target_profile="moxie")
    record = {**envelope, "reply_connection": "alpha"} if box == "inbox" else envelope
    directory = paths.relay.outbox if box == "outbox" else paths.inbox
    path = _empty(directory / f"{envelope['id']}.json")
    now = os.stat(path).st_ctime

    result = drain_envelope(paths, box, envelope["id"], ttl=900, now=now)
    assert isinstance(result, Unfinished) and "may still be being written" in result.why, result
    assert path.exists() and not os.listdir(paths.relay.quarantine)  # left where it waits, not claimed

    path.write_text(json.dumps(record))  # the writer finishes
    result = drain_envelope(paths, box, envelope["id"], ttl=900, now=os.stat(path).st_ctime)
    assert isinstance(result, ToDeliver) and result.envelope["id"] == envelope["id"], result

    stuck = seed_envelope(target_connection="mini", target_profile="moxie")
    stuck_path = _empty(directory / f"{stuck['id']}.json")
    result = drain_envelope(paths, box, stuck["id"], ttl=900, now=os.stat(stuck_path).st_ctime + GRACE + 1)
    assert isinstance(result, Quarantined) and "is not valid JSON" in result.why, result  # still empty: refused
    assert [n for n in os.listdir(paths.relay.quarantine) if n.startswith(stuck["id"])]


@pytest.fixture
def debug_logs() -> Iterator[LogCapture]:
    with LogCapture("DEBUG") as capture:
        yield capture


def _looked_at(logs: LogCapture, name: str) -> None:
    """Wait until the reader saw ``name`` empty: left it for now (the rule), or quarantined it (no rule)."""
    await_condition(lambda: logs.matching(name, "may still be being written") or logs.matching("quarantined", name),
                    timeout=10, message=f"the reader looked at the empty {name}")


def _write_and_close(fd: int, payload: dict[str, Any]) -> None:
    try:
        os.write(fd, json.dumps(payload).encode())
    finally:
        os.close(fd)


def _quarantined(relay: Path) -> list[str]:
    quarantine = relay / "quarantine"
    return os.listdir(quarantine) if quarantine.is_dir() else []


def _open_empty(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def test_a_reply_written_in_two_steps_is_delivered_not_quarantined(tmp_path: Path, debug_logs: LogCapture) -> None:
    """Regression (outside review, t30): a reply file created with O_CREAT|O_EXCL and written 50 ms later was read
    on its create event while empty, quarantined ("not valid JSON: Input is a zero-length, empty document"), and
    the sender ended the DM delivery_timeout with the real reply lost. It is left alone while it may still be
    being written, and read again at its close-write event: the sender gets the reply."""
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    relay = root / "bot_relay"
    with Gateway(root, runner=RecordingRunner(), config={"bot_mode": {"reply_wait_seconds": 5}},
                 connection_id="alpha") as gw:
        envelope_id = gw.message_agent(sender="alice", target="moxie", message="hi")["delivery_id"]
        name = f"{envelope_id}.json"
        fd = _open_empty(relay / "replies" / name)
        _looked_at(debug_logs, name)
        _write_and_close(fd, {"id": envelope_id, "at": int(time.time()), "reply": "the real answer", "error": "",
                              "reason": ""})
        out = gw.wait_outcome(envelope_id, timeout=15)
    assert (out["status"], out["reply"]) == ("replied", "the real answer"), out
    assert _quarantined(relay) == []


def test_a_reply_that_stays_empty_is_still_quarantined_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, debug_logs: LogCapture
) -> None:
    """The other half of the rule: a reply file that stays bad is not left for good. Past the grace (shortened
    here) the next rescan quarantines it, and a valid reply written after it still settles the DM."""
    monkeypatch.setattr(safe_read, "WRITE_GRACE_SECONDS", 0.5)
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    relay = root / "bot_relay"
    with Gateway(root, runner=RecordingRunner(), config={"bot_mode": {"rescan_seconds": 0.2}},
                 connection_id="alpha") as gw:
        envelope_id = gw.message_agent(sender="alice", target="moxie", message="hi")["delivery_id"]
        name = f"{envelope_id}.json"
        os.close(_open_empty(relay / "replies" / name))  # created, closed, never written
        await_condition(lambda: list((relay / "quarantine").glob(f"{name}.*.quarantined")), timeout=10,
                        message=f"{name} quarantined")
        # the line is logged just after the move: wait for it too (asserted at once, it raced the relay's thread)
        await_condition(lambda: debug_logs.matching("quarantined", name, "is not valid JSON"), timeout=10,
                        message=f"the quarantine of {name} logged")
        assert gw.stats()["relay"]["replies"] == 0
        valid = {"id": envelope_id, "at": int(time.time()), "reply": "the real reply", "error": "", "reason": ""}
        _write_and_close(_open_empty(relay / "replies" / name), valid)
        out = gw.wait_outcome(envelope_id, timeout=10)
    assert (out["status"], out["reply"]) == ("replied", "the real reply"), out


def test_an_inbox_envelope_written_in_two_steps_runs(tmp_path: Path, debug_logs: LogCapture) -> None:
    """Regression (outside review, t30, the gateway's inbox/): an envelope file created, then written, was taken
    on its create event while empty and quarantined, never run and never answered. It runs once written."""
    root = make_root(tmp_path, name="alpha")
    rec = RecordingRunner()
    paths = InboxPaths.from_root(root)
    with Gateway(root, runner=rec, connection_id="alpha"):
        envelope = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
        name = f"{envelope['id']}.json"
        fd = _open_empty(paths.inbox / name)
        _looked_at(debug_logs, name)
        _write_and_close(fd, {**envelope, "reply_connection": "mini"})
        await_condition((paths.delivered / name).exists, timeout=10, message="the envelope ran")
    assert [t.delivery_id for t in rec.entered] == [envelope["id"]]
    assert _quarantined(paths.relay.base) == []


def test_an_outbox_envelope_written_in_two_steps_is_relayed_by_the_hub(tmp_path: Path, debug_logs: LogCapture) -> None:
    """Regression (outside review, t30, the hub's outbox/): a sender's envelope created, then written, was claimed
    by the hub on its create event while empty and quarantined; the DM never ran. The hub leaves it unclaimed
    until it is written, then relays it and forwards the reply."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    rec = RecordingRunner()
    with Gateway(mini, runner=rec, connection_id="mini"), hub_thread({"alpha": alpha, "mini": mini}):
        await_condition((alpha / "bot_relay" / "roster.json").exists, timeout=10, message="the hub runs")
        envelope = seed_envelope(target_connection="mini", target_profile="moxie")
        name = f"{envelope['id']}.json"
        fd = _open_empty(alpha / "bot_relay" / "outbox" / name)
        _looked_at(debug_logs, name)
        _write_and_close(fd, envelope)
        reply = alpha / "bot_relay" / "replies" / name
        await_condition(reply.exists, timeout=15, message="the reply forwarded to the sender")
    assert [t.delivery_id for t in rec.entered] == [envelope["id"]]
    assert json.loads(reply.read_text(encoding="utf-8"))["error"] == ""
    assert _quarantined(alpha / "bot_relay") == []
