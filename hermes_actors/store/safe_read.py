"""The hostile-aware read: a JSON file from a directory other programs can write to.

Everything the store reads from such a directory goes through :func:`read_json_file`,
which refuses symlinks, special files, huge files, files of another owner, files
others may write and corrupt JSON.

One rule for a file another program may still be writing (:func:`may_be_unfinished`): the seed and
we write relay files atomically (a temp file, then a rename), but a writer that creates the file and
then writes it shows a watcher an empty or half-written file first. A reader that asks for it
(``unfinished_at``) gets :class:`~hermes_actors.errors.UnfinishedFileError` for an empty or non-JSON
file changed within :data:`WRITE_GRACE_SECONDS`: it leaves the file alone and reads it again at its
close-write event or the next rescan, and refuses it only once it is still bad past the grace.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import orjson

from hermes_actors.errors import HostileFileError, UnfinishedFileError

__all__ = ["DEFAULT_MAX_BYTES", "WRITE_GRACE_SECONDS", "may_be_unfinished", "read_json_file", "writable_by_others"]

DEFAULT_MAX_BYTES = 1 << 20
"""Largest JSON file :func:`read_json_file` accepts by default (1 MiB)."""

WRITE_GRACE_SECONDS = 2.0
"""How long after its last change an empty or non-JSON file may still be being written (:func:`may_be_unfinished`)."""

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


def may_be_unfinished(changed_at: float, now: float) -> bool:
    """Pure: whether a file that is empty or not valid JSON may still be being written, so is not refused yet.

    The one rule for every relay file read on its create event (a reply, an envelope in ``outbox/`` or
    ``inbox/``, a ``delivered/`` record): a writer that creates the file, then writes it, shows an empty or
    half-written file first. Such a file is left where it is while it changed within
    :data:`WRITE_GRACE_SECONDS`, and refused once it is still bad past that.

    Args:
        changed_at: the file's ``st_ctime``: its last change (a write, a rename, a ``chmod``), which no
            writer can set back, unlike the mtime.
        now: the current time (``time.time()``).

    Returns:
        True when it changed less than :data:`WRITE_GRACE_SECONDS` before ``now`` (or after it: a clock set
        back by less than that).
    """
    return abs(now - changed_at) < WRITE_GRACE_SECONDS


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
            an empty or non-JSON one that changed within :data:`WRITE_GRACE_SECONDS` of it
            (:func:`may_be_unfinished`) raises :class:`~hermes_actors.errors.UnfinishedFileError`;
            None: it is refused at once. Every other refusal is the same either way.

    Returns:
        The parsed JSON value (any JSON type; callers validate the shape).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnfinishedFileError: (with ``unfinished_at``) empty or not valid JSON, and changed within the grace.
        HostileFileError: ``path`` is a symlink, not a regular file, too large,
            owned by another uid, writable by group/others, or not valid JSON.
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
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if unfinished_at is not None and may_be_unfinished(st.st_ctime, unfinished_at):
            raise UnfinishedFileError(f"{path} is not valid JSON yet ({exc}), but it changed "
                                      f"{max(0.0, unfinished_at - st.st_ctime):.2f}s ago: it may still be being "
                                      "written") from exc
        raise HostileFileError(f"{path} is not valid JSON: {exc}") from exc
