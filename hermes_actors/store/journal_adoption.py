"""Adopting the journals of dead gateways on the same root.

A journal file whose ``flock`` can be taken has no living owner (the kernel drops the
lock with its process, ``kill -9`` included). A starting gateway
(:meth:`hermes_actors.store.journal.Journal.start`) locks every such file, folds its
records, copies what still matters into its own file, then removes the old file, or
moves it to ``bot_relay/quarantine/`` if some of its lines were unreadable. The old
files stay locked until then, so no other gateway adopts them too.

A running gateway does the same at each relay rescan (:meth:`hermes_actors.store.journal.Journal.adopt_dead`),
for the files of gateways that stopped or died beside it, but only a file with something unfinished in it
(a delivery whose outcome never reached its sender): a gateway that stopped cleanly with everything settled
leaves its file for ``wait_outcome`` and ``hermes-actors outcome`` (and the next start), unchanged; each such
file is read once, not at every rescan, while it stays the same (``unchanged``). It reads and folds the
dead files without the journal's write turn (:func:`lock_dead_journals`: they are flocked by us, nobody
writes them), and takes the turn only to write their records into our file (:func:`take_over_dead_journals`).

An adopted file that can be neither removed nor moved aside (a quarantine directory of another user, an
``unlink`` refused) stays where it is, its records in our file: the gateway remembers it (device, inode and
size) and never adopts it again while it runs (``unretired``), or its never-started DMs would run again at
every rescan.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from loguru import logger

from hermes_actors.errors import HostileFileError
from hermes_actors.store.journal_records import JournalFolded, fold_lines, fold_records, read_lines, state_records
from hermes_actors.store.journal_screen import (
    ADOPT,
    REFUSE,
    JournalEntry,
    described,
    entry_at,
    journal_verdict,
    refusal,
    refused_open,
)
from hermes_actors.store.journal_state import JournalState
from hermes_actors.store.relay_dirfd import remove_below

__all__ = ["DeadJournals", "FileIdentity", "FileMark", "adopt_dead_journals", "lock_dead_journals",
           "take_over_dead_journals"]

#: What says a journal file is unchanged since it was last read: its inode, size and modification time.
FileMark = tuple[int, int, int]
#: Which adopted file could not be retired: its device, inode and size (see :func:`take_over_dead_journals`).
FileIdentity = tuple[int, int, int]


class _Adopted(NamedTuple):
    """A dead gateway's journal file, locked by us until it is removed."""

    path: Path
    fd: int  # open and flocked until its records are in our file and it is gone
    bad: int  # its unreadable lines
    identity: FileIdentity  # its device, inode and size when it was read


class DeadJournals:
    """The dead gateways' journal files :func:`lock_dead_journals` locked and folded, until :meth:`release`.

    Attributes:
        folded: their folded state (what recovery must act on).
        files: the files, each open and flocked by us.
    """

    def __init__(self, folded: JournalFolded, files: list[_Adopted]) -> None:
        self.folded = folded
        self.files = files

    def release(self) -> None:
        """Close the files (their flocks go with them); done once, later calls do nothing."""
        files, self.files = self.files, []
        for adopted in files:
            os.close(adopted.fd)


def adopt_dead_journals(
    directory: Path, own: Path, state: JournalState, write: Callable[[list[bytes]], object], *,
    keep: int, within: Path | None, unchanged: dict[str, FileMark] | None = None,
    unretired: dict[str, FileIdentity] | None = None, held: list[int] | None = None,
) -> JournalFolded:
    """Take over the journals of dead gateways: their live records go into our file, then the old files go.

    :func:`lock_dead_journals` then :func:`take_over_dead_journals` (a running gateway calls them apart:
    the reading needs no write turn, the writing does).

    Args:
        directory: ``<root>/bot_relay/journal``.
        own: our own journal file (never adopted).
        state: our file's state; it takes over the adopted live deliveries and delivered outcomes.
        write: writes lines to our file, synced (the journal's write, under its write turn).
        keep: how many delivered outcomes ``state`` keeps at most.
        within: the Hermes root the quarantine directory must stay under.
        unchanged: see :func:`lock_dead_journals`.
        unretired: see :func:`take_over_dead_journals`.
        held: see :func:`take_over_dead_journals`.

    Returns:
        The folded state of the adopted files (what recovery must act on), ``files`` naming them.

    Raises:
        StoreError, OSError: our file could not be written, or a dead file not read; the old files stay
            (``state`` may have taken them over: the caller restores it).
        HostileFileError: a symlink or another user's file swapped in since the start's screen (see
            :func:`lock_dead_journals`); nothing was written.
    """
    dead = lock_dead_journals(directory, own, unchanged=unchanged, unretired=unretired, within=within)
    try:
        return take_over_dead_journals(dead, state, write, keep=keep, within=within, unretired=unretired,
                                       held=held)
    finally:
        dead.release()


