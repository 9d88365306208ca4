"""The root's journal files for outcome look-ups: each file folded once, then only what was appended to it.

``wait_outcome`` of an id its gateway does not hold (before a start, after a stop, an id another
gateway on the root issued) and ``hermes-actors outcome --wait`` look ids up in the root's
journals again and again. Folding every file anew each time cost 35–57 ms a look-up on a 4 MB
journal, and a gateway answering such look-ups on a 6.4 MB one spent minutes of CPU re-reading
it. :class:`JournalIndex` keeps each file's folded state and where it was read to, and a
look-up reads only what was appended since: a journal that did not change costs one
``pread`` of a few bytes per file.

How a journal file changes (:mod:`hermes_actors.store.journal_file`): records are appended
after the last one, into zeros allocated ahead, so neither its size nor its mtime (at the
clock's granularity) tells that a record was added; compaction and the rewrite of a lost
file swap a new file in under the same name (another inode); a write that failed is cut back
and the next one written where it was. So the index keeps, per file, its identity (device,
inode), the offset after its last complete line and the bytes just before that offset, and
reads them back with the byte after them:

- another identity, the file shorter, or other bytes before the offset: the file was
  replaced or cut back, and is folded anew;
- the same bytes, then a zero byte or the end of the file: nothing was appended (a writer
  appends right after its last record, never past zeros: zeros between records are a power
  cut's, in a file no gateway writes any more, which was read whole the first time);
- the same bytes, then anything else: the complete lines appended are folded in.

A last line without its newline (a write under way, a killed gateway's torn last line) is
never folded into what is kept: its records are kept apart, folded into the answer for the id
asked only (into a copy of that id's state, as a fold of the whole file folds them), and the
line is read again at the next look-up. A write that fails is cut back
(:meth:`~hermes_actors.store.journal_file.JournalFile.cut_back`) and the next record written
where it was: a record a look-up saw there without its newline must not outlive it (folded for
good, its outcome would hide the real one: the first outcome wins). So an answer is what a fold
of every file gives at that moment. The files are opened and refused as :func:`open_journal` says, which is also
how :func:`hermes_actors.ops.journal_view.read_journals` reads them all.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO

from hermes_actors.store.journal_records import (
    DeliveryState,
    JournalFolded,
    fold_lines,
    fold_records,
    parse_lines,
    read_lines,
    state_records,
)
from hermes_actors.store.journal_screen import ADOPT, described, entry_at, journal_verdict
from hermes_actors.store.relay_dirfd import refusal_below
from hermes_actors.store.relay_protocol import JOURNAL, RELAY_DIR

__all__ = ["JournalIndex", "journal_dir", "journal_paths", "open_journal", "read_each_journal"]

# Bytes before a file's read offset kept to tell an append from a rewrite at the same place: a
# delivery id and more of the last line (a rewritten tail repeats them only if it is the same records).
_TAIL_BYTES = 4096


def journal_dir(root: str | Path) -> Path:
    """``<root>/bot_relay/journal``."""
    return Path(root).expanduser() / RELAY_DIR / JOURNAL


def journal_paths(root: str | Path) -> tuple[list[Path], list[str]]:
    """The journal files of ``root``, in name order (the order their records are folded in). Never raises.

    Args:
        root: the Hermes root.

    Returns:
        ``(paths, problems)``: the ``j-*.log`` paths (none when the directory is missing or
        refused, or ``bot_relay/`` above it is: a symlink, a file or another uid's), and the line saying why
        the directory was refused or could not be read.
    """
    directory = journal_dir(root)
    refusal = refusal_below(directory.parent.parent, directory.parent)  # bot_relay/ is never read through
    if refusal is not None:
        return [], [f"{directory} not read: {refusal}"]
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"cannot read {directory}: {exc.strerror or exc}"]
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return [], [f"refusing {directory}: not a directory of ours (a symlink, a file or another uid's)"]
    return sorted(directory.glob("j-*.log")), []


def open_journal(path: Path, problems: list[str]) -> int | None:
    """Open one journal file to read it, refusing what must not be followed. Never raises.

    What is not a regular file of ours is never opened, and is named as the durable start names it
    (:func:`~hermes_actors.store.journal_screen.described`: a symlink and another user's file refuse
    that start, a FIFO or a directory it moves into quarantine).

    Args:
        path: a ``j-*.log`` path of :func:`journal_paths`.
        problems: told (one line) why the file was refused or could not be opened.

    Returns:
        A read-only descriptor of a regular file of ours (the caller closes it), or None.
    """
    try:
        entry = entry_at(path)
        if entry is not None and entry.verdict != ADOPT:
            problems.append(described(entry))
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO never hangs it
    except OSError as exc:
        problems.append(f"cannot read {path}: {exc.strerror or exc}")
        return None
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        problems.append(f"cannot read {path}: {exc.strerror or exc}")
        return None
    if journal_verdict(info.st_mode, info.st_uid, os.getuid(), info.st_size) != ADOPT:  # changed since looked at
        os.close(fd)
        now = entry_at(path)
        problems.append(described(now) if now is not None and now.verdict != ADOPT
                        else f"refusing {path}: not a regular file of ours")
        return None
    return fd


def read_each_journal(root: str | Path, read: Callable[[Path, int], None]) -> list[str]:
    """Call ``read(path, fd)`` for each journal file of ``root`` in name order, refusing what :func:`journal_paths`
    and :func:`open_journal` refuse, and closing each descriptor after. Never raises but for ``read``'s own
    non-OSError errors.

    Args:
        root: the Hermes root.
        read: reads one opened file; an OSError it raises is told as that file's problem (it is skipped).

    Returns:
        One line per directory or file that was refused or could not be read.
    """
    paths, problems = journal_paths(root)
    for path in paths:
        fd = open_journal(path, problems)
        if fd is None:
            continue
        try:
            read(path, fd)
        except OSError as exc:
            problems.append(f"cannot read {path}: {exc.strerror or exc}")
        finally:
            os.close(fd)
    return problems


@dataclass
class _FileFold:
    """One journal file as far as it was folded."""

    identity: tuple[int, int]  # (st_dev, st_ino): a compacted or rewritten file is another inode
    offset: int = 0  # bytes of complete lines folded
    tail: bytes = b""  # the bytes just before ``offset`` (up to _TAIL_BYTES) as they were read
    folded: JournalFolded = field(default_factory=JournalFolded)  # the complete lines only
    # The records of the last line, read without its newline (a write under way or torn): never in ``folded``,
    # since it may yet be cut back and written over; read again at the next look-up while there is one.
    unterminated: list[dict[str, Any]] = field(default_factory=list)


class JournalIndex:
    """The folded journal files of one root, kept between look-ups and brought up to date by each.

    Thread-safe: ``wait_outcome`` may be called from several threads at once. It holds what a
    fold of the root's journals holds (the journal keeps at most ``compact_after`` lines per
    gateway), for as long as its owner (a Gateway, one ``outcome`` command) keeps it.
    """

    def __init__(self) -> None:
        self._files: dict[Path, _FileFold] = {}  # in name order, as the files are folded
        self._lock = threading.Lock()

    def state(self, root: str | Path, delivery_id: str) -> tuple[DeliveryState | None, list[str]]:
        """What the root's journals know of ``delivery_id`` now, as a fold of all their records would say.

        Args:
            root: the Hermes root.
            delivery_id: a delivery id.

        Returns:
            ``(state, problems)``: its state (None when no journal names it; a new object, whose
            ``delivery`` and ``outcome`` dicts are the index's: copy them to change them), and one
            line per file or directory that was refused or could not be read.
        """
        with self._lock:
            problems = self._refresh(root)
            found = [_with_unterminated(entry, delivery_id) for entry in self._files.values()]
            records = chain.from_iterable(state_records(delivery_id, s) for s in found if s is not None)
            # folded again from its records even when one file names it: the caller gets its own object
            return fold_records(records).states.get(delivery_id), problems

    def _refresh(self, root: str | Path) -> list[str]:
        """Bring every journal file of ``root`` up to date (under the lock); the problems found."""
        files: dict[Path, _FileFold] = {}

        def bring_up_to_date(path: Path, fd: int) -> None:  # one that cannot be read is read from the start next time
            files[path] = _brought_up_to_date(fd, self._files.get(path))

        problems = read_each_journal(root, bring_up_to_date)
        self._files = files  # a file gone (adopted, removed) is forgotten
        return problems


def _brought_up_to_date(fd: int, entry: _FileFold | None) -> _FileFold:
    """``entry`` with what was appended to the file ``fd`` since folded in, or the file folded anew.

    Args:
        fd: the journal file, open to read.
        entry: how far it was folded before (None: never).

    Returns:
        The file's entry, up to its last complete line.

    Raises:
        OSError: the file could not be read.
    """
    info = os.fstat(fd)
    identity = (info.st_dev, info.st_ino)
    if entry is None or entry.identity != identity or info.st_size < entry.offset:
        entry = _FileFold(identity)
    else:
        start = entry.offset - len(entry.tail)
        seen = os.pread(fd, len(entry.tail) + 1, start)
        if not seen.startswith(entry.tail):  # rewritten where we had read: a cut-back batch, or another file
            entry = _FileFold(identity)
        elif not entry.unterminated and seen[len(entry.tail):] in (b"", b"\0"):
            # the end, or the zeros allocated ahead: nothing appended. A last line read without its newline is
            # read again instead: a zero there may be its write cut back (JournalFile.cut_back), and it must go.
            return entry
    with os.fdopen(os.dup(fd), "rb") as stream:
        stream.seek(entry.offset)
        fold_lines(_complete_lines(stream, fd, entry), entry.folded)
    entry.tail = os.pread(fd, min(entry.offset, _TAIL_BYTES), max(entry.offset - _TAIL_BYTES, 0))
    return entry


def _complete_lines(stream: BinaryIO, fd: int, entry: _FileFold) -> Iterator[bytes | None]:
    """The complete lines of ``stream`` from where it stands (:func:`read_lines`); ``entry.offset`` moves past each.

    The last line may have no newline: the zeros after the last record, a record still being
    written, or a killed gateway's last one. It is not yielded (what is folded is kept, and that
    line may yet be cut back and written over): its records go to ``entry.unterminated``, for
    :func:`_with_unterminated` to fold into an answer as a fold of the whole file folds them
    (a record there counts), and the offset stays before it, so it is read again next time.
    """
    entry.unterminated = []
    for line in read_lines(stream):
        end = stream.tell()
        # an over-long line (None) was skipped up to its newline, or to the end of the file
        complete = line.endswith(b"\n") if line is not None else os.pread(fd, 1, end - 1) == b"\n"
        if not complete:  # only the last line can lack its newline (a read stops short only at the end)
            entry.unterminated = [record for record in parse_lines((line,)) if record is not None]
            return
        yield line
        entry.offset = end  # past a line the caller folded (it asks for the next one once it has)


def _with_unterminated(entry: _FileFold, delivery_id: str) -> DeliveryState | None:
    """What a fold of the whole file ``entry`` says of ``delivery_id``: its last line without a newline counted too.

    Args:
        entry: one journal file as far as it was folded, with its unterminated last line's records.
        delivery_id: the delivery looked up.

    Returns:
        The file's state of it (the kept object when that line does not name it, else a new one: what
        is kept never holds that line, which may yet be cut back), or None when the file does not name it.
    """
    state = entry.folded.states.get(delivery_id)
    records = [record for record in entry.unterminated if record["id"] == delivery_id]
    if not records:
        return state
    # a copy of that one id's state, so a "started" with "via" is dropped or applied as in the whole file's fold;
    # shallow is enough: a fold assigns a state's dicts, it never changes them in place
    alone = JournalFolded(states={} if state is None else {delivery_id: dataclasses.replace(state)})
    return fold_records(records, alone).states.get(delivery_id)
