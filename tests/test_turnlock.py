"""The turn lock's flock calls: taken and released without dropping the GIL, same meaning as ``fcntl.flock``."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roots import LogCapture

from hermes_actors.store import turnlock
from hermes_actors.store.turnlock import TurnLock, flock_now

TRY = fcntl.LOCK_EX | fcntl.LOCK_NB


@pytest.fixture
def other_fd(tmp_path: Path) -> Iterator[int]:
    """A second open file description of the lock file: another process's view of the flock."""
    fd = os.open(tmp_path / "p.lock", os.O_RDWR | os.O_CREAT, 0o600)
    yield fd
    os.close(fd)


@pytest.fixture(params=["libc", "fcntl"])
def flock_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways ``flock_now`` can run: libc without dropping the GIL, and ``fcntl.flock`` where libc is missing."""
    if request.param == "fcntl":
        monkeypatch.setattr(turnlock, "_FLOCK", None)
    elif turnlock._FLOCK is None:
        pytest.skip("libc's flock could not be loaded on this system")
    return str(request.param)


def test_the_libc_flock_is_loaded_here() -> None:
    assert turnlock._FLOCK is not None  # Linux with glibc: the hot path must not fall back


def test_a_taken_lock_excludes_another_open_file_until_released(tmp_path: Path, other_fd: int,
                                                                   flock_impl: str) -> None:
    lock = TurnLock(tmp_path / "p.lock")
    assert lock.try_acquire()
    with pytest.raises(BlockingIOError):
        fcntl.flock(other_fd, TRY)
    lock.release()
    fcntl.flock(other_fd, TRY)  # free now
    fcntl.flock(other_fd, fcntl.LOCK_UN)
    lock.close()


def test_a_lock_held_elsewhere_is_not_taken(tmp_path: Path, other_fd: int, flock_impl: str) -> None:
    fcntl.flock(other_fd, TRY)
    lock = TurnLock(tmp_path / "p.lock")
    assert lock.try_acquire() is False
    fcntl.flock(other_fd, fcntl.LOCK_UN)
    assert lock.try_acquire() is True
    lock.release()
    lock.close()


def test_flock_now_says_would_block_as_fcntl_does(tmp_path: Path, other_fd: int, flock_impl: str) -> None:
    fcntl.flock(other_fd, TRY)
    fd = os.open(tmp_path / "p.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError) as caught:
            flock_now(fd, TRY)
        assert caught.value.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)


def test_flock_now_raises_other_errors_as_oserror(tmp_path: Path, flock_impl: str) -> None:
    fd = os.open(tmp_path / "gone.lock", os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)  # a closed descriptor: EBADF
    with pytest.raises(OSError) as caught:
        flock_now(fd, TRY)
    assert caught.value.errno == errno.EBADF
    assert not isinstance(caught.value, BlockingIOError)


def test_flock_now_refuses_an_operation_that_could_wait(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "p.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for operation in (fcntl.LOCK_EX, fcntl.LOCK_SH):
            with pytest.raises(ValueError, match="LOCK_NB"):
                flock_now(fd, operation)
    finally:
        os.close(fd)


def test_a_bot_relay_swapped_for_a_symlink_refuses_the_lock_never_followed(tmp_path: Path) -> None:
    from hermes_actors.store.turnlock import turn_lock_path

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "bot_relay" / "locks").mkdir(parents=True)
    (outside / "locks").mkdir(parents=True)  # what a swapped bot_relay/ would hold
    os.rename(root / "bot_relay", tmp_path / "moved")
    os.symlink(outside, root / "bot_relay")
    lock = TurnLock(turn_lock_path(root, "carol"))
    with pytest.raises(OSError, match=r"turn lock directory is refused: .* is a symlink"):
        lock.try_acquire()
    with pytest.raises(OSError, match="is a symlink"):
        lock.acquire(deadline=0.0)
    assert sorted(p.name for p in outside.rglob("*")) == ["locks"]  # nothing created through the link
    assert (root / "bot_relay").is_symlink()  # bot_relay/ itself is the user's to put back: never moved


@pytest.mark.parametrize("swapped", ["symlink", "file"])
def test_a_locks_directory_swapped_is_put_back_as_the_rescan_does_and_the_lock_works(
    tmp_path: Path, swapped: str, logs: LogCapture
) -> None:
    """Regression (hostile-files review): a locks/ swapped for a symlink failed an acked DM at once, `failed
    [runtime_offline] … Taking the turn lock failed (PermissionError: … locks is a symlink…); the DM was NOT
    delivered. Resend shortly.`, though the rescan put locks/ back 2 s later (a swapped lock FILE was already moved
    aside and the DM ran). The lock now moves the swapped locks/ into quarantine/ by the rescan's rule and makes it
    again."""
    from hermes_actors.store.turnlock import turn_lock_path

    root, outside = tmp_path / "root", tmp_path / "outside"
    locks = root / "bot_relay" / "locks"
    locks.mkdir(parents=True)
    outside.mkdir()
    os.rename(locks, tmp_path / "moved")
    if swapped == "symlink":
        os.symlink(outside, locks)
    else:
        locks.write_text("not a directory")
    lock = TurnLock(turn_lock_path(root, "carol"))
    try:
        assert lock.try_acquire()
        lock.release()
    finally:
        lock.close()
    assert locks.is_dir() and not locks.is_symlink() and (locks / "carol.lock").is_file()
    assert stat.S_IMODE(locks.stat().st_mode) == 0o700
    [moved] = (root / "bot_relay" / "quarantine").iterdir()
    assert moved.name.startswith("locks.") and moved.is_symlink() == (swapped == "symlink")
    assert list(outside.iterdir()) == []  # never followed
    assert logs.matching("quarantined", str(locks), "a relay directory was replaced by a symlink or a file")


def _plant_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


@pytest.mark.parametrize(("planted", "why"), [
    ("symlink", "a symlink"),
    ("directory", "a directory"),  # a directory with a file in it: EISDIR failed every DM of the bot, restarts too
    ("FIFO", "a FIFO"),
    ("socket", "a socket"),
    pytest.param("another uid's file", "owned by uid 65534",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")),
])
def test_a_hostile_lock_file_is_moved_aside_and_the_lock_works(
    tmp_path: Path, planted: str, why: str, logs: LogCapture
) -> None:
    """Left in place it failed every turn of that bot for good ("resend shortly", forever)."""
    from hermes_actors.store.turnlock import turn_lock_path

    root, victim = tmp_path / "root", tmp_path / "victim"
    victim.write_text("not yours")
    path = turn_lock_path(root, "carol")
    path.parent.mkdir(parents=True)
    if planted == "symlink":
        os.symlink(victim, path)
    elif planted == "directory":
        path.mkdir()
        (path / "inside").write_text("kept")
    elif planted == "FIFO":
        os.mkfifo(path)
    elif planted == "socket":
        _plant_socket(path)
    else:
        path.write_text("")
        os.chown(path, 65534, 65534)  # nobody
    lock = TurnLock(path)
    try:
        assert lock.try_acquire()
        lock.release()
    finally:
        lock.close()
    assert path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid()
    [moved] = (root / "bot_relay" / "quarantine").iterdir()
    assert moved.name.startswith("carol.lock.")
    assert victim.read_text() == "not yours"  # never followed
    assert logs.matching("quarantined", str(path), f"the turn lock is {why}"), logs.lines
    if planted == "directory":
        assert (moved / "inside").read_text() == "kept"  # moved whole, nothing in it removed


def test_a_good_lock_file_created_meanwhile_is_never_left_moved_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes meet the same planted symlink: the first replaces it and takes the flock; the second, which
    looked before that, must not move the good file away (both would then "hold" the bot's lock)."""
    import hermes_actors.store.relay_quarantine as relay_quarantine
    from hermes_actors.store.turnlock import turn_lock_path

    root = tmp_path / "root"
    path = turn_lock_path(root, "bob")
    path.parent.mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere", path)
    holder: list[int] = []
    real_quarantine_into = relay_quarantine.quarantine_into

    def the_other_process_is_faster(directory: Path, moved: Path, why: str, **kw: Any) -> Path | None:
        if not holder:  # it moves the symlink aside, creates the lock file and holds its flock
            os.unlink(path)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            holder.append(fd)
        return real_quarantine_into(directory, moved, why, **kw)

    monkeypatch.setattr(relay_quarantine, "quarantine_into", the_other_process_is_faster)
    lock = TurnLock(path)
    try:
        assert lock.try_acquire() is False  # the other holds the bot's lock: the same file, back at its path
        assert os.fstat(holder[0]).st_ino == os.lstat(path).st_ino
    finally:
        lock.close()
        for fd in holder:
            os.close(fd)


