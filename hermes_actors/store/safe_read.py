"""The hostile-aware read: a JSON file from a directory other programs can write to.

Everything the store reads from such a directory goes through :func:`read_json_file`,
which refuses symlinks, special files, huge files, files of another owner, files
others may write and corrupt JSON.

One rule for a file another program may still be writing (:func:`may_be_unfinished`): the seed and
we write relay files atomically (a temp file, then a rename), but a writer that creates the file and
then writes it shows a watcher an empty or half-written file first. A reader that asks for it
(``unfinished_at``) gets :class:`~hermes_actors.errors.UnfinishedFileError` for an empty or non-JSON
file changed within :data:`WRITE_GRACE_SECONDS`: it leaves the file alone and reads it again at its
close-write event or the next rescan, and refuses it only once it is still bad past the grace. The grace is
also bounded by when this process first saw the file bad (a bounded table, :data:`BAD_SIGHTINGS_MAX`): a file
whose ctime keeps changing (its owner ``chmod`` s it every second, or writes it bit by bit) is refused once
that first sighting is older than the grace, whatever its ctime says.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

from hermes_actors.errors import HostileFileError, UnfinishedFileError

__all__ = [
    "BAD_SIGHTINGS_MAX",
    "DEFAULT_MAX_BYTES",
    "WRITE_GRACE_SECONDS",
    "BadSightings",
    "may_be_unfinished",
    "read_json_file",
    "read_json_file_stat",
    "writable_by_others",
]

DEFAULT_MAX_BYTES = 1 << 20
"""Largest JSON file :func:`read_json_file` accepts by default (1 MiB)."""

WRITE_GRACE_SECONDS = 2.0
"""How long after its last change an empty or non-JSON file may still be being written (:func:`may_be_unfinished`),
and at most how long after this process first saw it so."""

BAD_SIGHTINGS_MAX = 1024
"""How many files :func:`read_json_file` remembers having seen empty or not JSON yet (:class:`BadSightings`)."""

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


_UTF8_BOM = b"\xef\xbb\xbf"


def writable_by_others(mode: int) -> bool:
    """Pure: whether a file or directory ``mode`` lets its group or other users write it.

    A file so is refused (someone else may have changed it); in a directory so, someone else may
    create, replace or remove its entries.

    Args:
        mode: an ``st_mode``.

    Returns:
        True when the group- or other-write bit is set.
    """
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def may_be_unfinished(changed_at: float, now: float, *, first_seen_bad: float | None = None) -> bool:
    """Pure: whether a file that is empty or not valid JSON may still be being written, so is not refused yet.

    The one rule for every relay file read on its create event (a reply, an envelope in ``outbox/`` or
    ``inbox/``, a ``delivered/`` record): a writer that creates the file, then writes it, shows an empty or
    half-written file first. Such a file is left where it is while it changed within
    :data:`WRITE_GRACE_SECONDS`, and refused once it is still bad past that, or once this process first saw it
    bad longer ago than that (a file whose ctime keeps changing is not left for good).

    Args:
        changed_at: the file's ``st_ctime``: its last change (a write, a rename, a ``chmod``), which no
            writer can set back, unlike the mtime.
        now: the current time (``time.time()``).
        first_seen_bad: when this process first saw this file empty or not JSON (:class:`BadSightings`);
            None: not known (only its ctime decides).

    Returns:
        True when it changed less than :data:`WRITE_GRACE_SECONDS` before ``now`` (or after it: a clock set
        back by less than that), and was first seen bad less than that before ``now`` (or after it).
    """
    if abs(now - changed_at) >= WRITE_GRACE_SECONDS:
        return False
    return first_seen_bad is None or abs(now - first_seen_bad) < WRITE_GRACE_SECONDS


SightingKey = tuple[int, int, str]
"""A file as :class:`BadSightings` knows it: ``(st_dev, st_ino, name)`` (a rename to another directory keeps it;
the name keeps a reused inode of another file from inheriting its sighting)."""


class BadSightings:
    """When this process first saw each file empty or not JSON yet: the bound on :func:`may_be_unfinished`'s grace.

    Bounded (``limit`` entries, the oldest sighting dropped first); a file is forgotten when it is read whole or
    refused. Shared by every reader of the process (the relay's, the hub's threads): guarded by a lock held only
    for a dict operation.
    """

    def __init__(self, limit: int = BAD_SIGHTINGS_MAX) -> None:
        """Args:
            limit: the most files remembered.
        """
        self._limit = limit
        self._first: OrderedDict[SightingKey, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_seen(self, key: SightingKey, now: float) -> float:
        """When ``key`` was first seen bad; ``now`` (remembered) when this is the first time.

        Args:
            key: the file (:data:`SightingKey`).
            now: the current time.

        Returns:
            The time of its first sighting.
        """
        with self._lock:
            first = self._first.setdefault(key, now)
            while len(self._first) > self._limit:
                self._first.popitem(last=False)
            return first

    def forget(self, key: SightingKey) -> None:
        """Drop ``key`` (read whole, or refused): a later sighting starts a new grace.

        Args:
            key: the file (:data:`SightingKey`).
        """
        if not self._first:  # the usual case, checked without the lock: nothing was ever seen bad
            return
        with self._lock:
            self._first.pop(key, None)

    def __len__(self) -> int:
        """How many files are remembered."""
        return len(self._first)


BAD_SIGHTINGS = BadSightings()
"""The process's table of :class:`BadSightings`, used by :func:`read_json_file`."""


