"""Housekeeping: remove old regular files from one directory, never following a symlink."""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

__all__ = ["sweep_old_files"]


def sweep_old_files(
    directory: Path, cutoff: float, *, patterns: tuple[str, ...] | None = None, uid: int | None = None
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

    Returns:
        How many files were removed.
    """
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if patterns is not None and not any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
                continue
            if info.st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed
