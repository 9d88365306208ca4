"""The ``<root>/bot_relay/`` files: thin file I/O (the impure half of the relay).

The roster, the envelopes of ``outbox/`` and ``claimed/``, the replies, and the
sweeping and listing of the relay directories; the layout is
:class:`hermes_actors.store.relay_paths.RelayPaths`, and a refused file is moved
aside by :mod:`hermes_actors.store.relay_quarantine`.

Only I/O lives here. The pure rules are imported from where they are defined:
:mod:`hermes_actors.store.relay_protocol` (constants, envelopes, replies; the
Redis transport shares these records without the files),
:mod:`hermes_actors.store.relay_roster` (roster rows, targets, liveness), and
ids and handles from :mod:`hermes_actors.core.ids` / :mod:`hermes_actors.core.names`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.ids import id_of_file_name
from hermes_actors.errors import ValidationError
from hermes_actors.messages import RemoteAgent
from hermes_actors.store.atomic import (
    atomic_write_json,
    create_exclusive_json,
    read_json_file,
)
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import rename_between
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_protocol import (
    REPLY_FILE_MAX_BYTES,
    STALE_AFTER_SECONDS,
    parse_envelope,
    parse_reply,
)
from hermes_actors.store.relay_quarantine import regular_or_quarantined
from hermes_actors.store.relay_roster import normalize_roster, parse_roster_payload, roster_row_dict
from hermes_actors.store.sweep import sweep_old_files

__all__ = [
    "claim_envelope",
    "enqueue_envelope",
    "list_ids",
    "read_envelope",
    "read_reply",
    "read_roster",
    "read_roster_version",
    "roster_identity",
    "sweep_stale",
    "write_reply",
    "write_roster",
]


# ── roster ──────────────────────────────────────────────────────────────────


def write_roster(paths: RelayPaths, rows: Any, *, now: float) -> int:
    """Normalize and atomically persist the Desktop-pushed remote roster.

    Args:
        paths: the relay layout.
        rows: the raw, untrusted ``agents`` list.
        now: the current time (``updated_at``).

    Returns:
        How many rows were kept.

    Raises:
        HostileFileError: a relay directory is hostile.
        StoreError: the write failed.
    """
    agents = normalize_roster(rows)
    ensure_private_dir(paths.base, within=paths.root)
    ensure_private_dir(paths.tmp, within=paths.root)
    payload = {"updated_at": int(now), "agents": [roster_row_dict(agent) for agent in agents]}
    atomic_write_json(paths.roster, payload, tmp_dir=paths.tmp, sort_keys=True, within=paths.base)
    return len(agents)


RosterIdentity = tuple[int, int, int]
"""Which version of ``roster.json`` a read saw: its ``(inode, size, mtime_ns)``."""


def _identity(info: os.stat_result) -> RosterIdentity:
    """Pure: the :data:`RosterIdentity` of a file's ``lstat``."""
    return info.st_ino, info.st_size, info.st_mtime_ns


def roster_identity(path: Path) -> RosterIdentity | None:
    """Which version of the roster file is at ``path`` now: one ``lstat`` (a symlink is not followed).

    Cheap enough for a DM's sender to ask before it is planned: compared with the identity the
    published roster was read from (:func:`read_roster_version`), a difference says the file was
    rewritten since (an atomic rewrite makes a new inode; one in place a new mtime or size).

    Args:
        path: ``bot_relay/roster.json``.

    Returns:
        Its identity; None when there is no such file or it cannot be stat'ed.
    """
    try:
        return _identity(os.lstat(path))
    except OSError:
        return None


def read_roster(paths: RelayPaths, *, now: float | None = None) -> tuple[list[RemoteAgent], float | None]:
    """The remote roster and its age. Never raises: :func:`read_roster_version` without the identity.

    Args:
        paths: the relay layout.
        now: the current time (default ``time.time()``), for the age.

    Returns:
        ``(agents, age_seconds)``, as :func:`read_roster_version` reads them.
    """
    agents, age, _identity_read = read_roster_version(paths, now=now)
    return agents, age