def take_over_dead_journals(
    dead: DeadJournals, state: JournalState, write: Callable[[list[bytes]], object], *,
    keep: int, within: Path | None, unretired: dict[str, FileIdentity] | None = None, held: list[int] | None = None,
) -> JournalFolded:
    """Copy what still matters of the locked dead files into our file, then remove (or quarantine) them.

    Under the journal's write turn (``state`` and ``write`` are its). The files stay open and flocked
    (the caller releases them).

    Args:
        dead: what :func:`lock_dead_journals` locked.
        state: our file's state; it takes over the adopted live deliveries and delivered outcomes.
        write: writes lines to our file, synced.
        keep: how many delivered outcomes ``state`` keeps at most.
        within: the Hermes root the quarantine directory must stay under.
        unretired: this journal's files adopted but that could be neither removed nor moved aside (name →
            :data:`FileIdentity`), added to here (and said once, each): :func:`lock_dead_journals` never adopts
            them again while they stay the same, or their DMs would run again at every rescan.
        held: where the flock of each such file is kept for the rest of our run (a descriptor of it, which the
            caller closes with its own file, on every path that ends it): another gateway on the root, or a
            start beside us, would otherwise lock and adopt it too, and run its never-started DMs a second time.

    Returns:
        The folded state of the adopted files (what recovery must act on), ``files`` naming them.

    Raises:
        StoreError, OSError: our file could not be written; the old files stay.
    """
    lines = state.take_over(dead.folded, keep=keep)
    if lines:
        write(lines)
    for adopted in _retire(dead.files, within=within):
        if unretired is not None:
            unretired[adopted.path.name] = adopted.identity
        if held is not None:
            held.append(os.dup(adopted.fd))  # the same open file: its flock stays ours once the caller releases
        logger.warning("adopted journal {} stays where it is, its records copied into this gateway's journal: no "
                       "gateway adopts it again while this one runs; remove it by hand", adopted.path)
    dead.folded.files = [adopted.path.name for adopted in dead.files]
    return dead.folded


def lock_dead_journals(
    directory: Path, own: Path, *, unchanged: dict[str, FileMark] | None = None,
    unretired: dict[str, FileIdentity] | None = None, within: Path | None = None,
) -> DeadJournals:
    """Lock and fold every journal in ``directory`` that no living gateway owns.

    Needs no write turn: nothing of ours is touched, and a file we flocked is ours alone (its
    gateway is dead, and any other would-be adopter fails to take its flock).
    Skipped: our own file, one a living gateway holds, one another gateway adopted since we
    listed it, one of ``unretired`` still the same, one that cannot be opened (a warning names it at
    a start; one we may not open, ``EACCES``, refuses a start as the screen refuses one of mode 000). What is not
    a regular file of ours we may read (:func:`~hermes_actors.store.journal_screen.journal_verdict`) is never
    opened: the start screened the directory before (:func:`~hermes_actors.store.journal_screen.
    screen_journal_files`), so one found here was swapped in since; at a start, a symlink, another user's
    file or one of ours we may not read refuses it as the screen does, and anything else is skipped with a
    warning (the next start moves it aside). A running gateway skips them all and says nothing (the next start
    acts on them). With ``unchanged`` (a running gateway), a file with nothing unfinished is skipped too.

    Args:
        directory: ``<root>/bot_relay/journal``.
        own: our own journal file (never adopted).
        unchanged: None at a start (every dead file is adopted). A running gateway's: only a file with
            something unfinished is adopted; a settled one is left where it is and noted here (name →
            :data:`FileMark`), so it is not read again while it stays the same.
        unretired: files adopted already that could not be retired (see :func:`take_over_dead_journals`).
        within: the Hermes root a start's refusal names (None: ``directory``).

    Returns:
        The folded state of the adopted files, and the files, still locked (the caller releases them).

    Raises:
        OSError: a dead file could not be read (every file locked so far is released).
        HostileFileError: at a start, a symlink, a regular file of another user or one of ours we may not read
            (every file locked so far is released).
    """
    folded = JournalFolded()
    adopted: list[_Adopted] = []
    paths = sorted(directory.glob("j-*.log"))
    names = {path.name for path in paths}
    for marks in (unchanged, unretired):  # forget the files that went
        if marks is not None:
            for name in set(marks) - names:
                del marks[name]
    starting = unchanged is None  # a running gateway says nothing of a file it skips: the start that adopts it does
    try:
        for path in paths:
            if path != own:
                one = _lock_one(path, folded, unchanged, unretired, starting=starting, where=within or directory)
                if one is not None:
                    adopted.append(one)
    except BaseException:
        DeadJournals(folded, adopted).release()
        raise
    return DeadJournals(folded, adopted)


