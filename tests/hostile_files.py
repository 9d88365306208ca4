"""Planting hostile files for the quarantine tests (not a test module).

    from hostile_files import kind_param, place

Shapes every store must refuse: a socket, a directory, a symlink to a file outside,
a regular file with the wrong mode or owner (and, for ``huge``, a sparse file past the
store's size limit). Files are prepared in ``staging`` (same filesystem) and renamed
in, so a watcher sees a complete file, as it would from any atomic writer.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

__all__ = ["IS_ROOT", "kind_param", "place"]

IS_ROOT = os.geteuid() == 0


def kind_param(kind: str) -> Any:
    """``kind`` as a pytest parameter; ``other-uid`` is skipped (saying why) when not root."""
    if kind == "other-uid":
        return pytest.param(kind, marks=pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root"))
    return kind


def place(kind: str, body: bytes, dest: Path, staging: Path, *, mode: int = 0o600,
          sparse_size: int | None = None) -> Path | None:
    """Put ``body`` at ``dest`` in the shape ``kind`` names; returns a symlink's target (else None).

    Args:
        kind: ``socket``, ``directory``, ``symlink``, ``other-uid``, or anything else for a regular file.
        body: the file's bytes.
        dest: where it lands.
        staging: a directory on the same filesystem to prepare it in.
        mode: a regular file's mode.
        sparse_size: for a regular file, extend it (sparsely) to this size.
    """
    staging.mkdir(exist_ok=True)
    prepared = staging / f"prep-{uuid.uuid4().hex}"
    target: Path | None = None
    if kind == "socket":  # opening a socket fails with ENXIO: once an unhandled OSError that killed the relay
        os.mknod(prepared, stat.S_IFSOCK | 0o600)
    elif kind == "directory":
        prepared.mkdir()
        (prepared / "inner.json").write_bytes(body)
    elif kind == "symlink":
        target = staging / f"outside-{uuid.uuid4().hex}.json"
        target.write_bytes(body)
        os.chmod(target, 0o600)
        os.symlink(target, prepared)
    else:
        fd = os.open(prepared, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            if sparse_size is not None:
                f.truncate(sparse_size)  # sparse: refused by its size, never read
        os.chmod(prepared, mode)
        if kind == "other-uid":
            os.chown(prepared, 65534, 65534)
    os.rename(prepared, dest)
    return target
