"""What a failed file operation tells its caller: a :class:`StoreError` naming the file and the OS error.

One rendering for every store write and directory (:mod:`hermes_actors.store.atomic`,
:mod:`hermes_actors.store.private_dir`), so a full disk or a refused permission reads the
same wherever it happens: ``cannot write <file>: No space left on device (ENOSPC); free space on
its filesystem``: the absolute file, the OS error, and what the operator does about it
(:func:`what_to_do`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hermes_actors.errors import StoreError

__all__ = ["os_error_text", "store_error", "what_to_do"]

# What an operator does about the errors a full, read-only or foreign disk gives (by errno).
_WHAT_TO_DO = {
    errno.ENOSPC: "free space on its filesystem",
    errno.EDQUOT: "free space or raise the disk quota of the user running hermes-actors",
    errno.EROFS: "its filesystem is mounted read-only: remount it read-write",
    errno.EACCES: "fix the permissions: the user running hermes-actors must be able to write there",
    errno.EPERM: "fix the permissions: the user running hermes-actors must be able to write there",
}


def os_error_text(exc: OSError) -> str:
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


def what_to_do(exc: BaseException) -> str | None:
    """Pure: what the operator does about a failed file operation, or None when there is nothing to say.

    Args:
        exc: the error (an ``OSError`` with an errno; anything else has no advice).

    Returns:
        e.g. ``"free space on its filesystem"`` for ENOSPC, the remount for EROFS, the
        permissions for EACCES and EPERM.
    """
    return _WHAT_TO_DO.get(exc.errno or 0) if isinstance(exc, OSError) else None


def store_error(action: str, target: Path, exc: BaseException) -> StoreError:
    """Build the :class:`StoreError` for a failed write of ``target``.

    Args:
        action: what was being done ("write", "create").
        target: the file that could not be written.
        exc: the underlying error.

    Returns:
        A StoreError whose text names the target (absolute) and the OS error, and what to do about
        it (:func:`what_to_do`), and whose ``errno`` mirrors the underlying one (None for non-OS failures).
    """
    detail = os_error_text(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
    advice = what_to_do(exc)
    err = StoreError(f"cannot {action} {Path(target).absolute()}: {detail}{f'; {advice}' if advice else ''}")
    err.errno = exc.errno if isinstance(exc, OSError) else None
    return err