def test_a_good_lock_file_moved_aside_is_never_linked_back_through_a_swapped_quarantine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (swapped directories): the good lock file moved aside by mistake (another process created it
    between the look and the move) was looked at and linked back by path, so with ``quarantine/`` swapped for a
    symlink at that moment, a regular file outside the root of the quarantined name became the bot's lock file (a
    hard link to it in ``locks/``). Now both are done through the checked walk from the root: refused, nothing is
    linked, and the lock is a fresh file of its own."""
    import hermes_actors.store.relay_quarantine as relay_quarantine
    from hermes_actors.store.turnlock import turn_lock_path

    root, outside = tmp_path / "root", tmp_path / "outside"
    path = turn_lock_path(root, "bob")
    path.parent.mkdir(parents=True)
    outside.mkdir()
    os.symlink(tmp_path / "elsewhere", path)
    decoys: list[Path] = []
    real_quarantine_into = relay_quarantine.quarantine_into

    def good_file_moved_then_quarantine_swapped(directory: Path, moved: Path, why: str, **kw: Any) -> Path | None:
        os.unlink(path)  # another process put a good lock file there (and let go of it)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        dest = real_quarantine_into(directory, moved, why, **kw)
        assert dest is not None
        os.rename(directory, tmp_path / "quarantine.real")
        os.symlink(outside, directory)
        decoy = outside / dest.name
        decoy.write_text("not a lock")
        decoys.append(decoy)
        return dest

    monkeypatch.setattr(relay_quarantine, "quarantine_into", good_file_moved_then_quarantine_swapped)
    lock = TurnLock(path)
    try:
        assert lock.try_acquire()
        lock.release()
    finally:
        lock.close()
    [decoy] = decoys
    assert os.lstat(decoy).st_nlink == 1 and not os.path.samefile(decoy, path)  # never linked in as the lock
    assert decoy.read_text() == "not a lock"
