"""A file its process holds under an exclusive ``flock``: a living owner told from a dead one.

Another process on the same root must tell whether a file's owner is still alive (a relay
shelf's ``.lock``; a DM's envelope staged for ``outbox/`` and its ``withdrawn`` copy). The
owner keeps an exclusive ``flock`` on it for as long as the file is its (:func:`hold`, taken
before anyone looks for the file); the kernel drops the flock when the process dies,
``kill -9`` included. So a lock that can be taken without waiting belongs to nobody alive
(:func:`take_unowned`), and one that cannot is left to its owner.

After taking the lock, the path must still name the file locked: its owner may have removed,
renamed or replaced it (its work done) just before letting go, and a lock on a file no longer
at the path proves nothing about the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from hermes_actors.errors import HostileFileError

__all__ = ["hold", "release", "take_unowned"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a planted FIFO never hangs


def hold(fd: int) -> None:
    """Take the exclusive lock of a file of ours just created (``O_EXCL``): held until ``fd`` is closed.

    Args:
        fd: the new file's descriptor (``O_CLOEXEC``: a child process never inherits the lock).

    Raises:
        OSError: the lock could not be taken (a filesystem without ``flock``).
    """
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def release(fd: int) -> None:
    """Let go of a lock :func:`hold` or :func:`take_unowned` took (closing its descriptor); never raises.

    Args:
        fd: the descriptor holding the lock.
    """
    try:
        os.close(fd)
    except OSError:
        pass


def take_unowned(path: Path, *, dir_fd: int | None = None) -> int | None:
    """Lock the file at ``path`` if no living process holds it.

    Args:
        path: the file (named in errors).
        dir_fd: its directory, opened without following a symlink: ``path``'s name is opened in it.

    Returns:
        The descriptor holding its lock (:func:`release` lets go) when the lock was free and ``path``
        still names the file locked, a regular file of ours; None when a living process holds it, or it
        was removed, renamed or replaced before its lock was free (its owner's work is done).

    Raises:
        FileNotFoundError: nothing is at ``path``.
        HostileFileError: ``path`` is a symlink, not a regular file, or another uid's: never locked.
        OSError: it could not be opened, looked at or locked for another reason.
    """
    name = path.name if dir_fd is not None else path
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostileFileError(f"{path} is a symlink; refusing it as a lock file") from exc
        raise
    taken = False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise HostileFileError(f"{path} is not a regular file of uid {os.getuid()}; refusing it as a lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its owner lives
        try:
            now = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None  # removed or renamed away by its owner before it let go
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            return None  # replaced: the lock we hold is on a file no longer at the path
        taken = True
        return fd
    finally:
        if not taken:
            os.close(fd)
