"""The gateways' heartbeat files (``bot_relay/gateways/<pid>.json``): only a live gateway's is believed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from roots import make_root

from hermes_actors.ops.status import heartbeats
from hermes_actors.store.atomic import atomic_write_json
from hermes_actors.store.processes import process_start_ticks
from hermes_actors.store.relay_heartbeat import live_heartbeats, write_heartbeat
from hermes_actors.store.relay_inbox import InboxPaths


@pytest.fixture
def paths(tmp_path: Path) -> InboxPaths:
    root = make_root(tmp_path)
    inbox = InboxPaths.from_root(root).ensure()
    write_heartbeat(inbox, "mini", now=time.time())  # makes the directories; this process is a "gateway"
    return inbox


def _plant(paths: InboxPaths, name: str, beat: dict[str, Any]) -> None:
    atomic_write_json(paths.heartbeat / name, beat, tmp_dir=paths.relay.tmp, within=paths.relay.base)


def test_a_gateways_own_heartbeat_is_live_and_records_when_its_process_started(paths: InboxPaths) -> None:
    beats = live_heartbeats(paths)
    assert [(b["pid"], b["connection_id"]) for b in beats] == [(os.getpid(), "mini")]
    assert beats[0]["pid_start"] == process_start_ticks(os.getpid())


@pytest.mark.parametrize(
    "beat",
    [
        {"pid": 1, "connection_id": "\x1b[31mEVIL\x1b[0m\nfake: line", "routed_as": ["alpha"]},
        {"pid": 1, "connection_id": ["a"]},
        {"pid": 1, "connection_id": "../x"},
        {"pid": 1, "connection_id": "a" * 65},
        {"pid": 1, "connection_id": "mini", "pid_start": -5},  # pid 1 did not start then: a reused pid
    ],
    ids=["escape-codes", "list", "path", "too-long", "other-start"],
)
def test_a_planted_heartbeat_is_not_believed(paths: InboxPaths, beat: dict[str, Any]) -> None:
    """Regression (review): a file naming pid 1 with escape codes and a newline as its connection id made doctor
    print them (and a false "connection ids" block) and status list pid 1 as a gateway."""
    _plant(paths, "1.json", {**beat, "at": int(time.time())})
    assert [b["pid"] for b in live_heartbeats(paths)] == [os.getpid()]
    assert [row["pid"] for row in heartbeats(paths.relay.root, time.time())] == [os.getpid()]


def test_a_heartbeat_under_another_pids_name_is_not_believed(paths: InboxPaths) -> None:
    mine = (paths.heartbeat / f"{os.getpid()}.json").read_bytes()
    (paths.heartbeat / f"{os.getpid()}.json").unlink()
    _plant(paths, "4243.json", {"pid": os.getpid(), "connection_id": "mini", "at": int(time.time())})
    assert live_heartbeats(paths) == []
    (paths.heartbeat / f"{os.getpid()}.json").write_bytes(mine)


def test_a_heartbeat_without_a_start_time_is_believed_while_its_pid_runs(paths: InboxPaths) -> None:
    """A gateway on a system without /proc writes none."""
    _plant(paths, f"{os.getpid()}.json", {"pid": os.getpid(), "connection_id": "", "at": int(time.time())})
    assert [(b["pid"], b["connection_id"]) for b in live_heartbeats(paths)] == [(os.getpid(), "")]
