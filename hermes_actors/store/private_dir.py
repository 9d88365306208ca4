"""Private directories: make sure a directory is ours (0700, no symlink, our uid), creating what is missing.

Every directory the store writes into is ensured by :func:`ensure_private_dir` first;
given the trusted directory above it (``within``: the Hermes root, a profile home),
each component on the way is opened without following a symlink, so an ancestor
swapped for a symlink at runtime is refused and nothing is created through it.
An existing directory keeps its mode there (that runs at every write); :func:`loose_private_dir`
finds one of ours that its group or other users may write, and sets it back to 0700.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hermes_actors.errors import HostileFileError
from hermes_actors.store.os_errors import store_error
from hermes_actors.store.relay_dirfd import open_dir_below
from hermes_actors.store.safe_read import writable_by_others

__all__ = ["ensure_private_dir", "loose_private_dir"]

_DIR_MODE = 0o700


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
            raise store_error("create directory", path, exc) from exc
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
            raise store_error("create directory", directory, exc) from exc
    _check_private_dir(path, os.lstat(path))
    return path


def loose_private_dir(directory: Path, *, within: Path, restore: bool) -> int | None:
    """The mode of ``directory``, one of ours below ``within``, when its group or other users may write in it.

    Such a directory lets another user plant, replace or remove the files in it; the files themselves
    are refused when they are not ours, but an envelope replaced is lost all the same. A seed (or a
    user) that made it under a loose umask is not refused: with ``restore`` it is set back to 0700
    (through the descriptor the checked walk opened, so a symlink swapped in is never followed).

    Args:
        directory: the directory (``within`` or inside it).
        within: the trusted directory the walk starts from (the Hermes root).
        restore: set it back to 0700 when it is loose.

    Returns:
        Its mode as found when group or others may write it (set back to 0700 by now, with ``restore``);
        None when they may not, and when it is missing, a symlink, not a directory or another user's
        (every use of it refuses those: nothing here to restore).

    Raises:
        OSError: with ``restore``, the ``chmod`` failed.
    """
    try:
        fd = open_dir_below(within, directory)
    except (OSError, ValueError):  # HostileFileError included (a ValidationError, so a ValueError)
        return None
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if not writable_by_others(mode):
            return None
        if restore:
            os.fchmod(fd, _DIR_MODE)
        return mode
    finally:
        os.close(fd)
