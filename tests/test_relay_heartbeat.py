"""The gateways' heartbeat files (``bot_relay/gateways/<pid>.json``): only a live gateway's is believed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from crash_procs import child_env
from roots import LogCapture, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.ops.status import heartbeats
from hermes_actors.store import relay_heartbeat
from hermes_actors.store.atomic import atomic_write_json
from hermes_actors.store.processes import pid_alive, process_start_ticks
from hermes_actors.store.relay_heartbeat import (
    DEAD_HEARTBEAT_GRACE_SECONDS,
    HEARTBEAT_FRESH_SECONDS,
    claimed_shelves,
    hold_shelf,
    live_heartbeats,
    release_shelf,
    sweep_dead_heartbeats,
    write_heartbeat,
)
from hermes_actors.store.relay_inbox import InboxPaths

# A gateway process that wrote its heartbeat and ended without withdrawing it, as a kill -9 leaves it.
_DIES_BEATING = (
    "import sys, time\n"
    "from hermes_actors.store.relay_heartbeat import write_heartbeat\n"
    "from hermes_actors.store.relay_inbox import InboxPaths\n"
    "write_heartbeat(InboxPaths.from_root(sys.argv[1]), 'killed', now=time.time())\n"
)


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


def test_the_shelves_a_gateway_holds_are_claimed_by_its_heartbeat_while_its_process_lives(paths: InboxPaths) -> None:
    """A shelf named by a live heartbeat is a living gateway's even when its directory is gone; the same names
    in a heartbeat whose pid is dead, or that are no shelf's, claim nothing."""
    ours, dead, other = (f"s-{n:032x}" for n in (1, 2, 3))
    hold_shelf(paths, ours)
    try:
        write_heartbeat(paths, "mini", now=time.time())
    finally:
        release_shelf(paths, ours)  # from here on only the file says it (another process's gateway, as it were)
    assert claimed_shelves(paths) == {ours}
    _plant(paths, f"{PID_MAX_DEAD}.json", {"pid": PID_MAX_DEAD, "connection_id": "x", "at": int(time.time()),
                                            "shelves": [dead]})
    _plant(paths, "1.json", {"pid": 1, "connection_id": "x", "at": int(time.time()),
                             "shelves": ["../../etc", 7, other.upper()]})
    assert claimed_shelves(paths) == {ours}
    relay_heartbeat.remove_heartbeat(paths)  # a clean stop withdraws it: nothing claimed any more
    assert claimed_shelves(paths) == set()


PID_MAX_DEAD = 2**22 + 12345  # above Linux's pid_max ceiling (4194304): never a running process


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


def test_a_heartbeat_without_a_start_time_is_believed_only_while_fresh_and_its_pid_runs(paths: InboxPaths) -> None:
    """A gateway on a system without /proc (or an earlier version) writes none: nothing ties the file to the
    process now holding its pid, so it counts for HEARTBEAT_FRESH_SECONDS after its beat at most."""
    _plant(paths, f"{os.getpid()}.json", {"pid": os.getpid(), "connection_id": "", "at": int(time.time())})
    assert [(b["pid"], b["connection_id"]) for b in live_heartbeats(paths)] == [(os.getpid(), "")]
    assert live_heartbeats(paths, now=time.time() + HEARTBEAT_FRESH_SECONDS + 2) == []  # its pid still runs


