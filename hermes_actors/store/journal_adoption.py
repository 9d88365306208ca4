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
file is read once, not at every rescan, while it stays the same (``unchanged``).
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from loguru import logger

from hermes_actors.store.journal_records import JournalFolded, fold_lines, fold_records, read_lines, state_records
from hermes_actors.store.journal_state import JournalState

__all__ = ["FileMark", "adopt_dead_journals"]

#: What says a journal file is unchanged since it was last read: its inode, size and modification time.
FileMark = tuple[int, int, int]


class _Adopted(NamedTuple):
    """A dead gateway's journal file, locked by us until it is removed."""

    path: Path
    fd: int  # open and flocked until its records are in our file and it is gone
    bad: int  # its unreadable lines


def adopt_dead_journals(
    directory: Path, own: Path, state: JournalState, write: Callable[[list[bytes]], object], *,
    keep: int, within: Path | None, unchanged: dict[str, FileMark] | None = None,
) -> JournalFolded:
    """Take over the journals of dead gateways: their live records go into our file, then the old files go.

    Args:
        directory: ``<root>/bot_relay/journal``.
        own: our own journal file (never adopted).
        state: our file's state; it takes over the adopted live deliveries and delivered outcomes.
        write: writes lines to our file, synced (the journal's write, under its write turn).
        keep: how many delivered outcomes ``state`` keeps at most.
        within: the Hermes root the quarantine directory must stay under.
        unchanged: None at a start (every dead file is adopted). A running gateway's: only a file with
            something unfinished is adopted; a settled one is left where it is and noted here (name →
            :data:`FileMark`), so it is not read again while it stays the same.

    Returns:
        The folded state of the adopted files (what recovery must act on), ``files`` naming them.

    Raises:
        StoreError, OSError: our file could not be written; the old files stay (``state`` has taken
            them over: the caller restores it).
    """
    folded, adopted = _lock_dead_journals(directory, own, unchanged)
    try:
        # Copy what still matters into our own file before the old files go.
        lines = state.take_over(folded, keep=keep)
        if lines:
            write(lines)
        _retire(adopted, within=within)
    finally:
        for _, fd, _ in adopted:
            os.close(fd)
    folded.files = [path.name for path, _, _ in adopted]
    return folded


def _lock_dead_journals(
    directory: Path, own: Path, unchanged: dict[str, FileMark] | None,
) -> tuple[JournalFolded, list[_Adopted]]:
    """Lock and fold every journal in ``directory`` that no living gateway owns.

    Skipped: our own file, one a living gateway holds, one another gateway adopted since we
    listed it; and, each with a warning naming it, a symlink, a FIFO or other non-regular
    file, a file of another user, one that cannot be opened. With ``unchanged`` (a running
    gateway), a file with nothing unfinished too (see :func:`adopt_dead_journals`).

    Args:
        directory: ``<root>/bot_relay/journal``.
        own: our own journal file (never adopted).
        unchanged: a running gateway's settled files (see :func:`adopt_dead_journals`); None at a start.

    Returns:
        The folded state of the adopted files, and the files, still locked.
    """
    folded = JournalFolded()
    adopted: list[_Adopted] = []
    paths = sorted(directory.glob("j-*.log"))
    if unchanged is not None:  # forget the files that went
        for name in set(unchanged) - {path.name for path in paths}:
            del unchanged[name]
    warned = unchanged is None  # a running gateway says nothing of a file it skips: the start that adopts it does
    for path in paths:
        if path == own:
            continue
        if path.is_symlink():  # a gateway never makes one: never followed, and said (once: adoption runs at start)
            if warned:
                logger.warning("journal {} is a symlink, not a journal a gateway wrote; ignored (remove it)", path)
            continue
        try:  # O_NONBLOCK: a FIFO planted under a journal's name must not hang the start
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # adopted (and removed) by another gateway since we listed it
        except OSError as exc:  # a symlink swapped in since (ELOOP), a file we may not read
            if warned:
                logger.warning("journal {} cannot be opened ({}); ignored", path, exc.strerror or exc)
            continue
        keep = False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                if warned:
                    logger.warning("journal {} is not a regular file; ignored", path)
                continue
            mark = (info.st_ino, info.st_size, info.st_mtime_ns)
            if unchanged is not None and unchanged.get(path.name) == mark:
                continue  # settled when we last read it, and the same file still
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a living gateway owns it
            info = os.fstat(fd)
            if info.st_nlink == 0:
                continue  # already adopted (or compacted away) by another gateway since we opened it
            if info.st_uid != os.getuid():
                if warned:
                    logger.warning("journal {} is owned by another user; ignored", path)
                continue
            into = folded if unchanged is None else JournalFolded()
            with os.fdopen(os.dup(fd), "rb") as stream:
                bad = fold_lines(read_lines(stream), into)
            if unchanged is not None:
                if not into.live():  # every outcome reached its sender: left for wait_outcome and the next start
                    unchanged[path.name] = mark
                    continue
                _fold_into(into, folded)
            adopted.append(_Adopted(path, fd, bad))
            keep = True
        finally:
            if not keep:
                os.close(fd)
    return folded, adopted


def _fold_into(one: JournalFolded, folded: JournalFolded) -> None:
    """Fold the state of one file into that of the files before it, as one fold of them all would."""
    for key, state in one.states.items():
        fold_records(state_records(key, state), folded)
    folded.corrupt_lines += one.corrupt_lines


def _retire(adopted: list[_Adopted], *, within: Path | None) -> None:
    """Remove the adopted files, whose records are in our file now; quarantine those with unreadable lines."""
    for path, _, bad in adopted:
        if bad:  # kept for whoever must find out what an unreadable record was
            _quarantine_damaged(path, bad, within=within)
            continue
        try:
            path.unlink()
        except OSError as exc:
            logger.warning("could not remove adopted journal {}: {}", path, exc)


def _quarantine_damaged(path: Path, bad: int, *, within: Path | None) -> None:
    """Move an adopted journal with unreadable lines to ``bot_relay/quarantine/``, loudly.

    Its readable records are in our file already. An unreadable line is a write torn by a
    crash (never acked: the ack waits for the sync) or damage; a damaged ``accepted`` record
    is a DM whose sender was acked and that nothing can run any more, so say so.
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