def _lock_one(
    path: Path, folded: JournalFolded, unchanged: dict[str, FileMark] | None,
    unretired: dict[str, FileIdentity] | None, *, starting: bool, where: Path,
) -> _Adopted | None:
    """Lock and fold one journal file into ``folded`` (see :func:`lock_dead_journals`); None: skipped."""
    entry = entry_at(path)
    if entry is None:
        return None  # adopted (and removed) by another gateway since we listed it
    if not _adoptable(entry, starting=starting, where=where):  # never opened: a FIFO must not block
        return None
    try:  # O_NONBLOCK: a FIFO swapped in since the lstat must not hang the start
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None  # adopted (and removed) by another gateway since we listed it
    except PermissionError as exc:  # ours, its mode lets us read it, yet we may not (an ACL): refused as by the screen
        _adoptable(refused_open(path, exc), starting=starting, where=where)
        return None
    except OSError as exc:  # a symlink swapped in since (ELOOP)
        if starting:
            logger.warning("journal {} cannot be opened ({}); ignored", path, exc.strerror or exc)
        return None
    keep = False
    try:
        info = os.fstat(fd)
        if journal_verdict(info.st_mode, info.st_uid, os.getuid(), info.st_size) != ADOPT:  # swapped since the lstat
            swapped = entry_at(path)
            if swapped is not None:
                _adoptable(swapped, starting=starting, where=where)
            return None
        if unretired is not None and unretired.get(path.name) == (info.st_dev, info.st_ino, info.st_size):
            return None  # adopted by us already (its records are in our file): never again
        mark = (info.st_ino, info.st_size, info.st_mtime_ns)
        if unchanged is not None and unchanged.get(path.name) == mark:
            return None  # settled when we last read it, and the same file still
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # a living gateway owns it
        info = os.fstat(fd)
        if info.st_nlink == 0:
            return None  # already adopted (or compacted away) by another gateway since we opened it
        into = folded if unchanged is None else JournalFolded()
        with os.fdopen(os.dup(fd), "rb") as stream:
            bad = fold_lines(read_lines(stream), into)
        if unchanged is not None:
            if not into.live():  # every outcome reached its sender: left for wait_outcome and the next start
                unchanged[path.name] = mark
                return None
            _fold_into(into, folded)
        keep = True
        return _Adopted(path, fd, bad, (info.st_dev, info.st_ino, info.st_size))
    finally:
        if not keep:
            os.close(fd)


def _adoptable(entry: JournalEntry, *, starting: bool, where: Path) -> bool:
    """Whether ``entry`` is a regular file of ours (:func:`~hermes_actors.store.journal_screen.journal_verdict`).

    One that is not was swapped in since the start screened the directory (or beside a running gateway):
    at a start, a symlink, another user's file or one of ours we may not read refuses it, as the screen does
    (not saying nothing was changed: the start made its directories and file, and may have moved entries into
    quarantine), and anything else is skipped with a warning; a running gateway skips it and says nothing (the
    next start acts on it).

    Raises:
        HostileFileError: at a start, a symlink, a regular file of another user or one of ours we may not read.
    """
    if entry.verdict == ADOPT:
        return True
    if starting and entry.verdict == REFUSE:
        raise HostileFileError(refusal([entry], where, os.getuid(), unchanged=False))
    if starting:
        logger.warning("{}; ignored (the next start moves it into quarantine)", described(entry))
    return False


def _fold_into(one: JournalFolded, folded: JournalFolded) -> None:
    """Fold the state of one file into that of the files before it, as one fold of them all would."""
    for key, state in one.states.items():
        fold_records(state_records(key, state), folded)
    folded.corrupt_lines += one.corrupt_lines


def _retire(adopted: list[_Adopted], *, within: Path | None) -> list[_Adopted]:
    """Remove the adopted files, whose records are in our file now; quarantine those with unreadable lines.

    Returns:
        The files that stay where they were (neither removed nor moved aside; each said already).
    """
    stayed: list[_Adopted] = []
    for one in adopted:
        if one.bad:  # kept for whoever must find out what an unreadable record was
            if not _quarantine_damaged(one.path, one.bad, within=within):
                stayed.append(one)
            continue
        try:  # through the checked journal/: one swapped for a symlink is refused, nothing outside is removed
            remove_below(within or one.path.parent, one.path)
        except (OSError, HostileFileError) as exc:
            logger.warning("could not remove adopted journal {}: {}", one.path, exc)
            stayed.append(one)
    return stayed


def _quarantine_damaged(path: Path, bad: int, *, within: Path | None) -> bool:
    """Move an adopted journal with unreadable lines to ``bot_relay/quarantine/``, loudly.

    Its readable records are in our file already. An unreadable line is a write torn by a
    crash (never acked: the ack waits for the sync) or damage; a damaged ``accepted`` record
    is a DM whose sender was acked and that nothing can run any more, so say so.

    Returns:
        Whether it was moved aside.
    """
    from hermes_actors.store.relay_protocol import QUARANTINE
    from hermes_actors.store.relay_quarantine import quarantine_into

    relay_base = path.parent.parent  # bot_relay/journal/j-<uuid>.log → bot_relay
    moved = quarantine_into(relay_base / QUARANTINE, path,
                            f"adopted journal with {bad} unreadable line(s)", within=within)
    logger.warning(
        "journal {} had {} unreadable line(s) (a write torn by a crash, or damage); its readable records were "
        "adopted. A DM whose record was unreadable cannot be re-offered: look in the file ({}) for what it was",
        path, bad, moved or "it could not be moved aside and stays where it is",
    )
    return bool(moved)
