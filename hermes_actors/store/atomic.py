"""Safe file writes: atomic private JSON (and other text) replaces and first-writer-wins creates.

Everything the store writes goes through :func:`atomic_write_json` or
:func:`create_exclusive_json`: the bytes land in a private (0600) temp file in
a dedicated temp directory on the same filesystem, and only a rename (or a
hard link, for first-writer-wins) makes them visible. Readers therefore never
see a partial file, and a watcher globbing ``*.json`` never sees a temp file.
:func:`atomic_write_bytes` is the same replace for other text (the YAML files
``enable`` edits), with the mode the caller gives.

The temp file (:mod:`hermes_actors.store.temp_file`) has a fresh random name and is
created with ``O_EXCL|O_NOFOLLOW``: whatever another program left in the temp directory
(a FIFO, a hard link to a file elsewhere) is never opened, let alone written through.

The hostile-aware read, :func:`read_json_file`, is in :mod:`hermes_actors.store.safe_read`
(re-exported here); private directories (:func:`ensure_private_dir`) are in
:mod:`hermes_actors.store.private_dir`; the error a failed write raises is built by
:mod:`hermes_actors.store.os_errors`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from hermes_actors.store.os_errors import store_error
from hermes_actors.store.relay_dirfd import open_relay_dir
from hermes_actors.store.safe_read import DEFAULT_MAX_BYTES, read_json_file
from hermes_actors.store.temp_file import FILE_MODE, discard, staged

__all__ = [
    "DEFAULT_MAX_BYTES",
    "atomic_write_bytes",
    "atomic_write_json",
    "create_exclusive_json",
    "read_json_file",
]


# ── pure helpers ────────────────────────────────────────────────────────────


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
        raise store_error(verb, target, exc) from exc


# ── writes ──────────────────────────────────────────────────────────────────


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


def atomic_write_json(
    target: Path,
    payload: Any,
    *,
    tmp_dir: Path,
    sort_keys: bool = False,
    fsync: bool = False,
    within: Path | None = None,
    temp_name: str | None = None,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Atomically replace ``target`` with ``payload`` as JSON, mode 0600.

    Args:
        target: the file to (re)place.
        payload: an orjson-serializable value.
        tmp_dir: a directory on the same filesystem as ``target`` for the temp.
        sort_keys: sort object keys in the output.
        fsync: fsync the data before the rename.
        within: a directory holding ``target`` (e.g. ``bot_relay/``): it and every directory below
            it on the way to ``target`` must be ours and no symlink at the moment of the write; so must
            those on the way to ``tmp_dir`` when it is below ``within`` too (a live mailbox's ``.tmp/``).
        temp_name: as for :func:`atomic_write_bytes`.
        before_rename: as for :func:`atomic_write_bytes`.

    Raises:
        HostileFileError: ``target``'s directory or ``tmp_dir`` is a symlink
            (``tmp_dir`` also: not a directory, or another uid's); with ``within``,
            any directory from it to ``target``.
        StoreError: serialization or any OS step failed (disk full, permission
            denied, ...); the temp file is gone and ``target`` is untouched.
    """
    data = _json_bytes(target, payload, verb="write", sort_keys=sort_keys)
    atomic_write_bytes(target, data, tmp_dir=tmp_dir, fsync=fsync, within=within, temp_name=temp_name,
                       before_rename=before_rename)


def atomic_write_bytes(
    target: Path,
    data: bytes,
    *,
    tmp_dir: Path,
    mode: int = FILE_MODE,
    fsync: bool = False,
    within: Path | None = None,
    temp_name: str | None = None,
    before_rename: Callable[[], None] | None = None,
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
        temp_name: the temp's name in ``tmp_dir`` (None: a fresh random hidden one), for a writer that must
            recognise its temp after a crash; it must not match ``*.json``. Such a temp is held under its
            ``flock`` until it is put in place or discarded (:func:`~hermes_actors.store.temp_file.staged`),
            so whoever finds it leaves it to this living writer.
        before_rename: called once the complete temp is written, before the rename puts it in place (a
            record that must exist whenever ``target`` does); what it raises discards the temp and is raised.

    Raises:
        HostileFileError: as for :func:`atomic_write_json`.
        StoreError: any OS step failed (disk full, permission denied, ...); the temp
            file is gone and ``target`` is untouched.
    """
    with staged(target, data, tmp_dir=tmp_dir, verb="write", fsync=fsync, mode=mode, within=within,
                name=temp_name) as (tmp, dir_fd):
        if before_rename is not None:
            try:
                before_rename()
            except BaseException:
                discard(tmp, dir_fd, tmp_dir)
                raise
        try:
            with _target_dir(target, within) as target_fd:
                os.replace(tmp, target if target_fd is None else target.name, src_dir_fd=dir_fd, dst_dir_fd=target_fd)
        except OSError as exc:
            discard(tmp, dir_fd, tmp_dir)
            raise store_error("write", target, exc) from exc
        except BaseException:
            discard(tmp, dir_fd, tmp_dir)
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
    with staged(target, data, tmp_dir=tmp_dir, verb="create", fsync=fsync, within=within) as (tmp, dir_fd):
        try:
            with _target_dir(target, within) as target_fd:
                os.link(tmp, target if target_fd is None else target.name, src_dir_fd=dir_fd, dst_dir_fd=target_fd,
                        follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as exc:
            raise store_error("create", target, exc) from exc
        finally:
            discard(tmp, dir_fd, tmp_dir)
    return True
