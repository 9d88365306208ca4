"""Each gateway process's heartbeat: ``bot_relay/gateways/<pid>.json`` = ``{"pid", "connection_id", "at"}``.

A running gateway rewrites its file every few seconds and removes it when it
stops cleanly; the hub reads them to flag the roster's connections ``online``
(a file is believed while it is fresh and its pid still runs).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hermes_actors.errors import ValidationError
from hermes_actors.store.atomic import atomic_write_json, read_json_file
from hermes_actors.store.processes import pid_alive
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


def _beat_alive(beat: Any, now: float) -> bool:
    if not isinstance(beat, dict):
        return False
    try:
        at, pid = float(beat.get("at", 0)), int(beat.get("pid", 0))
    except (TypeError, ValueError, OverflowError):
        return False
    # Fresh: written at most HEARTBEAT_FRESH_SECONDS ago, and not from the future ("not": NaN is refused too)
    if not -HEARTBEAT_FRESH_SECONDS <= now - at <= HEARTBEAT_FRESH_SECONDS:
        return False
    return pid_alive(pid)


def live_heartbeats(paths: InboxPaths, *, now: float | None = None) -> list[dict[str, Any]]:
    """The heartbeats of the gateway processes on this root that wrote one lately and still run.

    A killed gateway's file stays behind (nothing sweeps it): it is never taken for a live one.

    Returns:
        Each live heartbeat's record (``pid``, ``connection_id``, ``at``, and ``routed_as`` when written),
        by pid.
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
                if _beat_alive(beat, now):
                    found.append(beat)
    except (OSError, ValidationError):  # HostileFileError included: no heartbeat can be believed
        return []
    return found


def gateway_alive(paths: InboxPaths, *, now: float | None = None) -> bool:
    """True when some gateway process on this root wrote a fresh heartbeat and still runs."""
    return bool(live_heartbeats(paths, now=now))
