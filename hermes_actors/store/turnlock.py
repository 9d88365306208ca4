"""The per-profile cross-process turn lock: ``bot_relay/locks/<profile>.lock``.

Other programs on the same root (an old gateway, the ``hermes`` CLI) serialize
their Bot Chat turns on this ``flock``. There is no notification when a flock
is released, so waiting for one is the one place we poll — with a short,
growing backoff, bounded by the delivery's wait budget.

The lock is only ever tried (``LOCK_NB``) and released, and neither call can
block, so they are made without releasing the GIL (through ``ctypes.PyDLL``):
``fcntl.flock`` drops the GIL around the system call, and with a busy actor
system on two cores a thread that drops it often waits for a thread switch to
get it back. Where libc cannot be loaded, ``fcntl.flock`` is used. (On a
network filesystem the call is a round trip to the server, which every thread
of the process then waits for; a Hermes root is a local directory.)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.backoff import doubling
from hermes_actors.errors import HostileFileError
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import link_below, lstat_below, remove_below

__all__ = ["TurnLock", "flock_now", "turn_lock_path"]

_SAFE = re.compile(r"[^a-zA-Z0-9_-]")


def _load_flock() -> Any:
    """libc's ``flock`` called with the GIL held, or None where it cannot be loaded."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the call keeps the GIL
        flock = libc.flock
    except (OSError, AttributeError):
        return None
    flock.argtypes = (ctypes.c_int, ctypes.c_int)
    flock.restype = ctypes.c_int
    return flock


_FLOCK = _load_flock()


def flock_now(fd: int, operation: int) -> None:
    """``flock(fd, operation)`` for an operation that never waits, without releasing the GIL.

    Args:
        fd: an open file descriptor.
        operation: ``LOCK_EX | LOCK_NB``, ``LOCK_SH | LOCK_NB`` or ``LOCK_UN``.

    Raises:
        ValueError: ``operation`` could wait for another holder (no ``LOCK_NB``): with the
            GIL held, that wait would stop every thread of the process.
        BlockingIOError: another open file holds the lock.
        OSError: any other failure (``EBADF``...).
    """
    if operation & (fcntl.LOCK_EX | fcntl.LOCK_SH) and not operation & fcntl.LOCK_NB:
        raise ValueError("flock_now only takes a lock with LOCK_NB: a waiting flock must release the GIL")
    if _FLOCK is None:
        fcntl.flock(fd, operation)
        return
    while _FLOCK(fd, operation) != 0:
        code = ctypes.get_errno()
        if code == errno.EINTR:  # a signal arrived during the call: retry, as fcntl.flock does (PEP 475)
            continue
        if code in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise BlockingIOError(code, os.strerror(code))
        raise OSError(code, os.strerror(code))


def turn_lock_path(root: Path, profile: str) -> Path:
    """The lock file of ``profile`` under ``root`` (name sanitized like the seed)."""
    safe = _SAFE.sub("_", str(profile or ""))[:64] or "_"
    return Path(root) / "bot_relay" / "locks" / f"{safe}.lock"


_REOPENS = 5  # times a lock file found replaced under its flock is opened again before giving up


def _lock_anchor(path: Path) -> Path | None:
    """Pure: the Hermes root a lock file at ``<root>/bot_relay/<dir>/<name>`` lives under, else None.

    Every directory from that root down to the lock's is checked at each open, so a ``bot_relay/``
    or ``locks/`` swapped for a symlink puts neither the lock nor anything else outside the root.
    """
    directory = path.parent
    return directory.parent.parent if directory.parent.name == "bot_relay" else None


# What an open(2) of the lock's path failing with these errnos met there (EACCES: a file we may not open).
_OPEN_REFUSALS = {errno.ELOOP: "a symlink", errno.EISDIR: "a directory", errno.ENXIO: "a socket"}


def _refused_open(exc: OSError) -> str | None:
    """Pure: what the lock's path holds when opening it failed with ``exc``, or None for another failure.

    Args:
        exc: the error of ``os.open(path, O_RDWR | O_CREAT | O_NOFOLLOW)``.

    Returns:
        "a symlink", "a directory", "a socket", "not ours to open (…)"; None when the error says
        nothing about what is there (disk full, a missing directory): the caller raises it.
    """
    if exc.errno == errno.EACCES:
        return f"not ours to open ({exc.strerror})"
    return _OPEN_REFUSALS.get(exc.errno or 0)


def _refused_file(st: os.stat_result) -> str | None:
    """Pure: what is wrong with a lock file's ``stat`` result, None for a regular file of ours.

    Args:
        st: the ``fstat`` of the opened lock file, or the ``lstat`` of its path.

    Returns:
        "a symlink", "a directory", "a FIFO", "a socket", "not a regular file", "owned by uid N", or None.
    """
    kinds = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    for test, kind in kinds:
        if test(st.st_mode):
            return kind
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}"
    return None


