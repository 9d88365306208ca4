"""The DM query-file directory and the files in it.

A DM's text reaches the ``hermes`` CLI through a query file, never through
shell text. The files live in one per-user directory under the temp root,
``<temp>/hermes-dm-<uid>`` (mode 0700). The temp root is shared with other
users, so the directory is refused — never written through — when it is a
symlink, not a directory, owned by someone else or has a mode other than
0700: an attacker who pre-created the path must not receive message text.

Lifetimes are explicit: :func:`write_dm_file` creates a file, whoever ran the
turn removes it with :func:`remove_dm_file`, and :func:`cleanup_bot_dm_cache`
(periodic housekeeping, called by the owner of the process) sweeps the orphans
of runners that died before they could remove theirs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from pathlib import Path

from loguru import logger

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.store.sweep import sweep_old_files

__all__ = [
    "DM_DIR_PREFIX",
    "cleanup_bot_dm_cache",
    "dm_dir",
    "dm_file_path",
    "remove_dm_file",
    "write_dm_file",
]

DM_DIR_PREFIX = "hermes-dm"
_DM_DIR_PATTERNS = ("*.txt", "*.live.json")
_LEGACY_PATTERNS = ("hermes-dm-*.txt", "hermes-relay-dm-*.txt")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _uid() -> int | None:
    """The effective uid (owner of the files we create), or None without uids."""
    getter = getattr(os, "geteuid", None)
    return getter() if callable(getter) else None


def _dir_name() -> str:
    """``hermes-dm-<uid>`` (the real uid, as the seed names it)."""
    getter = getattr(os, "getuid", None)
    return f"{DM_DIR_PREFIX}-{getter()}" if callable(getter) else DM_DIR_PREFIX


def _temp_root(base: Path | None) -> Path:
    return Path(base) if base is not None else Path(tempfile.gettempdir())


def dm_dir(base: Path | None = None) -> Path:
    """Return the per-user DM directory, creating it (mode 0700) when missing.

    Args:
        base: the directory to create it in; the system temp root when None.

    Returns:
        ``<base>/hermes-dm-<uid>``, verified to be a real directory owned by
        this uid with mode 0700.

    Raises:
        PermissionError: the path is a symlink, not a directory, owned by
            another uid, or has a mode other than 0700. Nothing is changed.
        OSError: the directory could not be created.
    """
    uid = _uid()
    path = _temp_root(base) / _dir_name()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        # The umask may have cleared bits of a directory we just made; it is
        # ours (a sticky temp root keeps others from swapping it), so set it.
        os.chmod(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(
            f"refusing DM directory {path}: it is a symlink (possibly planted by another user); "
            "remove it and retry"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(
            f"refusing DM directory {path}: it exists but is not a directory; remove it and retry"
        )
    if uid is None:
        return path
    if info.st_uid != uid:
        raise PermissionError(
            f"refusing DM directory {path}: it is owned by uid {info.st_uid}, not by us (uid {uid}); "
            "remove it (as its owner or root) and retry"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        raise PermissionError(
            f"refusing DM directory {path}: it has mode {mode:04o}, expected 0700; remove it or chmod 700"
        )
    return path


def dm_file_path(delivery_id: str, *, base: Path | None = None) -> Path:
    """Return where the query file of ``delivery_id`` lives (the file may not exist).

    Args:
        delivery_id: 32 lowercase hex characters.
        base: the temp root holding the DM directory; the system one when None.

    Returns:
        ``<dm_dir>/dm-<delivery_id>.txt``.

    Raises:
        ValueError: (a ValidationError) ``delivery_id`` is not 32 lowercase hex characters.
        PermissionError: the DM directory is refused (see :func:`dm_dir`).
    """
    validate_delivery_id(delivery_id)  # a ValidationError is a ValueError
    return dm_dir(base) / f"dm-{delivery_id}.txt"


def _read_existing(path: Path) -> str:
    """Read an existing query file without following a symlink; refuse odd files."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))  # a FIFO: refused
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"refusing DM file {path}: it is a symlink; remove it and retry") from exc
        raise
    with os.fdopen(fd, "r", encoding="utf-8", errors="strict") as handle:
        info = os.fstat(handle.fileno())
        uid = _uid()
        if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
            raise PermissionError(
                f"refusing DM file {path}: not a regular file owned by us; remove it and retry"
            )
        return handle.read()


def write_dm_file(delivery_id: str, content: str, *, base: Path | None = None) -> Path:
    """Write the query file of one delivery: ``<dm_dir>/dm-<delivery_id>.txt``, mode 0600.

    The file is created exclusively and never through a symlink. A retry that
    replays the same delivery id with the same content gets the existing file.

    Args:
        delivery_id: 32 lowercase hex characters (checked before any path is built).
        content: the text the turn reads, written as UTF-8.
        base: the temp root holding the DM directory; the system one when None.

    Returns:
        The path of the query file.

    Raises:
        ValueError: a bad ``delivery_id``, or a file for it already exists
            with different content.
        PermissionError: the DM directory or an existing file is refused.
        OSError / UnicodeError: the write failed; the partial file is removed.
    """
    path = dm_file_path(delivery_id, base=base)
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | _O_NOFOLLOW | _O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        if _read_existing(path) != content:
            raise ValueError(
                f"DM file {path} already exists with different content; "
                f"delivery id {delivery_id} is being reused for another message"
            ) from None
        logger.debug("DM file {} replayed for delivery {}", path, delivery_id)
        return path
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(content)
    except BaseException:
        # If fdopen itself failed, the raw descriptor is still open; a second close is harmless.
        with contextlib.suppress(OSError):
            os.close(fd)
        remove_dm_file(path)
        raise
    return path


def remove_dm_file(path: Path) -> None:
    """Remove a query file (or a leftover ``.live.json``) — never raises.

    A missing file is fine; any other failure is logged, because this runs in
    cleanup paths where raising would hide the turn's own result.

    Args:
        path: the file to remove.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        logger.warning("could not remove DM file {}: {}", path, exc)


def cleanup_bot_dm_cache(
    max_age_hours: float = 24, *, now: float | None = None, base: Path | None = None
) -> int:
    """Delete orphaned DM files older than ``max_age_hours``.

    Swept: ``*.txt`` and ``*.live.json`` in the DM directory, and the legacy
    temp-root orphans ``hermes-dm-*.txt`` / ``hermes-relay-dm-*.txt`` of older
    versions. Only regular files owned by this uid are removed; symlinks are
    never followed nor removed. A refused DM directory is skipped (logged).

    Args:
        max_age_hours: files modified longer ago than this are removed.
        now: the current time (``time.time()`` when None).
        base: the temp root; the system one when None.

    Returns:
        The number of files removed.
    """
    cutoff = (time.time() if now is None else now) - max_age_hours * 3600
    uid = _uid()
    removed = sweep_old_files(_temp_root(base), cutoff, patterns=_LEGACY_PATTERNS, uid=uid)
    try:
        directory = dm_dir(base)
    except OSError as exc:
        logger.warning("DM cache cleanup skipped the DM directory: {}", exc)
    else:
        removed += sweep_old_files(directory, cutoff, patterns=_DM_DIR_PATTERNS, uid=uid)
    if removed:
        logger.debug("DM cache cleanup removed {} file(s)", removed)
    return removed
