"""The temp file a store write stages its bytes in, before a rename or a link puts it in place.

The temp is made in a dedicated temp directory on the target's filesystem, opened as a
directory of ours without following a symlink; it gets a fresh random hidden name (never
matching ``*.json``, so a watcher never sees it) and is created with ``O_EXCL|O_NOFOLLOW``:
whatever another program left in the temp directory (a FIFO, a hard link to a file
elsewhere) is never opened, let alone written through. :mod:`hermes_actors.store.atomic`
puts it in place. A temp a writer names itself (so that a restart finds it: the relay's envelope
being queued) is held under its ``flock`` from its creation until it is put in place or
discarded (:mod:`hermes_actors.store.owner_lock`): whoever finds it tells a living writer, whose
temp it must leave alone, from one that died.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loguru import logger

from hermes_actors.errors import HostileFileError
from hermes_actors.store.os_errors import os_error_text, store_error, what_to_do
from hermes_actors.store.owner_lock import hold, release
from hermes_actors.store.relay_dirfd import open_dir_below

__all__ = ["FILE_MODE", "check_temp_dir", "discard", "staged"]

FILE_MODE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _temp_name(target: Path) -> str:
    """The unique temp file name used while writing ``target``.

    Args:
        target: the final file.

    Returns:
        ``.<target.name>.<random>.tmp`` (hidden, never matching ``*.json``).
    """
    return f".{target.name}.{secrets.token_hex(8)}.tmp"


def _refuse_symlinked_parent(target: Path) -> None:
    """Refuse to write into a directory reached through a symlink.

    Args:
        target: the file about to be written.

    Raises:
        HostileFileError: ``target.parent`` is a symlink.
    """
    parent = os.path.dirname(os.fspath(target))  # not pathlib: this runs for every relay write
    try:
        st = os.lstat(parent)
    except FileNotFoundError:
        return  # the write itself will fail and report it
    if stat.S_ISLNK(st.st_mode):
        raise HostileFileError(f"refusing to write {target}: its directory {parent} is a symlink")


def _inside(path: Path, anchor: Path) -> bool:
    """Pure: whether ``path`` names a directory below ``anchor`` (string work, as the walk's own check)."""
    return os.fspath(path).startswith(os.fspath(anchor) + os.sep)


def _open_temp_dir(tmp_dir: Path, within: Path | None = None) -> int:
    """Open ``tmp_dir`` as a directory of ours, never through a symlink.

    The temp file is then created relative to this descriptor, so a temp
    directory swapped for a symlink (now, not only when it was ensured) is
    refused instead of followed. A ``tmp_dir`` below ``within`` is reached by the
    walk from ``within`` (:func:`~hermes_actors.store.relay_dirfd.open_dir_below`): a
    directory above it swapped for a symlink (a profile's ``runtime/``) is refused too,
    and no temp file is ever made outside ``within``.

    Args:
        tmp_dir: the temp directory.
        within: the trusted directory of the write (see ``atomic_write_json``); one
            ``tmp_dir`` is not inside (the relay's ``<root>/.bot_relay_tmp``) is opened by name.

    Returns:
        A directory descriptor (the caller closes it).

    Raises:
        HostileFileError: ``tmp_dir`` (or, below ``within``, a directory on the way) is a
            symlink, not a directory, or another uid's.
        OSError: it could not be opened (missing, permission).
    """
    if within is not None and _inside(tmp_dir, within):
        return open_dir_below(within, tmp_dir)
    try:
        fd = os.open(tmp_dir, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HostileFileError(f"temp directory {tmp_dir} is a symlink or not a directory; refusing it") from exc
        raise
    uid = os.fstat(fd).st_uid
    if uid != os.getuid():
        os.close(fd)
        raise HostileFileError(f"temp directory {tmp_dir} is owned by uid {uid}, expected {os.getuid()}")
    return fd


def check_temp_dir(tmp_dir: Path) -> None:
    """Refuse now what staging a temp file in ``tmp_dir`` would refuse, before anything is written (``enable``
    checks every directory it will write in before its first write).

    Args:
        tmp_dir: the directory a write will stage its temp in (the written file's own, for ``enable``).

    Raises:
        HostileFileError: it is a symlink, not a directory, or another uid's (:func:`_open_temp_dir`).
        PermissionError: you may not make a file in it (``filename`` names it).
        OSError: it cannot be opened (missing, permission).
    """
    os.close(_open_temp_dir(tmp_dir))
    if not os.access(tmp_dir, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(tmp_dir))


def _write_temp(target: Path, data: bytes, *, dir_fd: int, tmp_dir: Path, fsync: bool, mode: int = FILE_MODE,
                name: str | None = None) -> tuple[str, int | None]:
    """Write ``data`` to a fresh temp file for ``target``.

    Args:
        target: the file the temp will become (only its name is used).
        data: the bytes to write.
        dir_fd: the open temp directory (same filesystem as ``target``).
        tmp_dir: its path (for messages).
        fsync: flush the file to stable storage before returning.
        mode: the temp's permission bits (exactly these: the umask does not apply).
        name: the temp's name (None: a fresh random one); created with ``O_EXCL`` all the same, and held under
            its ``flock`` from its creation (:func:`~hermes_actors.store.owner_lock.hold`).

    Returns:
        The temp file's name in ``dir_fd``, and with ``name`` the open descriptor holding its lock (the
        caller releases it once the temp is put in place or discarded), else None.

    Raises:
        OSError: the temp could not be created, locked or written (it is removed).
    """
    held = name is not None
    name = name or _temp_name(target)
    fd = os.open(name, _WRITE_FLAGS, FILE_MODE, dir_fd=dir_fd)  # private until fchmod: nobody opens it meanwhile
    try:
        try:
            if held:  # before anything can name it to a restart (its writer's next record does)
                hold(fd)
            os.fchmod(fd, mode)  # exactly the mode asked for, whatever the umask
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            if not held:
                os.close(fd)
    except BaseException:
        discard(name, dir_fd, tmp_dir)
        if held:
            release(fd)
        raise
    return name, fd if held else None


def discard(name: str, dir_fd: int, tmp_dir: Path) -> None:
    """Remove the temp file ``name`` of ``dir_fd`` if it exists; never raises.

    Args:
        name: a temp file to clean up.
        dir_fd: its directory.
        tmp_dir: that directory's path, to name the file in the warning (the name alone is relative).
    """
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        advice = what_to_do(exc)
        logger.warning("could not remove temp file {}: {}{}; remove it by hand once the disk is fixed",
                       Path(tmp_dir).absolute() / name, os_error_text(exc), f" ({advice})" if advice else "")


@contextmanager
def staged(
    target: Path, data: bytes, *, tmp_dir: Path, verb: str, fsync: bool, mode: int = FILE_MODE,
    within: Path | None = None, name: str | None = None,
) -> Iterator[tuple[str, int]]:
    """``data`` written to a complete temp file for ``target``, ready to be put in place.

    Args:
        target: the file the temp will become.
        data: the bytes to write.
        tmp_dir: the temp directory (same filesystem as ``target``).
        verb: the operation, for error messages ("write", "create").
        fsync: fsync the data before yielding.
        mode: the temp's (and so the target's) permission bits.
        within: the trusted directory of the write: a ``tmp_dir`` below it is walked from it.
        name: the temp's name (None: a fresh random hidden one); a writer whose temp must be found again
            after a crash names it (the relay's queued envelope: ``relay_sent.queueing_name``). Such a
            temp is held under its ``flock`` from its creation until this context exits, after the caller
            put it in place or discarded it: a living writer's temp is never taken for a dead one's.

    Yields:
        The temp's name and the open temp directory's fd (closed on exit); the caller puts
        the temp in place or discards it.

    Raises:
        HostileFileError: ``target``'s directory or ``tmp_dir`` is refused.
        StoreError: opening ``tmp_dir`` or writing the temp failed.
    """
    _refuse_symlinked_parent(target)
    try:
        dir_fd = _open_temp_dir(tmp_dir, within)
    except OSError as exc:
        raise store_error(verb, target, exc) from exc
    lock: int | None = None
    try:
        try:
            tmp, lock = _write_temp(target, data, dir_fd=dir_fd, tmp_dir=tmp_dir, fsync=fsync, mode=mode, name=name)
        except OSError as exc:
            raise store_error(verb, target, exc) from exc
        yield tmp, dir_fd
    finally:
        if lock is not None:  # last: the temp is in place or gone
            release(lock)
        os.close(dir_fd)