@pytest.mark.parametrize(
    ("name", "beat"),
    [
        ("1.json", {"pid": 1, "connection_id": ""}),  # planted: pid 1 runs, and always will
        ("OWN.json", {"pid": "OWN", "connection_id": "mini"}),  # an earlier version's, its pid reused by us
        ("1.json", {"pid": 2, "connection_id": ""}),  # the content names another pid than the file
        ("1.json", "not a heartbeat"),
    ],
    ids=["planted-pid-1", "reused-pid", "other-pid", "not-an-object"],
)
def test_a_heartbeat_that_proves_no_writer_is_swept_after_the_grace_period_though_its_pid_runs(
        paths: InboxPaths, name: str, beat: Any) -> None:
    """Regression (review): a heartbeat without ``pid_start`` was kept while the pid of its name ran, so a planted
    ``1.json`` or an earlier version's file whose pid was reused stayed in gateways/ for good."""
    own = str(os.getpid())
    name = name.replace("OWN", own)
    if isinstance(beat, dict):
        beat = {**beat, "pid": int(own) if beat["pid"] == "OWN" else beat["pid"], "at": 1}
    mine = paths.heartbeat / f"{own}.json"
    mine.rename(paths.heartbeat / "mine.saved")  # our own file is the one planted in the reused-pid case
    _plant(paths, name, beat)
    planted = paths.heartbeat / name
    assert pid_alive(int(planted.stem))
    _age(planted, DEAD_HEARTBEAT_GRACE_SECONDS - 60)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0  # kept for the grace period, like any other
    _age(planted, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 1
    assert not planted.exists()
    (paths.heartbeat / "mine.saved").rename(mine)


def test_the_sweep_removes_only_the_file_it_found_dead_not_a_new_gateways_beat_under_the_same_name(
        paths: InboxPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (review): the sweep judged ``<pid>.json`` dead, then unlinked it by name: a new gateway given
    the same pid that wrote its heartbeat in between lost it until its next beat."""
    mine = paths.heartbeat / f"{os.getpid()}.json"
    # what a dead gateway left under the pid this process now has: another start, so not ours
    _plant(paths, mine.name, {"pid": os.getpid(), "connection_id": "old", "at": 1, "pid_start": -5})
    _age(mine, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    read = relay_heartbeat.read_json_file
    beaten: list[str] = []

    def read_then_beat(path: Path, **kwargs: Any) -> Any:
        """Read as the sweep does, then beat as the new gateway does, right after the sweep looked."""
        content = read(path, **kwargs)
        if path.name == mine.name and not beaten:
            beaten.append(path.name)
            write_heartbeat(paths, "mini", now=time.time())
        return content

    monkeypatch.setattr(relay_heartbeat, "read_json_file", read_then_beat)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0
    assert beaten, "the sweep looked at the dead file"
    assert [(b["pid"], b["connection_id"]) for b in live_heartbeats(paths)] == [(os.getpid(), "mini")]
    assert sorted(p.name for p in paths.heartbeat.iterdir()) == [mine.name]  # nothing left aside


def _dead_gateways_heartbeat(root: Path) -> Path:
    """The heartbeat file a gateway process left when it ended without a clean stop (the process is reaped)."""
    child = subprocess.run([sys.executable, "-c", _DIES_BEATING, str(root)], env=child_env(), capture_output=True,
                           text=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    [path] = [p for p in (root / "bot_relay" / "gateways").glob("*.json") if p.name != f"{os.getpid()}.json"]
    assert not pid_alive(int(path.stem))
    return path


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_housekeeping_removes_a_dead_gateways_heartbeat_and_keeps_a_live_ones(paths: InboxPaths) -> None:
    """Regression (soak review): a killed gateway's heartbeat stayed in gateways/ forever (one more per kill -9,
    each read by the hub, status and doctor every time); only a clean stop removed one."""
    dead = _dead_gateways_heartbeat(paths.relay.root)
    mine = paths.heartbeat / f"{os.getpid()}.json"
    reused = paths.heartbeat / "1.json"  # pid 1 runs, but is not the process that wrote this
    _plant(paths, reused.name, {"pid": 1, "connection_id": "", "at": 1, "pid_start": -5})
    for path in (dead, mine, reused):
        _age(path, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 2
    assert (dead.exists(), reused.exists(), mine.exists()) == (False, False, True)  # a live one stays, however old
    assert [b["pid"] for b in live_heartbeats(paths)] == [os.getpid()]


def test_a_dead_gateways_heartbeat_is_kept_for_the_grace_period(paths: InboxPaths) -> None:
    """Its pid looks dead from here, but a gateway in another pid namespace sharing the root rewrites it
    every 2 s: only a file left alone for the grace period goes."""
    dead = _dead_gateways_heartbeat(paths.relay.root)
    _age(dead, DEAD_HEARTBEAT_GRACE_SECONDS - 60)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0
    assert dead.exists()


def test_the_heartbeat_sweep_never_follows_a_symlink(paths: InboxPaths, tmp_path: Path) -> None:
    """A ``<pid>.json`` symlink, or ``gateways/`` swapped for one, is never followed: nothing outside is removed."""
    dead = _dead_gateways_heartbeat(paths.relay.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / dead.name  # named as a dead gateway's heartbeat, and old
    precious.write_bytes(dead.read_bytes())
    _age(precious, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    link = paths.heartbeat / f"{dead.stem}0.json"
    link.symlink_to(precious)
    _age(link, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    dead.unlink()
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0
    assert link.is_symlink() and precious.exists()
    moved = paths.heartbeat.with_name("gateways-moved")
    paths.heartbeat.rename(moved)
    paths.heartbeat.symlink_to(outside)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0
    assert precious.exists()


def test_a_stop_never_withdraws_its_heartbeat_through_a_swapped_gateways_directory(
        tmp_path: Path, gateways: list[Gateway], logs: LogCapture) -> None:
    """Regression (hostile review): a stopping gateway removed `gateways/<pid>.json` by path, so through a
    `gateways/` swapped for a symlink it deleted the file of that name outside the root, and the log showed a
    normal stop. Now it is removed only through the checked directory: the outside file stays, and the stop says
    why its heartbeat was not withdrawn."""
    root = make_root(tmp_path)
    # no rescan before the stop: it would put gateways/ back, and the stop must meet the swapped directory
    gw = start_gateway(gateways, root, connection_id="mini", config={"bot_mode": {"rescan_seconds": 3600}})
    beats = root / "bot_relay" / "gateways"
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / f"{os.getpid()}.json"  # named as this gateway's heartbeat
    precious.write_text("not a heartbeat", encoding="utf-8")
    beats.rename(beats.with_name("gateways.aside"))
    beats.symlink_to(outside, target_is_directory=True)
    gw.stop()
    assert beats.is_symlink()  # nothing put it back first: the stop met the swapped directory
    assert precious.read_text(encoding="utf-8") == "not a heartbeat"
    assert logs.matching("could not withdraw the heartbeat", f"{beats} is a symlink"), logs.lines


def test_a_gateway_started_just_now_sweeps_a_killed_gateways_heartbeat(tmp_path: Path,
                                                                       gateways: list[Gateway]) -> None:
    root = make_root(tmp_path)
    InboxPaths.from_root(root).ensure()
    dead = _dead_gateways_heartbeat(root)
    _age(dead, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    start_gateway(gateways, root, connection_id="mini")
    await_condition(lambda: not dead.exists(), timeout=30, message="the killed gateway's heartbeat swept")
    assert (root / "bot_relay" / "gateways" / f"{os.getpid()}.json").exists()


def test_a_heartbeat_left_aside_by_a_killed_sweep_is_removed_after_the_grace_period(paths: InboxPaths) -> None:
    """A sweep killed between its move aside and its verdict leaves a hidden file no reader lists."""
    aside = paths.heartbeat / f".sweep-{os.getpid()}-{'0' * 32}"
    aside.write_bytes((paths.heartbeat / f"{os.getpid()}.json").read_bytes())
    _age(aside, DEAD_HEARTBEAT_GRACE_SECONDS - 60)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0
    _age(aside, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 1
    assert sorted(p.name for p in paths.heartbeat.iterdir()) == [f"{os.getpid()}.json"]


def test_a_symlink_put_in_place_of_a_dead_heartbeat_while_swept_is_never_followed(
        paths: InboxPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file judged again is the entry moved aside itself: a symlink moved there is put back, and what it
    points to, however dead it looks, is left alone."""
    dead = _dead_gateways_heartbeat(paths.relay.root)
    _age(dead, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    precious = tmp_path / "precious.json"
    precious.write_bytes(dead.read_bytes())
    _age(precious, DEAD_HEARTBEAT_GRACE_SECONDS + 60)
    read = relay_heartbeat.read_json_file

    def read_then_swap(path: Path, **kwargs: Any) -> Any:
        content = read(path, **kwargs)
        if path.name == dead.name and not dead.is_symlink():
            dead.unlink()
            dead.symlink_to(precious)
        return content

    monkeypatch.setattr(relay_heartbeat, "read_json_file", read_then_swap)
    assert sweep_dead_heartbeats(paths, now=time.time()) == 0
    assert dead.is_symlink() and precious.exists()
    assert sorted(p.name for p in paths.heartbeat.iterdir()) == sorted([dead.name, f"{os.getpid()}.json"])
