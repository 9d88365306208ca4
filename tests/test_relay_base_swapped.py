"""``bot_relay/`` itself swapped for a symlink while a gateway runs: no relay file is written through it.

Each writer used to check only the directory the file goes in (``outbox/``,
``sent/``...), so a ``bot_relay`` replaced by a link to a look-alike tree elsewhere
received our envelopes, reply records, marks and heartbeats. Every relay write now
opens each directory from ``bot_relay/`` down without following a link.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import remote_row, write_roster_file
from roots import LogCapture, RecordingRunner, make_root, start_gateway

from hermes_actors import Gateway
from hermes_actors.errors import HostileFileError
from hermes_actors.records import RemoteAgent
from hermes_actors.rooms.store import RoomFiles
from hermes_actors.store import relay_heartbeat, relay_inbox, relay_sent
from hermes_actors.store.atomic import atomic_write_json, create_exclusive_json
from hermes_actors.store.journal import Journal
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_files import enqueue_envelope, write_reply, write_roster
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_protocol import make_envelope, make_reply
from hermes_actors.store.relay_quarantine import quarantine_into
from hermes_actors.store.relay_shelf import Shelf

NOW = 1_700_000_000.0
EID = "0123456789abcdef0123456789abcdef"


def _envelope() -> dict[str, Any]:
    return make_envelope(target=_agent(), message="hi", sender_profile="alice", sender_handle="alice", now=NOW,
                         envelope_id=EID)


def _agent() -> RemoteAgent:
    return RemoteAgent(profile="writer", handle="moxie", connection_id="mini", online=True)


def _reply() -> dict[str, Any]:
    return make_reply(EID, reply="done", now=NOW)


def _writers(inbox: InboxPaths) -> dict[str, Callable[[], Any]]:
    relay = inbox.relay
    return {
        "outbox envelope": lambda: enqueue_envelope(relay, _envelope()),
        "reply": lambda: write_reply(relay, _reply()),
        "roster": lambda: write_roster(relay, [], now=NOW),
        "inbox envelope (hub)": lambda: relay_inbox.post_to_inbox(inbox, _envelope(), "alpha"),
        "delivered record": lambda: relay_inbox.write_delivered(inbox, _reply(), "alpha"),
        "consumed mark": lambda: relay_inbox.mark_consumed(inbox, EID, now=NOW),
        "heartbeat": lambda: relay_heartbeat.write_heartbeat(inbox, "alpha", now=NOW),
        "sent record": lambda: relay_sent.record_sent(inbox, EID, "@moxie on mini", now=NOW),
    }


WRITERS = list(_writers(InboxPaths.from_root(Path("/nonexistent"))))


def _swap_base(root: Path) -> Path:
    """Move ``bot_relay/`` aside as a look-alike tree and put a symlink to it in its place."""
    base = root / "bot_relay"
    elsewhere = root.parent / "elsewhere"
    shutil.move(base, elsewhere)
    base.symlink_to(elsewhere, target_is_directory=True)
    return elsewhere


def _files(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()}


@pytest.mark.parametrize("writer", WRITERS)
def test_no_relay_write_goes_through_a_swapped_bot_relay(tmp_path: Path, writer: str) -> None:
    root = make_root(tmp_path)
    inbox = InboxPaths.from_root(root).ensure()
    write = _writers(inbox)[writer]
    elsewhere = _swap_base(root)
    before = _files(elsewhere)
    with pytest.raises(HostileFileError, match="bot_relay"):
        write()
    assert _files(elsewhere) == before


@pytest.mark.parametrize("writer", WRITERS)
def test_every_relay_writer_still_writes_into_a_real_bot_relay(tmp_path: Path, writer: str) -> None:
    root = make_root(tmp_path)
    inbox = InboxPaths.from_root(root).ensure()
    before = _files(inbox.relay.base)
    _writers(inbox)[writer]()
    assert len(_files(inbox.relay.base) - before) == 1


@pytest.mark.parametrize("create", [False, True], ids=["replace", "create"])
def test_within_refuses_a_link_at_any_level_and_a_target_outside(tmp_path: Path, create: bool) -> None:
    base = tmp_path / "base"
    (base / "a" / "b").mkdir(parents=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    write = create_exclusive_json if create else atomic_write_json
    write(base / "a" / "b" / "x.json", {"ok": 1}, tmp_dir=tmp, within=base)
    write(base / "top.json", {"ok": 1}, tmp_dir=tmp, within=base)  # directly in it
    assert (base / "a" / "b" / "x.json").is_file() and (base / "top.json").is_file()
    (tmp_path / "real-a").mkdir()
    (tmp_path / "real-a" / "b").mkdir()
    shutil.rmtree(base / "a")
    (base / "a").symlink_to(tmp_path / "real-a", target_is_directory=True)  # a middle level
    with pytest.raises(HostileFileError, match="a is a symlink"):
        write(base / "a" / "b" / "y.json", {"ok": 1}, tmp_dir=tmp, within=base)
    with pytest.raises(ValueError, match="is not inside"):
        write(tmp_path / "real-a" / "z.json", {"ok": 1}, tmp_dir=tmp, within=base)
    assert not any((tmp_path / "real-a").rglob("*.json")) and os.listdir(tmp) == []


def test_a_gateway_whose_bot_relay_is_swapped_refuses_a_relayed_dm_and_writes_nothing_there(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path)
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    gw = start_gateway(gateways, root, RecordingRunner(), connection_id="alpha")
    elsewhere = _swap_base(root)
    before = _files(elsewhere)
    ack = gw.message_agent(sender="alice", target="moxie", message="hello")
    assert "error" in ack and "delivery_id" not in ack, ack
    assert "symlink" in ack["error"], ack
    assert _files(elsewhere) == before


# ── directories created under a root: never through a swapped ancestor ──────


def _entries(tree: Path) -> set[str]:
    """Every file and directory below ``tree`` (``_files`` misses a directory created through the link)."""
    return {str(p.relative_to(tree)) for p in tree.rglob("*")}


def _swap_for_an_empty_directory(root: Path) -> Path:
    """``bot_relay/`` (made first) moved aside and replaced by a link to an empty directory, as an attacker would."""
    InboxPaths.from_root(root).ensure()
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (root / "bot_relay").rename(root.parent / "bot_relay.moved")
    (root / "bot_relay").symlink_to(elsewhere, target_is_directory=True)
    return elsewhere


def _creators(root: Path) -> dict[str, Callable[[], Any]]:
    """Each store object that makes directories under ``root``, as the gateway calls it."""
    paths = InboxPaths.from_root(root)
    return {
        "relay directories": paths.relay.ensure,
        "inbox directories": paths.ensure,
        "our shelf": Shelf(paths.taken_parent, within=root).open,
        "the hub's shelf": Shelf(paths.hubclaims, within=root).open,
        "journal": Journal(root / "bot_relay" / "journal", fsync=False, within=root).start,
        "room directory": RoomFiles(root).ensure,
    }


@pytest.mark.parametrize("creator", list(_creators(Path("/nonexistent"))))
def test_no_directory_is_created_through_a_swapped_bot_relay(tmp_path: Path, creator: str) -> None:
    """Only the last component was checked: a ``bot_relay`` swapped for a link to an empty directory got
    ``taken/s-…/.lock`` (the relay's new shelf), ``journal/``, ``rooms/`` made inside it."""
    root = make_root(tmp_path)
    elsewhere = _swap_for_an_empty_directory(root)
    with pytest.raises(HostileFileError, match=r"bot_relay is a symlink"):
        _creators(root)[creator]()
    assert _entries(elsewhere) == set()


def test_nothing_is_quarantined_into_a_swapped_bot_relay(tmp_path: Path, logs: LogCapture) -> None:
    root = make_root(tmp_path)
    elsewhere = _swap_for_an_empty_directory(root)
    (root / "refused.json").write_text("x")
    assert quarantine_into(root / "bot_relay" / "quarantine", root / "refused.json", "test", within=root) is None
    assert logs.matching("could not quarantine", "bot_relay is a symlink")
    assert (root / "refused.json").is_file() and _entries(elsewhere) == set()


@pytest.mark.parametrize("how", ["symlink", "file"])
def test_ensure_private_dir_within_refuses_every_component_and_creates_the_missing_0700(
    tmp_path: Path, how: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    old = os.umask(0o022)
    try:
        assert ensure_private_dir(root / "a" / "b" / "c", within=root) == root / "a" / "b" / "c"
    finally:
        os.umask(old)
    assert {oct(os.stat(p).st_mode & 0o777) for p in (root / "a", root / "a" / "b", root / "a" / "b" / "c")} == {
        "0o700"}
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(root / "a" / "b")
    if how == "symlink":
        (root / "a" / "b").symlink_to(outside, target_is_directory=True)
    else:
        (root / "a" / "b").write_text("x")
    with pytest.raises(HostileFileError, match=r"a/b is a symlink or not a directory"):
        ensure_private_dir(root / "a" / "b" / "c" / "d", within=root)
    assert os.listdir(outside) == []
    with pytest.raises(ValueError, match="is not a plain path"):
        ensure_private_dir(root / ".." / "outside" / "x", within=root)
    assert os.listdir(outside) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_ensure_private_dir_within_refuses_an_ancestor_of_another_owner(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bot_relay").mkdir(parents=True)
    os.chown(root / "bot_relay", 65534, 65534)
    with pytest.raises(HostileFileError, match=r"bot_relay is owned by uid 65534"):
        ensure_private_dir(root / "bot_relay" / "taken", within=root)
    assert not (root / "bot_relay" / "taken").exists()


def test_a_running_gateway_makes_no_shelf_through_a_swapped_bot_relay(
    tmp_path: Path, gateways: list[Gateway], logs: LogCapture
) -> None:
    """The rescan saw its shelf gone (through the link) and made a new one there: ``taken/s-…/.lock`` outside
    the root. Now the rescan refuses ``bot_relay/`` itself (logged once while it lasts) and looks at nothing
    below it, and the acked envelopes stay on the real shelf for a restart."""
    from actors import Rescan

    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, RecordingRunner(), connection_id="alpha", durable=False,
                       config={"bot_mode": {"rescan_seconds": 3600}})  # the rescans are asked for here
    assert gw._system is not None and gw._system.relay is not None
    [shelf] = (root / "bot_relay" / "taken").iterdir()
    elsewhere = _swap_for_an_empty_directory(root)
    for _ in range(3):
        gw._system.relay.ask(Rescan("manual"), timeout=30)
    assert len(logs.matching("bot_relay cannot be used", "bot_relay is a symlink")) == 1, logs.lines
    assert not logs.matching("our shelf"), logs.lines
    assert _entries(elsewhere) == set()
    assert (tmp_path / "bot_relay.moved" / "taken" / shelf.name / ".lock").is_file()  # ours, left for a restart