def _good_lock_file(st: os.stat_result) -> bool:
    """Pure: whether an ``lstat`` result is a lock file we may use (a regular file of ours)."""
    return _refused_file(st) is None


class TurnLock:
    """One profile's flock, held for exactly the turn window (or another ``flock`` taken the same way).

    Args:
        path: the lock file (created 0600; its directory 0700).
        what: what the lock is, for the log lines and errors that name it ("the turn lock",
            "the rooms owner lock").
    """

    def __init__(self, path: Path, *, what: str = "the turn lock") -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None
        # acquire → release runs on a worker thread, close on the owning actor's: a close
        # during that window is deferred to release, so the flock is never dropped mid-turn.
        self._mutex = threading.Lock()
        self._in_use = False
        self._close_pending = False

    def _open(self) -> int:
        if self._fd is None:
            # O_NOFOLLOW guards the file only: a locks/ (or bot_relay/) swapped for a symlink would put
            # the lock, and the serialization it stands for, outside the root. Checked before each open.
            try:
                ensure_private_dir(self.path.parent, within=_lock_anchor(self.path))
            except HostileFileError as exc:  # an OSError for the callers: the DM fails, nothing is followed
                if not self._put_back_directory():
                    raise OSError(errno.EPERM, f"{self.what} directory is refused: {exc}") from exc
            self._fd = self._open_file()
        return self._fd

    def _put_back_directory(self) -> bool:
        """Put back the relay directory of the lock (``locks/``) swapped for a symlink or a file, as the rescan does.

        A turn that meets it before the rescan would fail its acked DM (``runtime_offline``, "NOT delivered")
        though nothing is lost by moving the entry aside: no process of ours holds a lock through it. The
        relay's own rule (:func:`hermes_actors.relay.strays.put_back_swapped`): never another user's directory,
        nor below a ``bot_relay/`` that is itself swapped.

        Returns:
            Whether a real directory of ours is there now.
        """
        from hermes_actors.relay.strays import put_back_swapped  # the relay's layout rules (a lazy import: no cycle)
        from hermes_actors.store.relay_inbox import InboxPaths

        anchor = _lock_anchor(self.path)
        return anchor is not None and put_back_swapped(InboxPaths.from_root(anchor), self.path.parent)

    def _open_file(self) -> int:
        """Open (create) the lock file; anything but a regular file of ours there is moved aside first.

        A symlink, a directory, a FIFO, a socket or another uid's file left in place would fail every
        turn of the profile for good (each DM "NOT delivered, resend shortly"), or, for a FIFO, serialize
        nothing another program would honour; no process of ours can hold a lock through it, so nothing
        is lost by moving it to ``quarantine/``.

        Raises:
            OSError: the file could not be opened, or what is there could not be moved aside.
        """
        # O_RDWR never waits for a FIFO's other end; a FIFO opened so is refused by its fstat below.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            why = _refused_open(exc)
            if why is None:
                raise
        else:
            why = _refused_file(os.fstat(fd))
            if why is None:
                return fd
            os.close(fd)
        self._quarantine(f"{self.what} is {why}")
        fd = os.open(self.path, flags, 0o600)  # ours now, or the one another process just created
        again = _refused_file(os.fstat(fd))
        if again is not None:
            os.close(fd)
            raise OSError(errno.EPERM, f"{self.path} is refused: it is {again} again")
        return fd

    def _quarantine(self, why: str) -> None:
        from hermes_actors.store.relay_protocol import QUARANTINE
        from hermes_actors.store.relay_quarantine import quarantine_into

        # Looked at again just before the move: another process that met the same file may have moved it
        # aside and created a good lock file there already, which must never be moved from under its flock.
        if self._good_or_gone():
            return
        moved = quarantine_into(self.path.parent.parent / QUARANTINE, self.path, why, within=_lock_anchor(self.path))
        if moved is None:
            if self._good_or_gone():
                return
            raise OSError(errno.EPERM, f"{self.path} is refused ({why}) and could not be moved aside")
        # Looked at and linked back through the walk from the root: a quarantine/ or locks/ swapped for a symlink
        # meanwhile is refused, so no file outside the root is linked in as the lock, and no link is made outside.
        anchor = _lock_anchor(self.path) or self.path.parent.parent
        try:
            st = lstat_below(anchor, moved)
        except (OSError, ValueError):  # HostileFileError included
            return
        if _good_lock_file(st):
            # Between the look and the move another process replaced the hostile file with a good one, maybe
            # flocked already: moved aside, its flock would serialize nothing. Put it back (a hard link: the
            # same file), unless yet another took its place.
            with contextlib.suppress(OSError, ValueError):  # HostileFileError included
                link_below(anchor, moved, self.path)
                remove_below(anchor, moved)  # never through a swapped quarantine/
                logger.info("{}: the lock file moved aside was a good one, created meanwhile; put back", self.path)

    def _good_or_gone(self) -> bool:
        """Whether the lock's path holds a regular file of ours now, or nothing."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return True
        return _good_lock_file(st)

    def _locked_the_file_at_path(self, fd: int) -> bool:
        """After taking the flock on ``fd``: whether it is still the file at the lock's path.

        A process that found a hostile file there moves it aside and creates a new one: the
        flock of a file no longer at the path serializes nothing (another process locks the new
        one). Then we let go and open the path again.
        """
        try:
            at_path = os.lstat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (mine.st_dev, mine.st_ino)

    @property
    def fd(self) -> int | None:
        """The open lock file's descriptor (None before the first acquire or after close).

        A turn's process inherits it, so the flock stays held while that process lives.
        """
        return self._fd

    def acquire(self, deadline: float, *, given_up: Callable[[], bool] | None = None) -> float | None:
        """Take the lock, waiting until the monotonic ``deadline`` at most.

        Args:
            deadline: monotonic time after which the wait gives up.
            given_up: asked between tries; once it says True the wait gives up at once (the turn
                waiting for the lock was given up on: its gateway stops, or its time ran out).

        Returns:
            Seconds waited when acquired, or None when the deadline passed or the wait was given up.
        """
        with self._mutex:
            self._open()
            self._in_use = True
        start = time.monotonic()
        delays = doubling(0.001, 0.05)
        said = False
        try:
            while True:
                try:
                    self._lock_now()
                    return time.monotonic() - start
                except BlockingIOError:
                    if not said:  # once per acquire: say why this turn has not started
                        logger.info("waiting for the lock {}: another turn or process holds it", self.path)
                        said = True
                    now = time.monotonic()
                    if now >= deadline or (given_up is not None and given_up()):
                        self._done()
                        return None
                    time.sleep(min(next(delays), deadline - now))
        except BaseException:
            self._done()
            raise

    def try_acquire(self) -> bool:
        """Take the lock only if it is free right now (never waits, never logs).

        Returns:
            True when acquired (release it with :meth:`release`).

        Raises:
            OSError: the lock file could not be opened or locked.
        """
        with self._mutex:
            self._open()
            self._in_use = True
        try:
            self._lock_now()
            return True
        except BlockingIOError:
            self._done()
            return False
        except BaseException:
            self._done()
            raise

    def _lock_now(self) -> None:
        """One try at the flock of the file at the lock's path (the caller marked the lock in use).

        Raises:
            BlockingIOError: another holder has it.
            OSError: the file cannot be opened or locked, or kept being replaced.
        """
        for _ in range(_REOPENS):
            with self._mutex:
                fd = self._open()
            flock_now(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                if self._locked_the_file_at_path(fd):
                    return
            except OSError:  # the path cannot be looked at: we must not keep a flock nobody will release
                flock_now(fd, fcntl.LOCK_UN)
                raise
            with self._mutex:  # a file moved aside (see _open_file): let go of it, open the path again
                flock_now(fd, fcntl.LOCK_UN)
                if self._fd == fd:
                    os.close(fd)
                    self._fd = None
        raise OSError(errno.EAGAIN, f"the turn lock {self.path} kept being replaced while it was taken")

    def release(self) -> None:
        """Release the lock (the fd stays open for the next turn, unless a close is pending)."""
        with self._mutex:
            if self._fd is not None:
                flock_now(self._fd, fcntl.LOCK_UN)
        self._done()

    def _done(self) -> None:
        with self._mutex:
            self._in_use = False
            if self._close_pending:
                self._close_locked()

    def abandon(self) -> None:
        """Give the lock up on behalf of a hung turn: unlock now, close once that turn returns.

        The owner then uses a fresh ``TurnLock`` (a new open file description), so the
        hung turn's eventual ``release`` can never unlock a later turn's flock.
        """
        with self._mutex:
            if self._fd is not None:
                try:
                    flock_now(self._fd, fcntl.LOCK_UN)
                except OSError:
                    pass
            if self._in_use:
                self._close_pending = True
            else:
                self._close_locked()

    def close(self) -> None:
        """Close the fd; while a turn holds (or waits for) the lock, at its release instead."""
        with self._mutex:
            if self._in_use:
                self._close_pending = True
            else:
                self._close_locked()

    def _close_locked(self) -> None:
        self._close_pending = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
