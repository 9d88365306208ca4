"""Each gateway process's heartbeat: ``bot_relay/gateways/<pid>.json`` = ``{pid, connection_id, at, pid_start, ...}``.

A running gateway rewrites its file every few seconds and removes it when it
stops cleanly; the hub reads them to flag the roster's connections ``online``
(a file is believed while it is fresh, names the pid of its file name, carries a
valid connection id, and its pid still runs and started when the file says).
A killed gateway cannot remove its own: the housekeeping of the gateways on the
root does (:func:`sweep_dead_heartbeats`), once its process provably ended.

``shelves`` names the shelves (``taken/s-<token>``) the process's gateways on the root hold
(:func:`hold_shelf`): the ``sent/`` records naming one of them are a living gateway's even when
its directory is gone (removed under it), so no other gateway adopts them
(:func:`claimed_shelves`); the lock of a shelf that is there says the same by itself.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from hermes_actors.core.names import checked_connection_id
from hermes_actors.errors import ValidationError
from hermes_actors.store.atomic import atomic_write_json, read_json_file
from hermes_actors.store.processes import pid_alive, process_start_ticks
from hermes_actors.store.relay_dirfd import relay_dir, remove_below
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_shelf import is_shelf_name
from hermes_actors.store.sweep import sweep_old_files

__all__ = [
    "DEAD_HEARTBEAT_GRACE_SECONDS",
    "HEARTBEAT_FRESH_SECONDS",
    "claimed_shelves",
    "gateway_alive",
    "hold_shelf",
    "live_heartbeats",
    "release_shelf",
    "remove_heartbeat",
    "sweep_dead_heartbeats",
    "write_heartbeat",
]

HEARTBEAT_FRESH_SECONDS = 10.0
# A heartbeat file not rewritten for this long, whose process ended, is swept. Not at once: a gateway in another
# pid namespace (a container) sharing the root looks dead from here, but its file is rewritten every 2 s.
DEAD_HEARTBEAT_GRACE_SECONDS = 600.0
HEARTBEAT_MAX_BYTES = 4096
# A heartbeat the sweep renamed aside to judge what it removes: hidden (the rescan's clean-up leaves it), not
# <pid>.json (no reader takes it for a beat).
_ASIDE_PREFIX = ".sweep-"

Writer = Literal["gone", "same", "unknown"]
"""What a heartbeat's pid says of the process that wrote the file: see :func:`_writer`."""

# The shelves this process's gateways hold, by relay directory (``bot_relay/``): one heartbeat file per process
# (``<pid>.json``), so every gateway of the process writes them all, not only its own
_HELD: dict[Path, set[str]] = {}
_HELD_LOCK = threading.Lock()


def hold_shelf(paths: InboxPaths, name: str) -> None:
    """A gateway of this process holds the shelf ``name`` (its own, or a former one its records still name).

    Args:
        paths: the root's relay layout.
        name: the shelf's name (``s-<token>``).
    """
    with _HELD_LOCK:
        _HELD.setdefault(paths.relay.base, set()).add(name)


def release_shelf(paths: InboxPaths, name: str) -> None:
    """This process no longer holds the shelf ``name`` (its gateway stopped, or no record names it any more)."""
    with _HELD_LOCK:
        held = _HELD.get(paths.relay.base)
        if held is not None:
            held.discard(name)
            if not held:
                del _HELD[paths.relay.base]


def _held_here(paths: InboxPaths) -> frozenset[str]:
    with _HELD_LOCK:
        return frozenset(_HELD.get(paths.relay.base, ()))


def claimed_shelves(paths: InboxPaths, *, now: float | None = None) -> frozenset[str]:
    """The shelves a living gateway on this root holds, by its heartbeat (or by this process's own gateways).

    The positive evidence a shelf that is gone needs before its ``sent/`` records are taken for a dead
    gateway's: a fresh heartbeat of a running process (:func:`live_heartbeats`) naming it says its
    gateway lives and waits for them (its directory was removed under it). A stopped gateway withdrew
    its heartbeat, a killed one's pid is gone: neither claims anything. Names that are no shelf's are
    ignored (the file is untrusted).

    Args:
        paths: the root's relay layout.
        now: the current time.

    Returns:
        The shelf names claimed.
    """
    claimed = set(_held_here(paths))
    for beat in live_heartbeats(paths, now=now):
        shelves = beat.get("shelves")
        if isinstance(shelves, list):
            claimed.update(name for name in shelves if isinstance(name, str) and is_shelf_name(name))
    return frozenset(claimed)


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
    shelves = _held_here(paths)
    if shelves:  # the shelves whose sent/ records are ours, even if one was removed under us (claimed_shelves)
        payload["shelves"] = sorted(shelves)
    atomic_write_json(paths.heartbeat / f"{os.getpid()}.json", payload, tmp_dir=paths.relay.tmp,
                      within=paths.relay.base)


