"""The host lock, ``<root>/bot_relay/run/submit.lock``: held (flock) for a host's life, naming it.

The process that serves a root's submit endpoint takes this lock first and writes its
pid into it, so a second host of the same root is refused with the first one's pid
(:func:`already_hosted`), and a socket file found by the lock holder is stale. Only a
regular file of ours with one name is used as the lock: anything else at its name (a
symlink, a hard link, a FIFO, another uid's file) is refused, never followed or written
through. Reading who holds it is the client's: :func:`hermes_actors.hermes.submit_client.lock_holder`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from hermes_actors.errors import HostileFileError
from hermes_actors.hermes.submit_protocol import socket_path
from hermes_actors.store.os_errors import store_error

__all__ = ["already_hosted", "open_lock_file", "take_host_lock"]


def already_hosted(root: Path, holder: object) -> RuntimeError:
    """The error of a second host of ``root``: names the process that hosts it (``holder``: its pid) and what to do."""
    return RuntimeError(
        f"another process (pid {holder}) already hosts the actors of {root} "
        f"(its submit endpoint is {socket_path(root)}); stop it first (a `hermes gateway run` hosts them while "
        "its config.yaml has platforms.hermes_actors.enabled: true; set it to false to keep that gateway "
        "for warm turns only)"
    )


# O_NONBLOCK: a FIFO at the lock's name is opened (and refused) instead of waited on
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# what sits at the lock's name when opening it fails with these (EACCES: another uid's file, or a mode we lack)
_LOCK_OPEN_REFUSALS = {errno.ELOOP: "a symlink", errno.EISDIR: "a directory", errno.ENXIO: "not a regular file",
                       errno.EACCES: "not ours to open"}


def _lock_file_refusal(st: os.stat_result, uid: int) -> str | None:
    """Pure: why an opened ``submit.lock`` must not be used (written with our pid), or None when it may.

    Args:
        st: ``fstat`` of the opened file.
        uid: our uid.

    Returns:
        What the file is ("a directory", "a hard link (2 names)"...), or None for a regular
        file of ``uid`` with one name.
    """
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}"
    if st.st_nlink != 1:
        # the pid written into it would land in every other name of the file, maybe outside the root
        return f"a hard link ({st.st_nlink} names)"
    return None


def open_lock_file(dir_fd: int, path: Path) -> int:
    """Open (create, 0600) the host lock ``path`` in the checked ``run`` directory ``dir_fd``.

    Only a regular file of ours with one name is used: the host truncates it and writes its
    pid into it. Anything else there is refused (never followed, never blocked on), as a
    foreign file at the socket path is; no host of ours made it, so the user removes it.

    Args:
        dir_fd: the open ``run`` directory.
        path: the lock file's path (its name is opened in ``dir_fd``; the path is for messages).

    Returns:
        The open lock file's descriptor (the caller closes it).

    Raises:
        HostileFileError: a symlink, a directory, a FIFO or other special file, another uid's
            file, or a file with more than one name sits there.
        StoreError: it could not be opened for another reason (disk full, read-only...): the
            text names ``path`` in full and what to do (the OS error names only the file's name,
            opened relative to ``dir_fd``).
    """
    try:
        fd = os.open(path.name, _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in _LOCK_OPEN_REFUSALS or not os.path.lexists(path):
            # nothing there (EACCES: the directory refused the create): not a file to remove
            raise store_error("open", path, exc) from exc
        why: str | None = _LOCK_OPEN_REFUSALS[exc.errno]
    else:
        why = _lock_file_refusal(os.fstat(fd), os.getuid())
        if why is None:
            return fd
        os.close(fd)
    raise HostileFileError(f"refusing to use {path}: it is {why}, not a lock file of ours; remove it by hand, "
                           "then start again")


def take_host_lock(dir_fd: int, path: Path, root: Path) -> int:
    """Open the host lock ``path`` (:func:`open_lock_file`), take it and write our pid into it.

    The lock is held as long as the returned descriptor is open: closing it drops the flock,
    and this process no longer hosts ``root``.

    Args:
        dir_fd: the open, checked ``run`` directory.
        path: the lock file's path (``run/submit.lock``).
        root: the Hermes root (for the message).

    Returns:
        The open, locked descriptor (the caller closes it).

    Raises:
        RuntimeError: another process holds the lock (:func:`already_hosted` names it).
        HostileFileError: as for :func:`open_lock_file`.
        StoreError: it could not be opened, locked or written (disk full, read-only...): the
            text names ``path`` in full and what to do (an error on a descriptor names no file).
    """
    fd = open_lock_file(dir_fd, path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise already_hosted(root, holder) from None
        except OSError as exc:
            raise store_error("lock", path, exc) from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            raise store_error("write", path, exc) from exc
    except BaseException:
        os.close(fd)
        raise
    return fd
