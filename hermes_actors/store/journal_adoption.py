"""Adopting the journals of dead gateways on the same root.

A journal file whose ``flock`` can be taken has no living owner (the kernel drops the
lock with its process, ``kill -9`` included). A starting gateway
(:meth:`hermes_actors.store.journal.Journal.start`) locks every such file, folds its
records, copies what still matters into its own file, then removes the old file, or
moves it to ``bot_relay/quarantine/`` if some of its lines were unreadable. The old
files stay locked until then, so no other starting gateway adopts them too.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from loguru import logger

from hermes_actors.store.journal_records import JournalFolded, fold_lines, read_lines
from hermes_actors.store.journal_state import JournalState

__all__ = ["adopt_dead_journals"]


class _Adopted(NamedTuple):
    """A dead gateway's journal file, locked by us until it is removed."""

    path: Path
    fd: int  # open and flocked until its records are in our file and it is gone
    bad: int  # its unreadable lines


def adopt_dead_journals(
    directory: Path, own: Path, state: JournalState, write: Callable[[list[bytes]], object], *,
    keep: int, within: Path | None,
) -> JournalFolded:
    """Take over the journals of dead gateways: their live records go into our file, then the old files go.

    Args:
        directory: ``<root>/bot_relay/journal``.
        own: our own journal file (never adopted).
        state: our file's state; it takes over the adopted live deliveries and delivered outcomes.
        write: writes lines to our file, synced (the journal's write, under its write turn).
        keep: how many delivered outcomes ``state`` keeps at most.
        within: the Hermes root the quarantine directory must stay under.

    Returns:
        The folded state of the adopted files (what recovery must act on).

    Raises:
        StoreError, OSError: our file could not be written; the old files stay.
    """
    folded, adopted = _lock_dead_journals(directory, own)
    # Copy what still matters into our own file before the old files go.
    state.take_over(folded, keep=keep)
    try:
        lines = state.lines()
        if lines:
            write(lines)
        _retire(adopted, within=within)
    finally:
        for _, fd, _ in adopted:
            os.close(fd)
    return folded


def _lock_dead_journals(directory: Path, own: Path) -> tuple[JournalFolded, list[_Adopted]]:
    """Lock and fold every journal in ``directory`` that no living gateway owns.

    Skipped: our own file, one a living gateway holds, one another gateway adopted since we
    listed it; and, each with a warning naming it, a symlink, a FIFO or other non-regular
    file, a file of another user, one that cannot be opened.

    Args:
        directory: ``<root>/bot_relay/journal``.
        own: our own journal file (never adopted).

    Returns:
        The folded state of the adopted files, and the files, still locked.
    """
    folded = JournalFolded()
    adopted: list[_Adopted] = []
    for path in sorted(directory.glob("j-*.log")):
        if path == own:
            continue
        if path.is_symlink():  # a gateway never makes one: never followed, and said (once: adoption runs at start)
            logger.warning("journal {} is a symlink, not a journal a gateway wrote; ignored (remove it)", path)
            continue
        try:  # O_NONBLOCK: a FIFO planted under a journal's name must not hang the start
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # adopted (and removed) by another starting gateway since we listed it
        except OSError as exc:  # a symlink swapped in since (ELOOP), a file we may not read
            logger.warning("journal {} cannot be opened ({}); ignored", path, exc.strerror or exc)
            continue
        keep = False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                logger.warning("journal {} is not a regular file; ignored", path)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a living gateway owns it
            info = os.fstat(fd)
            if info.st_nlink == 0:
                continue  # already adopted (or compacted away) by another gateway since we opened it
            if info.st_uid != os.getuid():
                logger.warning("journal {} is owned by another user; ignored", path)
                continue
            with os.fdopen(os.dup(fd), "rb") as stream:
                bad = fold_lines(read_lines(stream), folded)
            adopted.append(_Adopted(path, fd, bad))
            keep = True
        finally:
            if not keep:
                os.close(fd)
    return folded, adopted


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
