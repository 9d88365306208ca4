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
from roots import RecordingRunner, make_root, start_gateway

from hermes_actors import Gateway
from hermes_actors.errors import HostileFileError
from hermes_actors.records import RemoteAgent
from hermes_actors.store import relay_inbox
from hermes_actors.store.atomic import atomic_write_json, create_exclusive_json
from hermes_actors.store.relay_files import enqueue_envelope, write_reply, write_roster
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_protocol import make_envelope, make_reply

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
        "heartbeat": lambda: relay_inbox.write_heartbeat(inbox, "alpha", now=NOW),
        "sent record": lambda: relay_inbox.record_sent(inbox, EID, "@moxie on mini", now=NOW),
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