def read_roster_version(
    paths: RelayPaths, *, now: float | None = None
) -> tuple[list[RemoteAgent], float | None, RosterIdentity | None]:
    """The remote roster, its age and the identity of the file it was read from. Never raises.

    Args:
        paths: the relay layout.
        now: the current time (default ``time.time()``), for the age.

    Returns:
        ``(agents, age_seconds, identity)``: age from the file's mtime, None when there
        is no roster file; a hostile or unreadable roster gives ``[]`` with
        its age (and a warning), which liveness treats as unknown. Rows the
        roster rules refuse are left out, and one warning names them. A
        warning is said once per version of the file (see :func:`_warn_roster`).
        ``identity`` is the file's :func:`roster_identity`, taken before it was read (a file
        replaced meanwhile is seen as changed again, never the other way round); None when
        there is no file or it cannot be stat'ed.
    """
    try:
        info = os.lstat(paths.roster)
    except FileNotFoundError:
        _roster_warned.pop(paths.roster, None)
        return [], None, None
    except OSError as exc:
        _warn_roster(paths.roster, None, f"cannot stat relay roster {paths.roster}: {exc}")
        return [], None, None
    version = _identity(info)
    age = (time.time() if now is None else now) - info.st_mtime
    refused: list[str] = []
    try:
        agents = parse_roster_payload(read_json_file(paths.roster), refused)
    except FileNotFoundError:
        return [], None, None
    except (OSError, ValidationError) as exc:
        _warn_roster(paths.roster, version, f"ignoring relay roster {paths.roster}: {exc}")
        return [], age, version
    if refused:
        shown = "; ".join(refused[:_ROWS_SHOWN]) + (f"; and {len(refused) - _ROWS_SHOWN} more"
                                                    if len(refused) > _ROWS_SHOWN else "")
        _warn_roster(paths.roster, version,
                     f"relay roster {paths.roster}: {len(refused)} row(s) refused, no DM can reach the agents they "
                     f"name (a roster the Desktop pushes never holds one: fix or remove the file): {shown}")
    else:
        _roster_warned.pop(paths.roster, None)  # a problem coming back is news again
    return agents, age, version


_ROWS_SHOWN = 5  # refused rows named in the warning; a hostile roster may hold thousands

# The last warning said of each roster file, with the version of the file it was about: the roster is re-read at
# every reload (several times a second on a busy gateway), and the same problem is news only once.
_roster_warned: dict[Path, tuple[RosterIdentity | None, str]] = {}


def _warn_roster(path: Path, version: RosterIdentity | None, text: str) -> None:
    """Log ``text`` about the roster ``path``, unless it was said of this version of the file already.

    Args:
        path: the roster file.
        version: its ``(inode, size, mtime_ns)``; None when it could not be stat'ed.
        text: the warning.
    """
    if _roster_warned.get(path) == (version, text):
        return
    _roster_warned[path] = (version, text)
    logger.warning("{}", text)


# ── envelopes ───────────────────────────────────────────────────────────────


def enqueue_envelope(paths: RelayPaths, envelope: dict[str, Any], *, staged_as: str | None = None,
                     before_queued: Callable[[], None] | None = None) -> Path:
    """Atomically write an envelope into ``outbox/`` (0600, via the temp directory).

    Args:
        paths: the relay layout.
        envelope: an envelope (see ``make_envelope``).
        staged_as: the name of its complete temp in the temp directory (None: a random one), held under its
            ``flock`` until the rename landed; see :func:`hermes_actors.store.relay_sent.queueing_name`
            (a restart must find it after a crash, and tell a living writer's from a dead one's).
        before_queued: called between the complete temp and the rename into ``outbox/``; what it raises
            leaves nothing queued and is raised.

    Returns:
        The outbox file.

    Raises:
        ValidationError: the envelope is invalid (nothing is written).
        HostileFileError: a relay directory is hostile.
        StoreError: the write failed: nothing queued.
    """
    env = parse_envelope(envelope)
    target = paths.id_file(paths.outbox, env["id"])
    ensure_private_dir(paths.outbox, within=paths.root)
    ensure_private_dir(paths.tmp, within=paths.root)
    atomic_write_json(target, env, tmp_dir=paths.tmp, within=paths.base, temp_name=staged_as,
                      before_rename=before_queued)
    return target


def claim_envelope(paths: RelayPaths, envelope_id: str) -> Path | None:
    """Claim an outbox envelope by renaming it into ``claimed/``.

    The rename decides: of several concurrent claimers exactly one renames
    the file; the others find the source gone.

    Args:
        paths: the relay layout.
        envelope_id: the envelope to claim.

    Returns:
        The claimed file, or None when someone else claimed it first (or it
        was not a regular file, in which case it is quarantined).

    Raises:
        ValidationError: the id is invalid.
        HostileFileError: the outbox or claimed directory is hostile (a symlink now, not only at start).
        StoreError: the claimed directory could not be created.
        OSError: the rename failed for another reason than a missing source.
    """
    claimed = paths.id_file(paths.claimed, envelope_id)
    ensure_private_dir(paths.claimed, within=paths.root)
    if not rename_between(paths.base, paths.outbox, paths.claimed, claimed.name):  # never through a swapped dir
        return None
    return regular_or_quarantined(paths, claimed, "claimed envelope")


