"""A small Linux inotify watcher: one thread, the kernel filters, files only.

Why not watchdog here: watchdog hands every event through three threads (the
inotify reader, a move-pairing delay queue, the emitter, then the observer's
dispatcher), holds an unpaired ``IN_MOVED_FROM`` at the head of its queue for
up to 0.5 s (a file renamed out of the watched tree stalls every event behind
it), and with a recursive watch wakes up for every directory below the root.
This watcher asks the kernel only for what a caller acts on: files created or
moved into the watched directories, and files closed after a write there (a
file created, then written in place, is complete only then; an atomic writer's
rename makes no such event), removals only when asked; no pairing, one thread
from ``read`` to the callback.

Which directories: the root and, either every directory below it (recursive,
new ones added as they appear), or only the named subdirectories. A watched
directory that disappears is dropped; :meth:`InotifyWatcher.restore` adds it
again once it exists (the owner calls it periodically and rescans when it
did). Directories are watched with ``IN_DONT_FOLLOW | IN_ONLYDIR``: a
directory swapped for a symlink is never followed.

The callbacks are the caller's code: whatever one raises (any ``BaseException``;
this thread is never the main thread, where a Ctrl-C lands) is logged, and the
thread goes on with the next event.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from loguru import logger

__all__ = ["AVAILABLE", "InotifyWatcher"]

IN_CLOSE_WRITE = 0x0008
IN_MOVED_FROM = 0x0040
IN_MOVED_TO = 0x0080
IN_CREATE = 0x0100
IN_DELETE = 0x0200
IN_DELETE_SELF = 0x0400
IN_MOVE_SELF = 0x0800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of NUL-padded name)
_READ_SIZE = 64 * 1024


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


_LIBC = _load_libc()
AVAILABLE = _LIBC is not None
"""Whether this system has inotify (Linux); elsewhere the bridge falls back to watchdog."""


class InotifyWatcher(threading.Thread):
    """Reports files appearing (and, if asked, disappearing) in watched directories.

    The watches are added by the constructor, on the caller's thread: a file
    that lands after it returns is reported once the thread runs.

    Args:
        root: the directory watched (it must exist).
        subdirs: names of the subdirectories of ``root`` to watch as well
            (None: every directory below ``root``, recursively).
        on_appeared: called on this thread with each file created or moved in, and again with each file
            closed after a write (a file written in place after its creation is complete only then).
        on_removed: called with each file deleted or moved out (None: removals
            are not even asked of the kernel).
        on_lost: called with a reason when events may have been missed (the
            kernel queue overflowed, a new directory appeared): rescan.

    Raises:
        OSError: inotify is unavailable, or ``root`` cannot be watched.
    """

    def __init__(
        self,
        root: Path,
        *,
        subdirs: Sequence[str] | None,
        on_appeared: Callable[[Path], None],
        on_removed: Callable[[Path], None] | None,
        on_lost: Callable[[str], None],
    ) -> None:
        super().__init__(name=f"inotify-{root.name}", daemon=True)
        if _LIBC is None:
            raise OSError("inotify is not available on this system")
        self.root = root
        self.subdirs = None if subdirs is None else tuple(subdirs)
        self.on_appeared, self.on_removed, self.on_lost = on_appeared, on_removed, on_lost
        files = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | (IN_DELETE | IN_MOVED_FROM if on_removed is not None else 0)
        self.mask = files | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK
        self._paths: dict[int, tuple[Path, int]] = {}  # watch descriptor → (directory, its inode)
        self._lock = threading.Lock()  # the watch table: this thread and restore() on the owner's
        self._fd_lock = threading.Lock()  # stop() never writes to a descriptor number closed (and reused) meanwhile
        self._fd = _inotify_init()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if self._add(root) is None:
                raise FileNotFoundError(f"cannot watch {root}: not a directory")
            self.restore()
        except BaseException:
            self._close()
            raise

    # ── watches ─────────────────────────────────────────────────────────────

    def _wanted(self) -> list[Path]:
        """The directories that should be watched now (the root first)."""
        if self.subdirs is not None:
            return [self.root, *(self.root / name for name in self.subdirs)]
        wanted: list[Path] = []
        for top, _dirs, _files in os.walk(self.root, followlinks=False):
            wanted.append(Path(top))
        return wanted

    def _add(self, directory: Path) -> int | None:
        """Watch ``directory`` (never through a symlink); None when it is not there."""
        assert _LIBC is not None
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(directory), self.mask) if self._fd >= 0 else -1
        if wd < 0:
            return None  # gone, not a directory, a symlink: restore() tries again later
        try:
            inode = os.lstat(directory).st_ino
        except OSError:
            inode = 0
        with self._lock:
            self._paths[wd] = (directory, inode)
        return wd

    def watched(self) -> set[Path]:
        """The directories watched now."""
        with self._lock:
            return {path for path, _ in self._paths.values()}

    def restore(self) -> int:
        """Watch every wanted directory that exists and is not watched yet.

        Returns:
            How many were added (files that landed in them meanwhile need a rescan).
        """
        watched = self.watched()
        return sum(1 for d in self._wanted() if d not in watched and self._add(d) is not None)

    # ── the thread ──────────────────────────────────────────────────────────

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._wake_r in ready:
                    return
                try:
                    data = os.read(self._fd, _READ_SIZE)
                except BlockingIOError:
                    continue
                self._dispatch(data)
        finally:
            self._close()

    def _dispatch(self, data: bytes) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            name = os.fsdecode(raw)
            try:
                self._event(wd, mask, name)
            except BaseException as error:  # a callback's (user code): logged, the watcher goes on
                logger.opt(exception=error).error("file watcher for {}: handling the event for {!r} failed: {!r}",
                                                  self.root, name, error)

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self.on_lost("overflow")
            return
        with self._lock:
            entry = self._paths.get(wd)
        if entry is None:
            return
        directory, inode = entry
        if mask & IN_IGNORED:  # the watch is gone (its directory was deleted or moved away)
            with self._lock:
                self._paths.pop(wd, None)
            return
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
            self._maybe_drop(wd, directory, inode)
            return
        path = directory / name
        if mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO) and self._is_wanted_dir(path) and self.restore():
                self.on_lost("new-directory")
            return
        if mask & (IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE):
            self.on_appeared(path)
        elif self.on_removed is not None and mask & (IN_DELETE | IN_MOVED_FROM):
            self.on_removed(path)

    def _is_wanted_dir(self, path: Path) -> bool:
        if self.subdirs is None:
            return True
        return path.parent == self.root and path.name in self.subdirs

    def _maybe_drop(self, wd: int, directory: Path, inode: int) -> None:
        """Drop a watch whose directory moved away, unless it was re-added at a watched path."""
        try:
            if os.lstat(directory).st_ino == inode:
                return  # the same directory is still (or again) at the path we know it by
        except OSError:
            pass
        assert _LIBC is not None
        _LIBC.inotify_rm_watch(self._fd, wd)  # IN_IGNORED follows and clears the entry

    # ── stopping ────────────────────────────────────────────────────────────

    def stop(self) -> None:
        """Ask the thread to end (idempotent); join() waits for it. Never started: release at once."""
        if self.ident is None:
            self._close()
            return
        with self._fd_lock:
            if self._wake_w >= 0:
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:
                    pass  # the pipe is full of earlier stop requests

    def _close(self) -> None:
        with self._fd_lock:
            for fd in (self._fd, self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._fd = self._wake_r = self._wake_w = -1


def _inotify_init() -> int:
    assert _LIBC is not None
    fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"inotify_init1: {os.strerror(code)}")
    return fd