def _why_hostile(st: os.stat_result, *, max_bytes: int, expect_uid: int | None) -> str | None:
    """Decide whether a stat result describes a file we must refuse.

    Args:
        st: ``fstat`` of the opened file.
        max_bytes: largest acceptable size.
        expect_uid: required owner, or None to accept any owner.

    Returns:
        The reason the file is refused, or None when it is acceptable.
    """
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size > max_bytes:
        return f"is too large ({st.st_size} bytes > {max_bytes})"
    if expect_uid is not None and st.st_uid != expect_uid:
        return f"is owned by uid {st.st_uid}, expected {expect_uid}"
    if writable_by_others(st.st_mode):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _read_limited(fd: int, max_bytes: int) -> bytes:
    """Read at most ``max_bytes + 1`` bytes from ``fd``.

    Args:
        fd: an open file descriptor.
        max_bytes: the size limit (one more byte is read to detect growth).

    Returns:
        The bytes read.
    """
    chunks: list[bytes] = []
    remaining = max_bytes + 1
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_json_file(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    expect_uid: int | None = os.getuid(),
    dir_fd: int | None = None,
    unfinished_at: float | None = None,
) -> Any:
    """Read and parse a JSON file that other programs could have tampered with.

    Args:
        path: the file to read.
        max_bytes: refuse files larger than this.
        expect_uid: required owner uid (default: this process's), None = any.
        dir_fd: an open directory to read ``path.name`` from (its full ``path`` only names it in
            errors): a directory swapped for a symlink after it was opened is not followed.
        unfinished_at: the current time, for a file another program may still be writing in place:
            an empty or non-JSON one that changed within :data:`WRITE_GRACE_SECONDS` of it, and was first
            seen so by this process within that too (:func:`may_be_unfinished`, :data:`BAD_SIGHTINGS`),
            raises :class:`~hermes_actors.errors.UnfinishedFileError`; None: it is refused at once. Every
            other refusal is the same either way.

    Returns:
        The parsed JSON value (any JSON type; callers validate the shape).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnfinishedFileError: (with ``unfinished_at``) empty or not valid JSON, and changed within the grace.
        HostileFileError: ``path`` is a symlink, not a regular file, too large,
            owned by another uid, writable by group/others, or not valid JSON.
        OSError: any other OS failure opening or reading the file.
    """
    return read_json_file_stat(path, max_bytes=max_bytes, expect_uid=expect_uid, dir_fd=dir_fd,
                               unfinished_at=unfinished_at)[0]


def read_json_file_stat(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    expect_uid: int | None = os.getuid(),
    dir_fd: int | None = None,
    unfinished_at: float | None = None,
) -> tuple[Any, os.stat_result]:
    """:func:`read_json_file`, with the ``fstat`` of the file taken before it was read.

    For a reader that moves the file after reading it and must know that what it moved is what it read
    (the same inode, size and mtime).

    Args:
        path: the file to read.
        max_bytes: refuse files larger than this.
        expect_uid: required owner uid (default: this process's), None = any.
        dir_fd: an open directory to read ``path.name`` from.
        unfinished_at: the current time, for a file another program may still be writing in place.

    Returns:
        The parsed JSON value and the file's stat result.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnfinishedFileError: (with ``unfinished_at``) empty or not valid JSON, and changed within the grace.
        HostileFileError: as :func:`read_json_file`.
        OSError: any other OS failure opening or reading the file.
    """
    try:
        fd = os.open(path if dir_fd is None else path.name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostileFileError(f"{path} is a symlink") from exc
        if exc.errno == errno.ENXIO:  # a socket (or a device with nothing behind it): not a regular file
            raise HostileFileError(f"{path} is not a regular file") from exc
        raise
    try:
        st = os.fstat(fd)
        why = _why_hostile(st, max_bytes=max_bytes, expect_uid=expect_uid)
        if why is not None:
            raise HostileFileError(f"{path} {why}")
        data = _read_limited(fd, max_bytes)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise HostileFileError(f"{path} is too large (grew past {max_bytes} bytes while reading)")
    if data.startswith(_UTF8_BOM):  # the seed reads relay replies as utf-8-sig: a peer may write one
        data = data[len(_UTF8_BOM):]
    key = (st.st_dev, st.st_ino, path.name)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if unfinished_at is not None:
            first = BAD_SIGHTINGS.first_seen(key, unfinished_at)
            if may_be_unfinished(st.st_ctime, unfinished_at, first_seen_bad=first):
                raise UnfinishedFileError(f"{path} is not valid JSON yet ({exc}), but it changed "
                                          f"{max(0.0, unfinished_at - st.st_ctime):.2f}s ago: it may still be "
                                          "being written") from exc
            BAD_SIGHTINGS.forget(key)
        raise HostileFileError(f"{path} is not valid JSON: {exc}") from exc
    if unfinished_at is not None:
        BAD_SIGHTINGS.forget(key)
    return value, st