def read_envelope(path: Path, *, dir_fd: int | None = None) -> dict[str, Any]:
    """Read and validate an envelope file (outbox or claimed).

    Args:
        path: ``<dir>/<id>.json``.
        dir_fd: ``<dir>`` opened by :func:`hermes_actors.store.relay_dirfd.relay_dir`: read relative to it.

    Returns:
        The validated envelope.

    Raises:
        FileNotFoundError: the file is gone.
        HostileFileError: the file is refused (see ``read_json_file``).
        ValidationError: the content is not a valid envelope for this name.
    """
    file_id = id_of_file_name(path.name)
    if file_id is None:
        raise ValidationError(f"not an envelope file name: {path.name!r}")
    return parse_envelope(read_json_file(path, dir_fd=dir_fd), file_id=file_id)


# ── replies ─────────────────────────────────────────────────────────────────


def write_reply(paths: RelayPaths, reply: dict[str, Any]) -> bool:
    """Persist a reply; the first reply written for an id wins.

    Args:
        paths: the relay layout.
        reply: a reply record (see ``make_reply``).

    Returns:
        True when this reply was stored; False when one already existed.

    Raises:
        ValidationError: the reply is invalid (nothing is written).
        HostileFileError: a relay directory is hostile.
        StoreError: the write failed.
    """
    rec = parse_reply(reply)
    target = paths.id_file(paths.replies, rec["id"])
    ensure_private_dir(paths.replies, within=paths.root)
    ensure_private_dir(paths.tmp, within=paths.root)
    return create_exclusive_json(target, rec, tmp_dir=paths.tmp, within=paths.base)


def read_reply(paths: RelayPaths, envelope_id: str, *, unfinished_at: float | None = None) -> dict[str, Any] | None:
    """The reply for an envelope, if one was written.

    Args:
        paths: the relay layout.
        envelope_id: the envelope id.
        unfinished_at: the current time, when the file may still be being written (read on its create
            event): see ``read_json_file``.

    Returns:
        The normalized reply, or None when there is none yet.

    Raises:
        ValidationError: the id is invalid, or the reply file's content is
            not a valid reply for this id.
        UnfinishedFileError: (with ``unfinished_at``) empty or not JSON yet, changed within the write grace:
            leave it and read it again later.
        HostileFileError: the reply file is refused (the caller should
            quarantine it).
        OSError: the file could not be read.
    """
    path = paths.id_file(paths.replies, envelope_id)
    try:
        data = read_json_file(path, max_bytes=REPLY_FILE_MAX_BYTES, unfinished_at=unfinished_at)
    except FileNotFoundError:
        return None
    return parse_reply(data, file_id=envelope_id)


# ── housekeeping ────────────────────────────────────────────────────────────


def sweep_stale(paths: RelayPaths, *, now: float) -> int:
    """Remove stale artifacts (older than 6 h) from claimed/replies/outbox/tmp.

    Args:
        paths: the relay layout.
        now: the current time.

    Returns:
        How many files were removed.
    """
    cutoff = now - STALE_AFTER_SECONDS
    swept = sum(sweep_old_files(d, cutoff, within=paths.base) for d in (paths.claimed, paths.replies, paths.outbox))
    return swept + sweep_old_files(paths.tmp, cutoff)  # beside bot_relay/ (outside the watched tree), not in it


def list_ids(directory: Path, *, oldest_first: bool = False, dir_fd: int | None = None) -> list[str]:
    """The envelope ids of the ``<32 hex>.json`` entries of a directory.

    Args:
        directory: a relay directory (missing → empty).
        oldest_first: order by the entries' modification time (then id) instead of by id.
            A rescan takes envelopes in this order, so that DMs found together (at a
            start, after a put-back) reach their target in the order they were posted,
            to the file system's timestamp granularity: ids are random.
        dir_fd: ``directory`` opened by :func:`hermes_actors.store.relay_dirfd.relay_dir`: listed
            through it, so a ``directory`` swapped for a symlink after the check is never listed.

    Returns:
        The ids; every other name is ignored (and so is an entry gone before its ``lstat``).
    """
    try:
        names = os.listdir(directory if dir_fd is None else dir_fd)
    except OSError:
        return []
    ids = [i for i in map(id_of_file_name, names) if i is not None]
    if not oldest_first:
        return sorted(ids)
    dated: list[tuple[int, str]] = []
    for envelope_id in ids:
        try:  # lstat: never follows a planted symlink (taking the envelope refuses it)
            name = f"{envelope_id}.json"
            info = os.lstat(directory / name) if dir_fd is None else os.lstat(name, dir_fd=dir_fd)
            dated.append((info.st_mtime_ns, envelope_id))
        except OSError:
            continue
    return [envelope_id for _, envelope_id in sorted(dated)]
