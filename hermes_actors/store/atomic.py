"""Safe file primitives: atomic private JSON writes and private directories.

Everything the store writes goes through :func:`atomic_write_json` or
:func:`create_exclusive_json`: the bytes land in a private (0600) temp file in
a dedicated temp directory on the same filesystem, and only a rename (or a
hard link, for first-writer-wins) makes them visible. Readers therefore never
see a partial file, and a watcher globbing ``*.json`` never sees a temp file.
:func:`atomic_write_bytes` is the same replace for other text (the YAML files
``enable`` edits), with the mode the caller gives.

The temp file has a fresh random name and is created with ``O_EXCL|O_NOFOLLOW``:
whatever another program left in the temp directory (a FIFO, a hard link to a
file elsewhere) is never opened, let alone written through.

The hostile-aware read, :func:`read_json_file`, is in :mod:`hermes_actors.store.safe_read`
(re-exported here).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.store.relay_dirfd import open_dir_below, open_relay_dir
from hermes_actors.store.safe_read import DEFAULT_MAX_BYTES, read_json_file

__all__ = [
    "DEFAULT_MAX_BYTES",
    "atomic_write_bytes",
    "atomic_write_json",
    "create_exclusive_json",
    "ensure_private_dir",
    "read_json_file",
]

_FILE_MODE = 0o600
_DIR_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC


# ── pure helpers ────────────────────────────────────────────────────────────


def _os_error_text(exc: OSError) -> str:
    """Render an OS error as ``"No space left on device (ENOSPC)"``.

    Args:
        exc: the error raised by the operating system.

    Returns:
        The human text with the symbolic errno when one is known.
    """
    code = exc.errno
    if code is None:
        return str(exc)
    name = errno.errorcode.get(code, str(code))
    return f"{exc.strerror or os.strerror(code)} ({name})"


def _store_error(action: str, target: Path, exc: BaseException) -> StoreError:
    """Build the :class:`StoreError` for a failed write of ``target``.

    Args:
        action: what was being done ("write", "create").
        target: the file that could not be written.
        exc: the underlying error.

    Returns:
        A StoreError whose text names the target and the OS error and whose
        ``errno`` mirrors the underlying one (None for non-OS failures).
    """
    detail = _os_error_text(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
    err = StoreError(f"cannot {action} {target}: {detail}")
    err.errno = exc.errno if isinstance(exc, OSError) else None
    return err


def _temp_name(target: Path) -> str:
    """The unique temp file name used while writing ``target``.

    Args:
        target: the final file.

    Returns:
        ``.<target.name>.<random>.tmp`` (hidden, never matching ``*.json``).
    """
    return f".{target.name}.{secrets.token_hex(8)}.tmp"


def _serialize(payload: Any, *, sort_keys: bool) -> bytes:
    """Serialize ``payload`` with orjson.

    Args:
        payload: any orjson-serializable value.
        sort_keys: sort object keys (stable, diffable output).

    Returns:
        The UTF-8 JSON bytes.

    Raises:
        TypeError: the payload is not serializable (orjson.JSONEncodeError).
    """
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS if sort_keys else 0)


def _json_bytes(target: Path, payload: Any, *, verb: str, sort_keys: bool) -> bytes:
    """``payload`` as the JSON bytes to write to ``target``.

    Args:
        target: the file being written (for the error message).
        payload: any orjson-serializable value.
        verb: the operation, for error messages ("write", "create").
        sort_keys: sort object keys in the output.

    Returns:
        The UTF-8 JSON bytes.

    Raises:
        StoreError: the payload is not serializable.
    """
    try:
        return _serialize(payload, sort_keys=sort_keys)
    except TypeError as exc:
        raise _store_error(verb, target, exc) from exc


# ── writes ──────────────────────────────────────────────────────────────────


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


def _open_temp_dir(tmp_dir: Path) -> int:
    """Open ``tmp_dir`` as a directory of ours, never through a symlink.

    The temp file is then created relative to this descriptor, so a temp
    directory swapped for a symlink (now, not only when it was ensured) is
    refused instead of followed.

    Args:
        tmp_dir: the temp directory.

    Returns:
        A directory descriptor (the caller closes it).

    Raises:
        HostileFileError: ``tmp_dir`` is a symlink, not a directory, or another uid's.
        OSError: it could not be opened (missing, permission).
    """
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


def _write_temp(target: Path, data: bytes, *, dir_fd: int, fsync: bool, mode: int = _FILE_MODE) -> str:
    """Write ``data`` to a fresh temp file for ``target``.

    Args:
        target: the file the temp will become (only its name is used).
        data: the bytes to write.
        dir_fd: the open temp directory (same filesystem as ``target``).
        fsync: flush the file to stable storage before returning.
        mode: the temp's permission bits (exactly these: the umask does not apply).

    Returns:
        The temp file's name in ``dir_fd``.

    Raises:
        OSError: the temp could not be created or written (it is removed).
    """
    name = _temp_name(target)
    fd = os.open(name, _WRITE_FLAGS, _FILE_MODE, dir_fd=dir_fd)  # private until fchmod: nobody opens it meanwhile
    try:
        try:
            os.fchmod(fd, mode)  # exactly the mode asked for, whatever the umask
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _discard(name, dir_fd)
        raise
    return name


def _discard(name: str, dir_fd: int) -> None:
    """Remove the temp file ``name`` of ``dir_fd`` if it exists; never raises.

    Args:
        name: a temp file to clean up.
        dir_fd: its directory.
    """
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove temp file {}: {}", name, _os_error_text(exc))


@contextmanager
def _target_dir(target: Path, within: Path | None) -> Iterator[int | None]:
    """The open directory of ``target`` when ``within`` is given (None otherwise; closed on exit).

    Every directory from ``within`` (included) down to ``target``'s is opened without following
    a symlink and checked to be ours, so a directory swapped for a symlink (``bot_relay/`` itself
    included) is refused now, not only when it was ensured.

    Raises:
        HostileFileError: a directory on the way is a symlink, not a directory, or not ours.
        ValueError: ``target`` is not inside ``within``.
        OSError: a directory on the way is missing or cannot be opened.
    """
    if within is None:
        yield None
        return
    fd = open_relay_dir(within, os.path.dirname(os.fspath(target)))  # not pathlib: this runs for every relay write
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _staged(
    target: Path, data: bytes, *, tmp_dir: Path, verb: str, fsync: bool, mode: int = _FILE_MODE
) -> Iterator[tuple[str, int]]:
    """``data`` written to a complete temp file for ``target``, ready to be put in place.

    Args:
        target: the file the temp will become.
        data: the bytes to write.
        tmp_dir: the temp directory (same filesystem as ``target``).
        verb: the operation, for error messages ("write", "create").
        fsync: fsync the data before yielding.
        mode: the temp's (and so the target's) permission bits.

    Yields:
        The temp's name and the open temp directory's fd (closed on exit); the caller puts
        the temp in place or discards it.

    Raises:
        HostileFileError: ``target``'s directory or ``tmp_dir`` is refused.
        StoreError: opening ``tmp_dir`` or writing the temp failed.
    """
    _refuse_symlinked_parent(target)
    try:
        dir_fd = _open_temp_dir(tmp_dir)
    except OSError as exc:
        raise _store_error(verb, target, exc) from exc
    try:
        try:
            tmp = _write_temp(target, data, dir_fd=dir_fd, fsync=fsync, mode=mode)
        except OSError as exc:
            raise _store_error(verb, target, exc) from exc
        yield tmp, dir_fd
    finally:
        os.close(dir_fd)


def atomic_write_json(
    target: Path,
    payload: Any,
    *,
    tmp_dir: Path,
    sort_keys: bool = False,
    fsync: bool = False,
    within: Path | None = None,
) -> None:
    """Atomically replace ``target`` with ``payload`` as JSON, mode 0600.

    Args:
        target: the file to (re)place.
        payload: an orjson-serializable value.
        tmp_dir: a directory on the same filesystem as ``target`` for the temp.
        sort_keys: sort object keys in the output.
        fsync: fsync the data before the rename.
        within: a directory holding ``target`` (e.g. ``bot_relay/``): it and every directory below
            it on the way to ``target`` must be ours and no symlink at the moment of the write.

    Raises:
        HostileFileError: ``target``'s directory or ``tmp_dir`` is a symlink
            (``tmp_dir`` also: not a directory, or another uid's); with ``within``,
            any directory from it to ``target``.
        StoreError: serialization or any OS step failed (disk full, permission
            denied, ...); the temp file is gone and ``target`` is untouched.
    """
    data = _json_bytes(target, payload, verb="write", sort_keys=sort_keys)
    atomic_write_bytes(target, data, tmp_dir=tmp_dir, fsync=fsync, within=within)


def atomic_write_bytes(
    target: Path,
    data: bytes,
    *,
    tmp_dir: Path,
    mode: int = _FILE_MODE,
    fsync: bool = False,
    within: Path | None = None,
) -> None:
    """Atomically replace ``target`` with ``data``; the new file gets exactly ``mode``.

    Args:
        target: the file to (re)place.
        data: its new content.
        tmp_dir: a directory on the same filesystem as ``target`` for the temp
            (``target``'s own directory will do: the temp's name is hidden and random).
        mode: the new file's permission bits (default 0600; the umask does not apply).
        fsync: fsync the data before the rename.
        within: as for :func:`atomic_write_json`.

    Raises:
        HostileFileError: as for :func:`atomic_write_json`.
        StoreError: any OS step failed (disk full, permission denied, ...); the temp
            file is gone and ``target`` is untouched.
    """
    with _staged(target, data, tmp_dir=tmp_dir, verb="write", fsync=fsync, mode=mode) as (tmp, dir_fd):
        try:
            with _target_dir(target, within) as target_fd:
                os.replace(tmp, target if target_fd is None else target.name, src_dir_fd=dir_fd, dst_dir_fd=target_fd)
        except OSError as exc:
            _discard(tmp, dir_fd)
            raise _store_error("write", target, exc) from exc
        except BaseException:
            _discard(tmp, dir_fd)
            raise


def create_exclusive_json(
    target: Path,
    payload: Any,
    *,
    tmp_dir: Path,
    sort_keys: bool = False,
    fsync: bool = False,
    within: Path | None = None,
) -> bool:
    """Create ``target`` with ``payload`` only if it does not exist yet.

    First writer wins: the complete temp file is hard-linked to ``target``,
    which fails when any entry (even a dangling symlink) already has the name.

    Args:
        target: the file to create.
        payload: an orjson-serializable value.
        tmp_dir: a directory on the same filesystem as ``target`` for the temp.
        sort_keys: sort object keys in the output.
        fsync: fsync the data before linking.
        within: as for :func:`atomic_write_json`.

    Returns:
        True when this call created ``target``; False when it already existed.

    Raises:
        HostileFileError: ``target``'s directory or ``tmp_dir`` is a symlink
            (``tmp_dir`` also: not a directory, or another uid's); with ``within``,
            any directory from it to ``target``.
        StoreError: serialization or any OS step failed; no temp is left.
    """
    data = _json_bytes(target, payload, verb="create", sort_keys=sort_keys)
    with _staged(target, data, tmp_dir=tmp_dir, verb="create", fsync=fsync) as (tmp, dir_fd):
        try:
            with _target_dir(target, within) as target_fd:
                os.link(tmp, target if target_fd is None else target.name, src_dir_fd=dir_fd, dst_dir_fd=target_fd,
                        follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as exc:
            raise _store_error("create", target, exc) from exc
        finally:
            _discard(tmp, dir_fd)
    return True


# ── directories ─────────────────────────────────────────────────────────────


def _check_private_dir(path: Path, st: os.stat_result) -> None:
    """Refuse an existing directory entry that is not ours to use.

    Args:
        path: the directory path (for messages).
        st: its ``lstat`` result.

    Raises:
        HostileFileError: a symlink, not a directory, or another owner's.
    """
    if stat.S_ISLNK(st.st_mode):
        raise HostileFileError(f"{path} is a symlink, expected a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise HostileFileError(f"{path} is not a directory")
    uid = os.getuid()
    if st.st_uid != uid:
        raise HostileFileError(f"{path} is owned by uid {st.st_uid}, expected {uid}")


def ensure_private_dir(path: Path, *, within: Path | None = None) -> Path:
    """Make sure ``path`` is a directory of ours; create it (and parents) 0700.

    Only the directories this call creates get mode 0700; existing ancestors
    are left alone (they may legitimately be shared or symlinked, like /tmp).

    Args:
        path: the directory to ensure.
        within: the trusted directory ``path`` must stay under (the Hermes root, a
            profile home). Every component from it down to ``path`` is then opened
            without following a symlink and checked to be a directory of ours, and a
            missing one is made relative to the checked one above it: an ancestor
            swapped for a symlink at runtime (``bot_relay/`` itself) is refused and
            nothing is created through it. Give it for every directory under a root;
            without it only ``path`` itself is checked.

    Returns:
        ``path``.

    Raises:
        HostileFileError: ``path`` (with ``within``: any component below ``within``)
            is a symlink, not a directory, or owned by another uid; the text names it.
        StoreError: it could not be created (permission, disk full).
        ValueError: ``path`` is not inside ``within``.
    """
    if within is not None:
        if not os.path.isdir(within):  # followed: the anchor is trusted as named; a missing one is made as before
            ensure_private_dir(within)
        try:
            os.close(open_dir_below(within, path, create=True))
        except OSError as exc:
            raise _store_error("create directory", path, exc) from exc
        return path
    try:
        _check_private_dir(path, os.lstat(path))
        return path
    except FileNotFoundError:
        pass
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, _DIR_MODE)
            os.chmod(directory, _DIR_MODE)  # umask may have narrowed it
        except FileExistsError:
            continue  # a concurrent creator won; checked below
        except OSError as exc:
            raise _store_error("create directory", directory, exc) from exc
    _check_private_dir(path, os.lstat(path))
    return path
