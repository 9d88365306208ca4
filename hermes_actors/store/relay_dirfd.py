"""Moving relay files between relay directories without following a swapped directory.

A path like ``bot_relay/inbox/<id>.json`` follows every symlink on the way, so an
``inbox`` swapped for a symlink at runtime would let ``rename`` move a file in from
anywhere. Here both directories are opened relative to the ``bot_relay`` directory
with ``O_DIRECTORY | O_NOFOLLOW``, checked to be ours, and the rename is done on
those descriptors: a directory that is a symlink (now, not at start) is refused.
:func:`open_dir_below` is the same walk from a trusted anchor (the root, a profile
home), optionally making each missing directory relative to the checked one above
it: what ``ensure_private_dir(path, within=...)`` stands on. :func:`remove_below` is the one way an
entry under a root is removed: relative to its directory opened by that walk, never by path.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hermes_actors.errors import HostileFileError

__all__ = [
    "lexists_below", "link_below", "lstat_below", "open_dir_below", "open_relay_dir", "refusal_below", "relay_dir",
    "remove_below", "rename_between", "swapped_below",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_checked(path: Path | str, *, dir_fd: int | None = None, shown: Path) -> int:
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HostileFileError(f"{shown} is a symlink or not a directory; refusing to use it") from exc
        raise
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise HostileFileError(f"{shown} is owned by uid {info.st_uid}, expected {os.getuid()}")
    return fd


def _relative_parts(base: Path, directory: Path | str) -> list[str]:
    """The components of ``directory`` below ``base``, [] for ``base`` itself (string work: this runs per relay write).

    Raises:
        ValueError: ``directory`` is not ``base`` nor inside it.
    """
    top, below = os.fspath(base), os.fspath(directory)
    if below == top:
        return []
    if not below.startswith(top + os.sep):
        raise ValueError(f"{directory} is not inside {base}")
    parts = below[len(top) + 1:].split(os.sep)
    if any(part in ("", ".", "..") for part in parts):  # ".." would climb out of base through the descriptors
        raise ValueError(f"{directory} is not a plain path inside {base}")
    return parts


def _open_child(parent_fd: int, part: str, *, create: bool) -> int:
    """Open the directory ``part`` of ``parent_fd`` without following a symlink; with ``create``, make it first (0700).

    Args:
        parent_fd: an open, already checked directory.
        part: one path component.
        create: create ``part`` when it is missing.

    Returns:
        Its descriptor (checked by the caller).

    Raises:
        OSError: ELOOP / ENOTDIR for a symlink or a non-directory; FileNotFoundError without ``create``.
    """
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        # Made relative to the checked parent, never through a path that a swapped component could redirect.
        os.mkdir(part, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        return os.open(part, _DIR_FLAGS, dir_fd=parent_fd)  # a concurrent creator won: checked like any other
    fd = os.open(part, _DIR_FLAGS, dir_fd=parent_fd)
    os.fchmod(fd, 0o700)  # the umask may have narrowed it; only the directories made here are touched
    return fd


def _descend(base_fd: int, parts: list[str], base: Path, *, create: bool = False) -> int:
    """Open ``parts`` one by one below the open ``base_fd`` (left open), each checked; the last one's descriptor.

    With ``create``, a missing step is made (0700) relative to the step above it.
    """
    fd = base_fd
    try:
        for depth, part in enumerate(parts, 1):
            try:
                child = _open_child(fd, part, create=create)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise HostileFileError(f"{base.joinpath(*parts[:depth])} is a symlink or not a directory; "
                                           "refusing to use it") from exc
                raise
            # The walk owns the child before the parent is closed: an interrupt after the close (a signal
            # handler's KeyboardInterrupt) must not close the parent's number again below, by then maybe
            # another thread's file.
            parent, fd = fd, child
            if parent != base_fd:
                os.close(parent)
            uid = os.fstat(fd).st_uid
            if uid != os.getuid():
                raise HostileFileError(f"{base.joinpath(*parts[:depth])} is owned by uid {uid}, expected {os.getuid()}")
    except BaseException:
        if fd != base_fd:
            os.close(fd)
        raise
    return os.dup(fd) if fd == base_fd else fd


def open_dir_below(anchor: Path, directory: Path | str, *, create: bool = False) -> int:
    """Open ``directory`` (``anchor`` or inside it), every step below the trusted ``anchor`` checked.

    ``anchor`` is opened as named (it may be reached through a symlink the user chose, like a
    root under a symlinked home); each component below it must be a real directory of ours,
    now: one swapped for a symlink or a file is refused, never followed.

    Args:
        anchor: a trusted directory (a Hermes root, a profile home); it must exist.
        directory: ``anchor`` or a directory inside it.
        create: make the missing components (0700), each relative to the checked one above it.

    Returns:
        A directory descriptor (the caller closes it).

    Raises:
        HostileFileError: a component below ``anchor`` is a symlink, not a directory, or not ours.
        FileNotFoundError: ``anchor`` (or, without ``create``, a step) does not exist.
        OSError: a step could not be opened or created (permission, disk full).
        ValueError: ``directory`` is not inside ``anchor``.
    """
    parts = _relative_parts(anchor, directory)
    anchor_fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _descend(anchor_fd, parts, anchor, create=create)
    finally:
        os.close(anchor_fd)


def remove_below(anchor: Path, path: Path, *, directory: bool = False) -> bool:
    """Remove the entry ``path`` relative to its directory, opened by the checked walk from ``anchor``.

    The rule every removal under a root goes by: ``path``'s directory, and each one between it
    and ``anchor``, must be a real directory of ours where it should be, now (:func:`open_dir_below`).
    One swapped for a symlink, a file or another user's directory is refused before anything is
    removed, so nothing outside the root is ever removed through it. The entry itself is never
    followed: a symlink there is removed, not what it points to.

    Args:
        anchor: the trusted directory (the Hermes root; ``path.parent`` itself when the caller has none).
        path: the entry to remove (its directory is ``anchor`` or inside it).
        directory: remove an empty directory (``rmdir``) instead of a file.

    Returns:
        True when this call removed it; False when it, or a directory on its way, was not there.

    Raises:
        HostileFileError: a directory below ``anchor`` on the way is a symlink, not a directory, or
            not ours: nothing was removed.
        OSError: the removal failed otherwise (a directory where a file was meant: EISDIR or EPERM;
            a directory not empty; EACCES).
        ValueError: ``path`` is not inside ``anchor``.
    """
    try:
        fd = open_dir_below(anchor, path.parent)
    except FileNotFoundError:
        return False
    try:
        if directory:
            os.rmdir(path.name, dir_fd=fd)
        else:
            os.unlink(path.name, dir_fd=fd)
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)
    return True


def lstat_below(anchor: Path, path: Path) -> os.stat_result:
    """The ``lstat`` of the entry ``path`` (never followed), looked at from its directory opened by the walk from
    ``anchor`` (:func:`open_dir_below`).

    Args:
        anchor: the trusted directory (a Hermes root).
        path: the entry (its directory is ``anchor`` or inside it).

    Returns:
        What the entry is now.

    Raises:
        HostileFileError: a directory below ``anchor`` on the way is a symlink, not a directory, or not ours.
        FileNotFoundError: the entry, or a directory on its way, is not there.
        OSError: a directory on the way could not be opened for another reason.
        ValueError: ``path`` is not inside ``anchor``.
    """
    fd = open_dir_below(anchor, path.parent)
    try:
        return os.stat(path.name, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def link_below(anchor: Path, source: Path, target: Path) -> None:
    """Hard-link the entry ``source`` (never followed) at ``target``, never over an entry there.

    Both directories are opened by the walk from ``anchor`` (:func:`open_dir_below`) and the link is made
    relative to them: a directory swapped for a symlink on either side is refused, so no file outside the root
    is linked in, and no link is made outside it.

    Args:
        anchor: the trusted directory (a Hermes root).
        source: the entry to link (its directory is ``anchor`` or inside it).
        target: the new name (its directory is ``anchor`` or inside it).

    Raises:
        HostileFileError: a directory below ``anchor`` on the way is a symlink, not a directory, or not ours.
        FileExistsError: ``target`` is taken.
        OSError: the link failed otherwise (``source`` gone: FileNotFoundError).
        ValueError: ``source`` or ``target`` is not inside ``anchor``.
    """
    src = open_dir_below(anchor, source.parent)
    try:
        dst = open_dir_below(anchor, target.parent)
        try:
            os.link(source.name, target.name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def refusal_below(anchor: Path, directory: Path) -> HostileFileError | None:
    """Why ``directory`` (``anchor`` or inside it) must not be read: :func:`open_dir_below`'s refusal, or None.

    For a reader that goes by path (a listing, a glob): a ``bot_relay/`` swapped for a symlink would lead
    it to another root's files, so it reads nothing below a directory refused here.

    Args:
        anchor: a trusted directory (a Hermes root).
        directory: ``anchor`` or a directory inside it.

    Returns:
        The refusal (a step below ``anchor`` is a symlink, not a directory, or another uid's; its text names it),
        or None: the walk took it, or it is missing or cannot be opened for another reason (the read says why).

    Raises:
        ValueError: ``directory`` is not inside ``anchor``.
    """
    try:
        os.close(open_dir_below(anchor, directory))
    except HostileFileError as exc:
        return exc
    except OSError:
        return None
    return None


def swapped_below(anchor: Path, directory: Path) -> bool:
    """Whether the entry ``directory`` (below ``anchor``) is there but is no real directory (a symlink, a file).

    Looked at from its parent, opened by the walk from ``anchor`` (:func:`open_dir_below`): the
    entry itself is never followed, nor anything above it.

    Args:
        anchor: a trusted directory (a profile home).
        directory: an entry strictly inside ``anchor``.

    Returns:
        True when the entry is a symlink or anything but a directory; False when it is a directory or missing.

    Raises:
        HostileFileError: a directory above it is a symlink, not a directory, or not ours.
        OSError: a directory above it is missing or cannot be opened.
        ValueError: ``directory`` is not inside ``anchor``.
    """
    parent = open_dir_below(anchor, directory.parent)
    try:
        return not stat.S_ISDIR(os.lstat(directory.name, dir_fd=parent).st_mode)
    except FileNotFoundError:
        return False
    finally:
        os.close(parent)


def open_relay_dir(base: Path, directory: Path | str) -> int:
    """Open ``directory`` (``base`` or inside it) without following a symlink at any step from ``base`` down.

    Args:
        base: the ``bot_relay`` directory (itself refused when it is a symlink).
        directory: ``base`` or a directory inside it (``base / "inbox"``, ``base / "taken" / "s-…"``).

    Returns:
        A directory descriptor (the caller closes it).

    Raises:
        HostileFileError: a step is a symlink, not a directory, or not ours.
        FileNotFoundError: a step does not exist.
        ValueError: ``directory`` is not inside ``base``.
    """
    parts = _relative_parts(base, directory)
    base_fd = _open_checked(base, shown=base)
    try:
        return _descend(base_fd, parts, base)
    finally:
        os.close(base_fd)


@contextmanager
def relay_dir(base: Path, directory: Path | str) -> Iterator[int]:
    """:func:`open_relay_dir` for a ``with`` block: the descriptor is closed on exit.

    Read, list and remove relative to it (``dir_fd=``): a directory swapped for a symlink
    is refused when it is opened, and nothing after that can be redirected through it.

    Raises:
        As :func:`open_relay_dir`.
    """
    fd = open_relay_dir(base, directory)
    try:
        yield fd
    finally:
        os.close(fd)


def lexists_below(base: Path, path: Path) -> bool:
    """Whether an entry ``path`` exists (a symlink counts, never followed), its directory inside ``base``.

    Args:
        base: the ``bot_relay`` directory.
        path: the entry.

    Returns:
        True when it exists; False when it or its directory does not.

    Raises:
        HostileFileError: a directory on the way is a symlink or not ours (nothing below it is looked at).
        OSError: a directory on the way could not be opened for another reason.
    """
    try:
        with relay_dir(base, path.parent) as fd:
            os.lstat(path.name, dir_fd=fd)
    except FileNotFoundError:
        return False
    return True


def rename_between(base: Path, source_dir: Path, target_dir: Path, name: str, *, new_name: str | None = None) -> bool:
    """Rename ``source_dir/name`` to ``target_dir/name``, both directories inside ``base``.

    Args:
        base: the ``bot_relay`` directory.
        source_dir: where the file is (inside ``base``).
        target_dir: where it goes (inside ``base``).
        name: the file name (one component).
        new_name: its name in ``target_dir`` (default: ``name``).

    Returns:
        True when this call moved the file; False when the source was gone
        (another claimer won the rename).

    Raises:
        HostileFileError: a directory on the way is a symlink or not ours.
        OSError: the rename failed for another reason.
    """
    base_fd = _open_checked(base, shown=base)
    try:
        src = _descend(base_fd, _relative_parts(base, source_dir), base)
        try:
            dst = _descend(base_fd, _relative_parts(base, target_dir), base)
            try:
                os.rename(name, new_name or name, src_dir_fd=src, dst_dir_fd=dst)
            except FileNotFoundError:
                return False
            finally:
                os.close(dst)
        finally:
            os.close(src)
    finally:
        os.close(base_fd)
    return True
