"""Each gateway process's heartbeat: ``bot_relay/gateways/<pid>.json`` = ``{pid, connection_id, at, pid_start}``.

A running gateway rewrites its file every few seconds and removes it when it
stops cleanly; the hub reads them to flag the roster's connections ``online``
(a file is believed while it is fresh, names the pid of its file name, carries a
valid connection id, and its pid still runs and started when the file says).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hermes_actors.core.names import checked_connection_id
from hermes_actors.errors import ValidationError
from hermes_actors.store.atomic import atomic_write_json, read_json_file
from hermes_actors.store.processes import pid_alive, process_start_ticks
from hermes_actors.store.relay_dirfd import relay_dir
from hermes_actors.store.relay_inbox import InboxPaths

__all__ = ["HEARTBEAT_FRESH_SECONDS", "gateway_alive", "live_heartbeats", "remove_heartbeat", "write_heartbeat"]

HEARTBEAT_FRESH_SECONDS = 10.0


def write_heartbeat(
    paths: InboxPaths, connection_id: str | None, *, now: float, routed_as: frozenset[str] = frozenset()
) -> None:
    """This gateway process says it is alive (the hub turns this into ``online`` flags).

    Args:
        paths: the root's relay layout.
        connection_id: this gateway's id ("" when unknown).
        now: the current time.
        routed_as: the ``target_connection`` names of the envelopes the hub handed to this root so far
            (``doctor`` compares them with ``connection_id``); written only when there are any.
    """
    payload: dict[str, object] = {"pid": os.getpid(), "connection_id": connection_id or "", "at": int(now)}
    start = process_start_ticks(os.getpid())
    if start is not None:  # the reader checks the pid is still this process, not one that reused it
        payload["pid_start"] = start
    if routed_as:
        payload["routed_as"] = sorted(routed_as)
    atomic_write_json(paths.heartbeat / f"{os.getpid()}.json", payload, tmp_dir=paths.relay.tmp,
                      within=paths.relay.base)


def remove_heartbeat(paths: InboxPaths) -> None:
    """A gateway that stops cleanly withdraws its heartbeat."""
    try:
        os.unlink(paths.heartbeat / f"{os.getpid()}.json")
    except FileNotFoundError:
        pass


def _beat_alive(beat: Any, now: float, file_pid: int) -> bool:
    """Pure but for the process table: whether a heartbeat read from ``<file_pid>.json`` is a live gateway's.

    The file is untrusted (any process of our uid can write one): it counts only when it is fresh,
    names the pid of its file name, carries a valid connection id ("" when the gateway has none),
    and its pid runs — and, when it records ``pid_start``, started then (a pid reused since, or a
    file naming some other process of ours such as pid 1, is not a gateway's).
    """
    if not isinstance(beat, dict):
        return False
    try:
        at, pid = float(beat.get("at", 0)), int(beat.get("pid", 0))
    except (TypeError, ValueError, OverflowError):
        return False
    # Fresh: written at most HEARTBEAT_FRESH_SECONDS ago, and not from the future ("not": NaN is refused too)
    if pid != file_pid or not -HEARTBEAT_FRESH_SECONDS <= now - at <= HEARTBEAT_FRESH_SECONDS:
        return False
    connection_id = beat.get("connection_id", "")
    if connection_id != "":
        try:
            checked_connection_id(connection_id)
        except ValueError:  # printed by doctor and status: escape codes or a newline must never reach them
            return False
    if not pid_alive(pid):
        return False
    recorded = beat.get("pid_start")
    if recorded is None:  # a gateway on a system without /proc (or an earlier version) writes none
        return True
    start = process_start_ticks(pid)
    return start is None or recorded == start


def live_heartbeats(paths: InboxPaths, *, now: float | None = None) -> list[dict[str, Any]]:
    """The heartbeats of the gateway processes on this root that wrote one lately and still run.

    A killed gateway's file stays behind (nothing sweeps it): it is never taken for a live one.

    Returns:
        Each live heartbeat's record (``pid``, a valid ``connection_id`` or "", ``at``, and ``pid_start`` and
        ``routed_as`` when written), by pid.
    """
    now = time.time() if now is None else now
    found = []
    try:
        # through a descriptor opened without following a symlink: a gateways/ swapped for one is not read
        with relay_dir(paths.relay.base, paths.heartbeat) as fd:
            names = sorted(n for n in os.listdir(fd) if n.endswith(".json") and n[:-5].isdigit())
            for name in names:
                try:
                    beat = read_json_file(paths.heartbeat / name, max_bytes=4096, dir_fd=fd)
                except (OSError, ValidationError):
                    continue
                if _beat_alive(beat, now, int(name[:-5])):
                    found.append(beat)
    except (OSError, ValidationError):  # HostileFileError included: no heartbeat can be believed
        return []
    return found


def gateway_alive(paths: InboxPaths, *, now: float | None = None) -> bool:
    """True when some gateway process on this root wrote a fresh heartbeat and still runs."""
    return bool(live_heartbeats(paths, now=now))