def remove_heartbeat(paths: InboxPaths) -> None:
    """A gateway that stops cleanly withdraws its heartbeat; never raises.

    Removed through the checked ``gateways/`` (:func:`remove_below`): one swapped for a symlink is
    refused, so no ``<pid>.json`` outside the root is removed through it. What cannot be removed is
    said at WARNING: once this process is gone, its heartbeat counts for nothing (its pid does not run).

    Args:
        paths: the root's relay layout.
    """
    path = paths.heartbeat / f"{os.getpid()}.json"
    try:
        remove_below(paths.relay.root, path)
    except (OSError, ValidationError) as exc:  # HostileFileError included
        logger.warning("relay: could not withdraw the heartbeat {} ({}); it counts for nothing once this process "
                       "has exited", path, exc)


def _beat_alive(beat: Any, now: float, file_pid: int) -> bool:
    """Pure but for the process table: whether a heartbeat read from ``<file_pid>.json`` is a live gateway's.

    The file is untrusted (any process of our uid can write one): it counts only when it is fresh,
    names the pid of its file name, carries a valid connection id ("" when the gateway has none),
    and its pid runs — and, when it records ``pid_start``, started then (a pid reused since, or a
    file naming some other process of ours such as pid 1, is not a gateway's). Without ``pid_start``
    nothing ties the file to the process now holding its pid: freshness alone bounds how long it
    is believed (a pid reused within ``HEARTBEAT_FRESH_SECONDS`` of its gateway's death, at most).
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
    return _writer(pid, beat.get("pid_start")) != "gone"


def _writer(pid: int, recorded_start: Any) -> Writer:
    """Pure but for the process table: what is known of the process that wrote a heartbeat as ``pid``.

    Args:
        pid: the pid the heartbeat names (its file's name).
        recorded_start: the file's ``pid_start`` (untrusted; None when it has none or it cannot be read).

    Returns:
        ``"gone"`` when ``pid`` no longer runs (a zombie included), or runs but started at another time
        than ``recorded_start`` (the pid was reused since); ``"same"`` when it runs and started exactly
        then; ``"unknown"`` when it runs and nothing ties it to the file: no ``pid_start`` (a gateway on
        a system without /proc, an earlier version, or a planted file writes none) or no ``/proc`` here.
    """
    if not pid_alive(pid):
        return "gone"
    start = process_start_ticks(pid) if recorded_start is not None else None
    if start is None:
        return "unknown"
    return "same" if recorded_start == start else "gone"


def live_heartbeats(paths: InboxPaths, *, now: float | None = None) -> list[dict[str, Any]]:
    """The heartbeats of the gateway processes on this root that wrote one lately and still run.

    A killed gateway's file stays behind until housekeeping sweeps it: it is never taken for a live one.

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
                    beat = read_json_file(paths.heartbeat / name, max_bytes=HEARTBEAT_MAX_BYTES, dir_fd=fd)
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


def sweep_dead_heartbeats(paths: InboxPaths, *, now: float, grace: float = DEAD_HEARTBEAT_GRACE_SECONDS) -> int:
    """Remove the heartbeat files of gateway processes that provably ended (killed, so never withdrawn).

    A file goes only when it is a regular file of ours (a symlink, or anything else, is left and never
    followed), was not rewritten for ``grace`` seconds, and nothing proves its writer still runs: the
    process its name names no longer runs or is another process since (``pid_start``: the liveness rule
    the readers apply), or the file cannot prove it is that process's (no ``pid_start``, a content that
    is no heartbeat of that pid, no ``/proc`` here). Readers believe no file that old anyway; a live
    gateway's file (its ``pid_start`` matching) is never removed, however old. Never raises: what cannot
    be looked at is left for the next sweep.

    Args:
        paths: the root's relay layout.
        now: the current time (``time.time()`` scale, compared with the files' modification times).
        grace: how long a dead process's file is left.

    Returns:
        How many files were removed.
    """
    removed = 0
    cutoff = now - grace
    try:
        # through a descriptor opened without following a symlink: a gateways/ swapped for one is not swept
        with relay_dir(paths.relay.base, paths.heartbeat) as fd:
            for name in os.listdir(fd):
                if name.endswith(".json") and name[:-5].isdigit() and _dead_heartbeat(paths, name, fd, cutoff):
                    removed += _remove_dead(paths, name, fd, cutoff)
    except (OSError, ValidationError):  # HostileFileError included: gateways/ is not a directory of ours
        return removed
    # what a sweep killed between its move aside and its verdict left: no reader lists it (not <pid>.json)
    return removed + sweep_old_files(paths.heartbeat, cutoff, patterns=(f"{_ASIDE_PREFIX}*",), uid=os.getuid(),
                                     within=paths.relay.base)


def _remove_dead(paths: InboxPaths, name: str, fd: int, cutoff: float) -> int:
    """Remove ``<pid>.json`` (found dead) from ``gateways/`` (open as ``fd``) only if the file removed is that one.

    A new gateway given the same pid may beat between the look and the removal: the name is first
    renamed aside (the entry itself, never followed), what was moved is judged again, and only a
    dead file is removed; a live one goes back under its name, unless its gateway beat again
    meanwhile (the newer file stays).

    Returns:
        1 when a dead file was removed, else 0.
    """
    aside = f"{_ASIDE_PREFIX}{name[:-5]}-{uuid.uuid4().hex}"
    try:
        os.rename(name, aside, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:  # gone meanwhile (another gateway's sweep): nothing to do
        return 0
    dead = _dead_heartbeat(paths, aside, fd, cutoff, pid=int(name[:-5]))
    try:
        if dead or _back_under(name, aside, fd):
            os.unlink(aside, dir_fd=fd)
    except OSError as exc:  # the next sweep removes what stayed aside
        logger.warning("relay: could not finish sweeping the heartbeat {}: {}", paths.heartbeat / aside, exc)
        return 0
    return int(dead)


def _back_under(name: str, aside: str, fd: int) -> bool:
    """Give a heartbeat moved aside that proved live its name again; whether the aside name is left to remove.

    A hard link, which fails when the name is taken: a beat written meanwhile is newer and stays. Where
    the file system has no hard links, a rename (a beat written in that very instant is replaced by this
    older one of the same gateway, which writes it again at its next beat, 2 s later).

    Returns:
        True when the aside name still exists (linked back, or a newer beat holds the name); False when
        the file was renamed back.

    Raises:
        OSError: it could not be put back (it stays aside; its gateway writes its name again at its next beat).
    """
    try:
        os.link(aside, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        return True
    except OSError:
        os.rename(aside, name, src_dir_fd=fd, dst_dir_fd=fd)
        return False
    return True


def _dead_heartbeat(paths: InboxPaths, name: str, fd: int, cutoff: float, *, pid: int | None = None) -> bool:
    """Whether ``<pid>.json`` in ``gateways/`` (open as ``fd``) is a file to sweep: see :func:`sweep_dead_heartbeats`.

    ``name`` may be the name it was moved aside to, then ``pid`` is its pid (default: the name's).

    A content that is no heartbeat of that pid (not JSON, not an object, under another pid) proves no
    writer: it goes after the grace period like a file without ``pid_start``. One that cannot be read
    now (a permission, too many open files) is left for the next sweep.
    """
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mtime >= cutoff:
        return False
    pid = int(name[:-5]) if pid is None else pid
    try:
        beat = read_json_file(paths.heartbeat / name, max_bytes=HEARTBEAT_MAX_BYTES, dir_fd=fd)
    except ValidationError:  # HostileFileError included: no heartbeat at all
        beat = None
    except OSError:
        return False
    recorded = beat.get("pid_start") if isinstance(beat, dict) and beat.get("pid") == pid else None
    return _writer(pid, recorded) != "same"
