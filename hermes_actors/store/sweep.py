"""Housekeeping: remove old regular files from one directory, never following a symlink.

The directory itself is opened without following a symlink (with ``within``, no step from there
down either), and every file is looked at and removed relative to that descriptor: a directory
swapped for a symlink sweeps nothing, and nothing outside it is ever removed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from hermes_actors.errors import HostileFileError
from hermes_actors.store.relay_dirfd import open_relay_dir

__all__ = ["sweep_old_files"]


def sweep_old_files(
    directory: Path, cutoff: float, *, patterns: tuple[str, ...] | None = None, uid: int | None = None,
    within: Path | None = None, keep: Callable[[str], bool] | None = None,
) -> int:
    """Remove the regular files in ``directory`` modified before ``cutoff``; how many were removed.

    Symlinks, directories and anything else are left alone (never followed). Never raises: a
    directory that cannot be listed sweeps nothing, a file that cannot be removed is skipped
    (the next sweep tries again).

    Args:
        directory: the directory to sweep (missing: nothing).
        cutoff: the mtime limit (``time.time()`` scale).
        patterns: only names matching one of these ``fnmatch`` patterns (None: every name).
        uid: only files owned by this uid (None: any owner).
        within: a trusted directory holding ``directory`` (``bot_relay/``): no step from it down to
            ``directory`` may be a symlink or another uid's (None: only ``directory`` itself is checked).
        keep: asked last for each old file's name: True keeps it (something still needs it, whatever its
            age); it must not raise but ``OSError`` (the file is then kept). None: age alone decides.

    Returns:
        How many files were removed.
    """
    try:
        if within is not None:
            fd = open_relay_dir(within, directory)
        else:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except HostileFileError as exc:
        logger.warning("housekeeping: not sweeping {}: {}", directory, exc)
        return 0
    except OSError:  # missing, or a symlink (ELOOP) / a file (ENOTDIR) where the directory should be
        return 0
    try:
        return _sweep_fd(fd, cutoff, patterns=patterns, uid=uid, keep=keep)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _sweep_fd(fd: int, cutoff: float, *, patterns: tuple[str, ...] | None, uid: int | None,
              keep: Callable[[str], bool] | None) -> int:
    removed = 0
    try:
        entries = list(os.scandir(fd))
    except OSError:
        return 0
    for entry in entries:
        if patterns is not None and not any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
                continue
            if info.st_mtime < cutoff and (keep is None or not keep(entry.name)):
                os.unlink(entry.name, dir_fd=fd)
                removed += 1
        except OSError:
            continue
    return removed
