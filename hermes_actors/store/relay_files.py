"""The ``<root>/bot_relay/`` files: paths and thin file I/O (the impure half of the relay).

Layout (every file 0600, every directory 0700, byte-compatible with the seed)::

    bot_relay/roster.json        {"updated_at": int, "agents": [row...]}
    bot_relay/outbox/<id>.json   queued envelopes (the Desktop drains them)
    bot_relay/claimed/<id>.json  envelopes a drain won (rename decides)
    bot_relay/replies/<id>.json  {id, at, reply, error, reason}; first wins
    bot_relay/quarantine/        refused (hostile) files, moved aside
    bot_relay/locks/             per-profile turn locks
    .bot_relay_tmp/              temp files of atomic writes, beside bot_relay/

The temp directory is ours, not the seed's (the seed writes its temps beside
the target): it sits beside ``bot_relay/`` so that the half-written temps and
their renames never wake the processes watching ``bot_relay/`` (the gateway's
and the hub's recursive watches), and on the same filesystem (checked by
:meth:`RelayPaths.ensure`) so the rename stays atomic.

Only I/O lives here. The pure rules are imported from where they are defined:
:mod:`hermes_actors.store.relay_protocol` (constants, envelopes, replies; the
Redis transport shares these records without the files),
:mod:`hermes_actors.store.relay_roster` (roster rows, targets, liveness), and
ids and handles from :mod:`hermes_actors.core.ids` / :mod:`hermes_actors.core.names`.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.ids import id_of_file_name, validate_delivery_id
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.messages import RemoteAgent
from hermes_actors.store.atomic import (
    atomic_write_json,
    create_exclusive_json,
    read_json_file,
)
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import rename_between
from hermes_actors.store.relay_protocol import (
    CLAIMED,
    LOCKS,
    OUTBOX,
    QUARANTINE,
    RELAY_DIR,
    REPLIES,
    REPLY_FILE_MAX_BYTES,
    ROSTER_FILE,
    STALE_AFTER_SECONDS,
    TMP,
    parse_envelope,
    parse_reply,
)
from hermes_actors.store.relay_roster import normalize_roster, parse_roster_payload, roster_row_dict

__all__ = [
    "RelayPaths",
    "claim_envelope",
    "enqueue_envelope",
    "list_ids",
    "quarantine",
    "quarantine_into",
    "quarantine_name",
    "read_envelope",
    "read_reply",
    "read_roster",
    "regular_or_quarantined",
    "sweep_directory",
    "sweep_stale",
    "write_reply",
    "write_roster",
]


@dataclass(frozen=True)
class RelayPaths:
    """Every path of one ``bot_relay`` directory."""

    base: Path
    outbox: Path
    claimed: Path
    replies: Path
    locks: Path
    tmp: Path
    quarantine: Path
    roster: Path

    @classmethod
    def from_root(cls, root: Path | str) -> RelayPaths:
        """The relay paths under a Hermes root.

        Args:
            root: the Hermes root (the default profile's home).

        Returns:
            The paths (nothing is created).
        """
        base = Path(root) / RELAY_DIR
        return cls(
            base=base,
            outbox=base / OUTBOX,
            claimed=base / CLAIMED,
            replies=base / REPLIES,
            locks=base / LOCKS,
            tmp=Path(root) / TMP,
            quarantine=base / QUARANTINE,
            roster=base / ROSTER_FILE,
        )

    @property
    def root(self) -> Path:
        """The Hermes root holding ``bot_relay/``: the trusted anchor of every directory ensured here."""
        return self.base.parent

    def directories(self) -> tuple[Path, ...]:
        """The directories of the layout, base first.

        Returns:
            base, outbox, claimed, replies, locks, tmp, quarantine.
        """
        return (self.base, self.outbox, self.claimed, self.replies, self.locks, self.tmp, self.quarantine)

    def ensure(self) -> RelayPaths:
        """Create every directory (0700), refusing hostile ones.

        Returns:
            self.

        Raises:
            HostileFileError: a directory is a symlink, a file, or not ours.
            StoreError: a directory could not be created, or the temp directory
                is on another filesystem than ``bot_relay/`` (a rename from it
                would not be atomic).
        """
        for directory in self.directories():
            ensure_private_dir(directory, within=self.root)
        if os.lstat(self.tmp).st_dev != os.lstat(self.base).st_dev:
            raise StoreError(errno.EXDEV, f"the relay temp directory {self.tmp} is on another filesystem than "
                                          f"{self.base}: atomic renames between them are impossible")
        return self

    def id_file(self, directory: Path, envelope_id: str) -> Path:
        """``<directory>/<id>.json`` for a validated id.

        Args:
            directory: one of the relay directories.
            envelope_id: the envelope id.

        Returns:
            The file path.

        Raises:
            ValidationError: the id is not 32 lowercase hex chars.
        """
        return directory / f"{validate_delivery_id(envelope_id, what='envelope id')}.json"


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


def read_roster(paths: RelayPaths, *, now: float | None = None) -> tuple[list[RemoteAgent], float | None]:
    """The remote roster and its age. Never raises.

    Args:
        paths: the relay layout.
        now: the current time (default ``time.time()``), for the age.

    Returns:
        ``(agents, age_seconds)``: age from the file's mtime, None when there
        is no roster file; a hostile or unreadable roster gives ``[]`` with
        its age (and a warning), which liveness treats as unknown.
    """
    try:
        mtime = os.lstat(paths.roster).st_mtime
    except FileNotFoundError:
        return [], None
    except OSError as exc:
        logger.warning("cannot stat relay roster {}: {}", paths.roster, exc)
        return [], None
    age = (time.time() if now is None else now) - mtime
    try:
        return parse_roster_payload(read_json_file(paths.roster)), age
    except FileNotFoundError:
        return [], None
    except (OSError, ValidationError) as exc:
        logger.warning("ignoring relay roster {}: {}", paths.roster, exc)
        return [], age


# ── envelopes ───────────────────────────────────────────────────────────────


def enqueue_envelope(paths: RelayPaths, envelope: dict[str, Any]) -> Path:
    """Atomically write an envelope into ``outbox/`` (0600, via the temp directory).

    Args:
        paths: the relay layout.
        envelope: an envelope (see ``make_envelope``).

    Returns:
        The outbox file.

    Raises:
        ValidationError: the envelope is invalid (nothing is written).
        HostileFileError: a relay directory is hostile.
        StoreError: the write failed.
    """
    env = parse_envelope(envelope)
    target = paths.id_file(paths.outbox, env["id"])
    ensure_private_dir(paths.outbox, within=paths.root)
    ensure_private_dir(paths.tmp, within=paths.root)
    atomic_write_json(target, env, tmp_dir=paths.tmp, within=paths.base)
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


def regular_or_quarantined(paths: RelayPaths, path: Path, what: str) -> Path | None:
    """``path`` when it is a regular file; None when it is gone, quarantined when it is anything else.

    Args:
        paths: the relay layout (its quarantine).
        path: an envelope just claimed by rename.
        what: how the log and the quarantine name it.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        quarantine(paths, path, f"{what} is not a regular file")
        return None
    return path


def read_envelope(path: Path) -> dict[str, Any]:
    """Read and validate an envelope file (outbox or claimed).

    Args:
        path: ``<dir>/<id>.json``.

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
    return parse_envelope(read_json_file(path), file_id=file_id)


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


def read_reply(paths: RelayPaths, envelope_id: str) -> dict[str, Any] | None:
    """The reply for an envelope, if one was written.

    Args:
        paths: the relay layout.
        envelope_id: the envelope id.

    Returns:
        The normalized reply, or None when there is none yet.

    Raises:
        ValidationError: the id is invalid, or the reply file's content is
            not a valid reply for this id.
        HostileFileError: the reply file is refused (the caller should
            quarantine it).
        OSError: the file could not be read.
    """
    path = paths.id_file(paths.replies, envelope_id)
    try:
        data = read_json_file(path, max_bytes=REPLY_FILE_MAX_BYTES)
    except FileNotFoundError:
        return None
    return parse_reply(data, file_id=envelope_id)


# ── housekeeping ────────────────────────────────────────────────────────────


_NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, tmpfs)


def quarantine_name(name: str, stamp: int, token: str) -> str:
    """Pure: the name a quarantined file gets: its own (cut to fit), then when and a random token.

    Args:
        name: the refused file's name (as the OS gave it: undecodable bytes surrogate-escaped).
        stamp: ``time.time_ns()``.
        token: a few random hex chars (two quarantines in one nanosecond never collide).

    Returns:
        ``<name>.<stamp>.<token>.quarantined``, at most 255 bytes: a file whose own name is
        already that long is still moved aside, never warned about at every rescan.
    """
    suffix = os.fsencode(f".{stamp}.{token}.quarantined")
    kept = os.fsencode(name)[: _NAME_MAX - len(suffix)]
    return os.fsdecode(kept + suffix)


def quarantine(paths: RelayPaths, path: Path, why: str) -> Path | None:
    """Move a refused file aside into ``quarantine/`` (a symlink moves as is).

    Args:
        paths: the relay layout.
        path: the refused file (inside the relay directory).
        why: the reason, logged with the move.

    Returns:
        The new path, or None when the file was already gone or could not be
        moved (logged).
    """
    return quarantine_into(paths.quarantine, path, why, within=paths.root)


def quarantine_into(directory: Path, path: Path, why: str, *, within: Path | None = None) -> Path | None:
    """Move a refused file aside into ``directory`` (created 0700 if missing; a symlink moves as is).

    Args:
        directory: the quarantine directory (``bot_relay/quarantine``).
        path: the refused file.
        why: the reason, logged with the move.
        within: the root ``directory`` must stay under (see :func:`ensure_private_dir`).

    Returns:
        The new path, or None when the file was already gone or could not be moved (logged).
    """
    dest = directory / quarantine_name(path.name, time.time_ns(), secrets.token_hex(4))
    try:
        ensure_private_dir(directory, within=within)
        os.rename(path, dest)  # rename never follows a symlink
    except FileNotFoundError:
        return None
    except (OSError, HostileFileError) as exc:
        logger.warning("could not quarantine {} ({}): {}", path, why, exc)
        return None
    logger.warning("quarantined {} -> {}: {}", path, dest, why)
    return dest


def sweep_directory(directory: Path, cutoff: float) -> int:
    """Remove regular files with an mtime before ``cutoff`` (no symlinks).

    Args:
        directory: the directory to sweep (missing → nothing).
        cutoff: the mtime limit.

    Returns:
        How many files were removed.
    """
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed


def sweep_stale(paths: RelayPaths, *, now: float) -> int:
    """Remove stale artifacts (older than 6 h) from claimed/replies/outbox/tmp.

    Args:
        paths: the relay layout.
        now: the current time.

    Returns:
        How many files were removed.
    """
    cutoff = now - STALE_AFTER_SECONDS
    return sum(sweep_directory(d, cutoff) for d in (paths.claimed, paths.replies, paths.outbox, paths.tmp))


def list_ids(directory: Path, *, oldest_first: bool = False) -> list[str]:
    """The envelope ids of the ``<32 hex>.json`` entries of a directory.

    Args:
        directory: a relay directory (missing → empty).
        oldest_first: order by the entries' modification time (then id) instead of by id.
            A rescan takes envelopes in this order, so that DMs found together (at a
            start, after a put-back) reach their target in the order they were posted,
            to the file system's timestamp granularity: ids are random.

    Returns:
        The ids; every other name is ignored (and so is an entry gone before its ``lstat``).
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    ids = [i for i in map(id_of_file_name, names) if i is not None]
    if not oldest_first:
        return sorted(ids)
    dated: list[tuple[int, str]] = []
    for envelope_id in ids:
        try:  # lstat: never follows a planted symlink (taking the envelope refuses it)
            dated.append((os.lstat(directory / f"{envelope_id}.json").st_mtime_ns, envelope_id))
        except OSError:
            continue
    return [envelope_id for _, envelope_id in sorted(dated)]
