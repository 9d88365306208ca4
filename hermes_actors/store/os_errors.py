"""What a failed file operation tells its caller: a :class:`StoreError` naming the file and the OS error.

One rendering for every store write and directory (:mod:`hermes_actors.store.atomic`,
:mod:`hermes_actors.store.private_dir`), so a full disk or a refused permission reads the
same wherever it happens: ``cannot write <file>: No space left on device (ENOSPC)``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from hermes_actors.errors import StoreError

__all__ = ["os_error_text", "store_error"]


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


def store_error(action: str, target: Path, exc: BaseException) -> StoreError:
    """Build the :class:`StoreError` for a failed write of ``target``.

    Args:
        action: what was being done ("write", "create").
        target: the file that could not be written.
        exc: the underlying error.

    Returns:
        A StoreError whose text names the target and the OS error and whose
        ``errno`` mirrors the underlying one (None for non-OS failures).
    """
    detail = os_error_text(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
    err = StoreError(f"cannot {action} {target}: {detail}")
    err.errno = exc.errno if isinstance(exc, OSError) else None
    return err
