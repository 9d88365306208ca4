"""Refused relay files are moved aside, never followed or deleted: ``bot_relay/quarantine/``.

A hostile file (a symlink, a socket, another uid's, corrupt, huge, a wrong name)
is renamed into the quarantine directory with a name saying when, and the
caller goes on: the relay's actors keep running whatever they find.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path

from loguru import logger

from hermes_actors.core.shell import shell_command
from hermes_actors.errors import HostileFileError
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import open_dir_below
from hermes_actors.store.relay_paths import RelayPaths

__all__ = ["quarantine", "quarantine_directory", "quarantine_into", "quarantine_name", "regular_or_quarantined"]


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


def quarantine_into(directory: Path, path: Path, why: str, *, within: Path | None = None,
                    identity: tuple[int, int, int] | None = None) -> Path | None:
    """Move a refused file aside into ``directory`` (created 0700 if missing; a symlink moves as is).

    The rename is by name: with ``identity`` (the entry as it was judged), the entry moved is looked at in its new
    place, and one that is not the entry judged (put at ``path`` since: a race review's real journal file, put
    back in place of the FIFO the start was moving aside, ended in quarantine and its DM never ran) is put back
    where it was, never over what is there now, and None is returned: the caller judges afresh what is at ``path``.

    Args:
        directory: the quarantine directory (``bot_relay/quarantine``).
        path: the refused file.
        why: the reason, logged with the move.
        within: the root ``directory`` must stay under (see :func:`ensure_private_dir`).
        identity: the device, inode and file type (``S_IFMT``) of the entry judged (None: whatever is at ``path``
            is moved).

    Returns:
        The new path, or None when the file was already gone, could not be moved (logged), or was not the
        entry judged (put back).
    """
    dest = directory / quarantine_name(path.name, time.time_ns(), secrets.token_hex(4))
    try:
        ensure_private_dir(directory, within=within)
        if not _rename_below(within, path, dest, identity):
            return None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, HostileFileError) as exc:
        logger.warning("could not quarantine {} ({}): {}", path, why, exc)
        return None
    logger.warning("quarantined {} -> {}: {}", path, dest, why)
    return dest


def quarantine_directory(directory: Path, quarantine_dir: Path, why: str, *, within: Path) -> Path | None:
    """Move ``directory``, an entry swapped for a symlink or a file, into ``quarantine_dir`` (as is, never followed).

    The rule a swapped directory is put back by (the relay's rescan, a live-owner mailbox): the
    caller then makes a real directory in its place. A ``quarantine_dir`` that is ``directory``
    itself or lies below it (the relay's ``quarantine/``, a live mailbox whose ``.quarantine/``
    is inside it) cannot take the entry where it is: the entry is renamed aside in its own
    parent first (:func:`quarantine_name`), a real ``quarantine_dir`` is made (0700, by the walk
    from ``within``), and it moves in from there.

    Args:
        directory: the swapped entry (inside ``within``).
        quarantine_dir: where it goes.
        why: the reason, logged with the move.
        within: the trusted root every step is walked from.

    Returns:
        The new path, or None when the entry was gone or could not be moved (logged).
    """
    if directory != quarantine_dir and directory not in quarantine_dir.parents:
        return quarantine_into(quarantine_dir, directory, why, within=within)
    aside = directory.with_name(quarantine_name(directory.name, time.time_ns(), secrets.token_hex(4)))
    try:
        _rename_below(within, directory, aside)
        ensure_private_dir(quarantine_dir, within=within)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # StoreError, HostileFileError included
        logger.warning("could not quarantine {} ({}): {}", directory, why, exc)
        return None
    return quarantine_into(quarantine_dir, aside, why, within=within)


def _rename_below(within: Path | None, path: Path, dest: Path, identity: tuple[int, int, int] | None = None) -> bool:
    """Rename ``path`` to ``dest`` (never following ``path`` itself, a symlink moves as is).

    With ``within``, both directories are opened from it without following a symlink at any step, so a
    directory swapped for a symlink (``delivered/`` pointing outside the root) is refused: nothing outside
    ``within`` is ever moved in. With ``identity``, an entry moved that is not that one is put back
    (:func:`_put_back_unless`).

    Returns:
        Whether the entry is at ``dest`` (False: it was not the entry meant, and was put back).

    Raises:
        HostileFileError: with ``within``, a directory on the way is a symlink or not ours.
        ValueError: with ``within``, ``path`` or ``dest`` is not inside it.
        OSError: the rename failed (FileNotFoundError: ``path`` is gone).
    """
    if within is None and identity is None:
        os.rename(path, dest)
        return True
    src = _open_parent(within, path)
    try:
        dst = _open_parent(within, dest)
        try:
            os.rename(path.name, dest.name, src_dir_fd=src, dst_dir_fd=dst)
            return identity is None or _put_back_unless(identity, (src, path), (dst, dest))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _open_parent(within: Path | None, path: Path) -> int:
    """``path``'s directory, opened from ``within`` without following a symlink (as it is, without)."""
    if within is not None:
        return open_dir_below(within, path.parent)
    return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _put_back_unless(identity: tuple[int, int, int], was: tuple[int, Path], moved: tuple[int, Path]) -> bool:
    """Whether the entry just renamed to ``moved`` is the one of ``identity``; if not, put it back at ``was``.

    It is put back never over what is at ``was`` now: a hard link (refused when the name is taken) then the
    quarantined name removed; a directory by a rename (refused onto a file or a directory with entries). If that
    fails, it stays in quarantine, said at WARNING with the command that puts it back.

    Args:
        identity: the device, inode and file type of the entry meant.
        was: its directory's descriptor and its path before the rename.
        moved: the quarantine's descriptor and its path there.

    Returns:
        True when it is the entry meant; False when it was not (put back, or left where it is, said).
    """
    (src, path), (dst, dest) = was, moved
    info = os.stat(dest.name, dir_fd=dst, follow_symlinks=False)
    if (info.st_dev, info.st_ino, stat.S_IFMT(info.st_mode)) == identity:
        return True
    try:
        if stat.S_ISDIR(info.st_mode):
            os.rename(dest.name, path.name, src_dir_fd=dst, dst_dir_fd=src)
        else:
            os.link(dest.name, path.name, src_dir_fd=dst, dst_dir_fd=src, follow_symlinks=False)
            os.unlink(dest.name, dir_fd=dst)
    except OSError as exc:
        logger.warning("{} was moved to {} though it is not the entry meant to be quarantined (put there since it was "
                       "looked at), and it could not be put back ({}): put it back by hand ({})", path, dest, exc,
                       shell_command("mv", "-n", dest, path))
        return False
    logger.info("{} was not quarantined: it is not the entry meant (put there since it was looked at); put back", path)
    return False


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
