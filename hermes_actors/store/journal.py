"""The durable delivery journal, with group commit.

Layout: ``<root>/bot_relay/journal/j-<uuid>.log``, one file per gateway process, allocated
ahead (:mod:`~hermes_actors.store.journal_file`), one record a line
(:mod:`~hermes_actors.store.journal_records`): ``accepted`` durable before the ack returns,
``started`` before the turn runs, ``finished`` before the outcome is published, ``delivered``
(lazy) once the outcome reached the sender. At start a gateway adopts the journals of dead
gateways on the same root (:mod:`~hermes_actors.store.journal_adoption`), and while it runs those
with something unfinished of gateways that stopped or died since (:meth:`Journal.adopt_dead`).

Group commit: writers enqueue records; one commit writes everything queued,
calls ``fdatasync`` once, then wakes every waiter of that batch. So N
concurrent DMs share one sync instead of paying N. One commit runs at a time
(the *write turn*). The writer thread takes the turn for records nobody waits
on; a caller that waits for its record (``append_durably``) takes the turn
itself as soon as it is free and commits on its own thread (its record and
every one queued with it), so it pays no hand-off to the writer and back.
Callers that arrive during a commit queue behind it and share the next one.
The writer thread is woken only for work of its own, never by a caller's commit.

The main thread never commits: a signal handler runs there, between any two calls,
and its exception (a KeyboardInterrupt) would land inside the commit, where the file's
descriptors, the live state and the write turn are everyone's. Its records go to the
writer thread (or to a waiting caller's commit), and it waits on a lock of its own
(:meth:`CommitBatch.add_waiter`), so an interrupt leaves nothing held for anyone else:
its exception goes to it alone, and a record a commit took lands or fails as its batch
does (:meth:`Journal.append_durably`, ``on_interrupt``). A send from a signal handler that
interrupted the main thread inside the journal would wait on a lock its own frame holds:
it is refused at once instead.

Who still calls on the main thread: while a gateway runs, the main thread's calls run on
its call thread (``facade/off_main.py``), which is closed the moment the main thread's
``stop()`` is handed to it; until that stop begins the gateway still runs, and a signal
handler's ``message_agent`` meanwhile runs on the main thread itself and journals its DM's
acceptance here (test_journal.py, ``test_a_handlers_send_as_the_main_threads_stop_is_handed_over_…``).
Nothing else appends on the main thread (the start, the turns, the Dispatcher and the stop
run on threads of their own); the rule stays for that caller and for direct users.

A record is either on disk and confirmed, or refused and absent, never both: a
failed write or sync is truncated back and fails its whole batch, and a caller
that no commit took within its timeout withdraws its record before it is told.

A *lazy* record (``delivered``) waits for nobody: it is written at once (so a
killed process loses nothing the kernel has; by the appending thread itself when
no commit runs) but a batch of lazy records only is not flushed on its own; the
next flushed batch, or ``stop``, carries it to stable storage. Losing one to a
power cut costs a repeated outcome at restart, which recovery already handles.
The flush it saves used to sit in front of the next DM's ``accepted`` record.

A file no longer reachable at its path (its directory deleted or moved aside, the
file removed) would take every later record where no start finds it. Each commit
checks, before its waiters are told (:meth:`Journal._check_home`): the link counts
of the file and its directory always, the path itself with each ``fdatasync``,
and everything again at stop. A lost file is rewritten at once with the live state
into a fresh file in the journal directory (recreated through the same no-symlink
walk); when that directory cannot be used (a symlink in its place) the journal is
*homeless*: it refuses new acceptances (nothing is acked that a restart could not
find), the commit that found it out included (its batch is cut back out of the file
and refused, as a failed write is), goes on writing the rest where it was (its live
state stays whole), tries again at each commit, and :meth:`Journal.keeps` tells the
stop that queued DMs must be settled ``cancelled`` instead of left journaled.

A check of the path that cannot be made (out of file descriptors, say) is no sign that the
file moved: while the journal runs it is taken as where it was. At stop it is tried again
for up to :attr:`Journal.stop_check_seconds`; one that still cannot be made is taken as a
journal that is gone (the queued DMs are settled ``cancelled`` and their senders told):
a DM kept in a file no start may read would be lost without a word.

A full disk fails the same write again and again (each commit's append, and a running
adoption's at each rescan; on a nearly full disk, which still takes appends, each compaction's
whole new file): each kind is said once per spell (:class:`FailureSpell`; an adoption's write
shares the appends' spell), and a failed compaction is tried
again only once the file grew by another ``compact_after`` lines, or once a failed
write's spell ended (space came back), never at every commit.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from loguru import logger

from hermes_actors.core.backoff import doubling
from hermes_actors.core.spell import Spell
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.store.journal_adoption import (
    DeadJournals,
    FileIdentity,
    FileMark,
    adopt_dead_journals,
    lock_dead_journals,
    take_over_dead_journals,
)
from hermes_actors.store.journal_batch import BatchListener, CommitBatch, DurableCallback
from hermes_actors.store.journal_file import JournalFile
from hermes_actors.store.journal_records import COMPACT_AFTER_BYTES, JournalFolded, encode_record
from hermes_actors.store.journal_screen import screen_journal_files
from hermes_actors.store.journal_state import KEEP_DELIVERED, JournalState
from hermes_actors.store.os_errors import advised, store_error
from hermes_actors.store.private_dir import ensure_private_dir

__all__ = ["Journal", "StartRecorder", "check_pauses"]


def check_pauses(seconds: float, *, first: float = 0.05, most: float = 0.5) -> tuple[float, ...]:
    """Pure: the pauses between the tries of a check that cannot be made, within ``seconds`` in all.

    Each pause doubles from ``first`` up to ``most``; the last one is cut to what is left.

    Args:
        seconds: how long the tries may take in all (0 or less: no second try).
        first: the first pause.
        most: the longest pause.

    Returns:
        The pauses, in order; their sum is ``seconds`` (none when ``seconds <= 0``).
    """
    pauses: list[float] = []
    left, backoff = seconds, doubling(first, most)
    while left > 1e-9:
        pauses.append(min(next(backoff), left))
        left -= pauses[-1]
    return tuple(pauses)


class StartRecorder(Protocol):
    """What a turn needs to record its start durably before it runs: a :class:`Journal`, or the
    relay's ``TurnStartMarks`` for a turn that arrived through the file relay."""

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None: ...


class FailureSpell:
    """One kind of journal write failing again and again (a full disk), said once per spell.

    A full disk fails the same write at each try (hundreds a second while DMs flow): the spell's first
    failure is said at ERROR (naming the file and what to do), each later one at DEBUG only, and the first
    try that lands again says the spell's end once at INFO; the next failure begins a new spell. The
    journal's appends (a running adoption's write included) and its compactions each have one. Used under the
    write turn only.
    """

    def __init__(self) -> None:
        self.spell = Spell()  # the rule (:class:`~hermes_actors.core.spell.Spell`, said at the first failure)

    def failed(self, first: str, later: str, *args: Any) -> None:
        """Count one failure and say it: ``first`` at ERROR for the spell's first, ``later`` at DEBUG after.

        Args:
            first: the loguru format of the spell's first failure (the file and what to do).
            later: the format of each later one.
            *args: the values of either format.
        """
        self.spell, say = self.spell.failed()
        said = logger.opt(depth=1)  # the line is the caller's
        if say:
            said.error(first, *args)
        else:
            said.debug(later, *args)

    def landed(self, end: str, *args: Any) -> bool:
        """A try landed: after failed ones, the spell's end is said once at INFO.

        Args:
            end: the loguru format of the end; its last ``{}`` is the spell's count of failures.
            *args: the values of its other fields.

        Returns:
            Whether a spell of failures ended here.
        """
        self.spell, failures = self.spell.landed()
        if not failures:
            return False
        logger.opt(depth=1).info(end, *args, failures)
        return True


class Journal:
    """This gateway's journal file, written with group commit.

    Args:
        directory: ``<root>/bot_relay/journal``.
        fsync: call ``os.fdatasync`` per batch (tests of speed may turn it off).
        within: the Hermes root ``directory`` must stay under: a ``bot_relay/`` swapped for a
            symlink is then refused at start, and nothing is created through it.

    Use ``start()`` / ``stop()`` or ``with``.
    """

    stop_wait = 10.0  # seconds ``stop`` waits for the writer thread, then again for a running commit
    # seconds a stop (``keeps``) tries again a check of our path that cannot be made (out of file descriptors)
    stop_check_seconds = 2.0

    def __init__(self, directory: Path, *, fsync: bool = True, within: Path | None = None) -> None:
        self.directory = directory
        self.within = within
        self.path = directory / f"j-{uuid.uuid4().hex}.log"
        self._file = JournalFile(self.path, fsync=fsync, within=within)
        lock = threading.RLock()  # guards the open batch (what is queued) and the write turn
        # The main thread takes it bare (``with self._lock``): entering a bare lock is one C call that an
        # interrupt cannot split, where ``Condition.__enter__`` is Python code it can leave holding the lock.
        self._lock = lock
        self._cond = threading.Condition(lock)  # a commit ended (callers, ``stop`` and ``drain`` wait on it)
        self._work = threading.Condition(lock)  # the writer thread waits on it, for work of its own only
        # Owned by whoever holds the write turn (``_writing``): the writer thread or a leading caller.
        self._state = JournalState()
        self._lines_in_file = 0
        self._batch = CommitBatch()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._writing = False  # a commit holds the write turn (guarded by ``_cond``)
        self._compact_due = False  # a leading caller's commit grew the file past ``compact_after``
        self._close_after_commit = False  # ``stop`` gave up waiting for a commit: it closes the file
        self._closed = False  # the file is closing or closed: whoever set this holds the turn for good
        # Our file is unreachable at its path and no fresh one could be made (see the module docstring).
        # Set under the write turn, read under ``_cond``.
        self._homeless = False
        self._recheck_due = False  # an acceptance was refused while homeless: the writer thread tries again
        # Commits whose write failed since one last landed, and compactions likewise (a full disk, or one
        # nearly full: appends fit, a whole new file does not), each said once per spell. Under the write turn.
        self._writes_failing = FailureSpell()
        self._compactions_failing = FailureSpell()
        # Checks of our path that could not be made (out of file descriptors, say), said once per spell.
        self._checks_failing = FailureSpell()
        self._compact_failed_at: int | None = None  # our file's lines when a compaction last failed (the back-off)
        self._whole_end = 0  # bytes of records in our file when it was last written whole (made, compacted)
        self._compact_failed_end: int | None = None  # ... and when a compaction last failed (the back-off in bytes)
        # Touched by the start's adoption, then by adopt_dead alone (the relay's thread), never concurrently:
        self._settled_files: dict[str, FileMark] = {}  # dead gateways' files found settled (see adopt_dead)
        self._unretired_files: dict[str, FileIdentity] = {}  # adopted files that could not be retired (ditto)
        self._held_files: list[int] = []  # their descriptors: flocked by us until we stop, so nobody adopts them
        # What the start moved into quarantine instead of adopting (a FIFO in place of a journal file), one line
        # each: wait_outcome's KeyError names them
        self.set_aside: list[str] = []
        self.records = 0
        self.listener: BatchListener | None = None  # told of each durable batch's tokens
        self.compactions = 0

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> JournalFolded:
        """Screen the journal directory, open our file, adopt dead gateways' journals, start the writer.

        The screen (:func:`~hermes_actors.store.journal_screen.screen_journal_files`) comes before our file
        is made: a journal file that may hold acked DMs and cannot be read safely (a symlink, another user's
        file) refuses the start with nothing changed; what cannot hold records (a FIFO, a directory) is moved
        into quarantine, never opened, and named in :attr:`set_aside`.

        Returns:
            The adopted state (what recovery must act on).

        Raises:
            StoreError: the directory or file cannot be used.
            HostileFileError: a ``j-*.log`` that is a symlink or a regular file of another user; the text names
                each and what to do.
        """
        ensure_private_dir(self.directory, within=self.within)
        try:
            self.set_aside = screen_journal_files(self.directory, within=self.within)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise store_error("list the delivery journal directory", self.directory, exc) from exc
        self._file.open()
        try:
            with self._cond:  # adoption writes to our file: no caller may commit meanwhile
                self._writing = True
            try:
                adopted = self._adopt()
                self._whole_end = self._file.end  # made whole now: the adopted records and nothing else
            except OSError as exc:  # writing the adopted records to our file: a full disk names no file by itself
                if isinstance(exc, StoreError):
                    raise
                raise store_error("write the adopted journals into", self.path, exc) from exc
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()  # a caller that queued meanwhile waits for the turn
            self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
            self._thread.start()
        except BaseException:  # a failed start ends the journal: nothing of it stays open
            self._thread = None
            self._release_files()
            raise
        return adopted

    def _adopt(self) -> JournalFolded:
        """Take over dead gateways' journals (see :func:`adopt_dead_journals`); their folded state."""
        return adopt_dead_journals(self.directory, self.path, self._state, self._write_now,
                                   keep=self.keep_delivered, within=self.within, unretired=self._unretired_files,
                                   held=self._held_files)

    def adopt_dead(self, timeout: float = 10.0) -> JournalFolded | None:
        """While running: adopt the journals of gateways on our root that stopped or died, as :meth:`start` does.

        Only a file with something unfinished in it is adopted (see
        :func:`~hermes_actors.store.journal_adoption.lock_dead_journals`). The dead files are read and
        folded without the write turn (flocked by us, nobody writes them: DMs are acked meanwhile); the
        turn is taken to write the adopted records into our file, synced (and our file checked to be where
        a start finds it) before the old files go, so a kill at any point leaves each record in one file a
        start adopts. A file adopted that could not be retired is never adopted again by this run. Called
        by the relay at its rescans (never on the main thread: see the module docstring).

        Args:
            timeout: seconds to wait for a running commit; past it nothing is adopted (the next call tries).

        Returns:
            The adopted state (``files`` naming the files), or None when nothing was adopted: no such
            file, the journal stopping or homeless, or our file could not take the records (said once
            per spell of failures; the old files stay for the next try).

        Raises:
            OSError: a dead file could not be read (nothing adopted; the next call tries again).
        """
        if not self._may_adopt():
            return None
        dead = lock_dead_journals(self.directory, self.path, unchanged=self._settled_files,
                                  unretired=self._unretired_files)
        try:
            if not dead.files:
                return None
            with self._cond:
                free = self._cond.wait_for(lambda: not self._writing or self._closed, timeout=max(0.0, timeout))
                if not free or not self._may_adopt():
                    return None  # the files stay, unlocked again, for the next try (or the next start)
                self._writing = True
            try:
                folded = self._adopt_running(dead)
            finally:
                with self._cond:
                    self._give_turn_back()
        finally:
            dead.release()
        return folded if folded is not None and folded.files else None

    def _may_adopt(self) -> bool:
        """Whether a running adoption may go on: the journal neither stopping, closed nor homeless."""
        with self._cond:
            return not (self._closed or self._stopping or self._homeless)

    def _adopt_running(self, dead: DeadJournals) -> JournalFolded | None:
        """:meth:`adopt_dead`'s write under the write turn; after a failed write our state and file are as before."""
        before, lines_before, saved = self._file.end, self._lines_in_file, self._state.snapshot()
        written = False

        def write_kept(lines: list[bytes]) -> None:
            nonlocal written
            self._write_now(lines)
            if not self._check_home(walk=True):  # in a lost file no start would find them: keep the old files
                raise self._homeless_error()
            written = True
            if self._said_landed():
                self._space_came_back()  # (see _commit)

        try:
            return take_over_dead_journals(dead, self._state, write_kept, keep=self.keep_delivered,
                                           within=self.within, unretired=self._unretired_files,
                                           held=self._held_files)
        except (OSError, HostileFileError) as exc:  # StoreError included
            if written:  # the records are ours now (an old file may be gone): kept, acted on by the next start
                logger.error("adopting the journal(s) of a gateway on this root that stopped or was killed failed "
                             "after their records were written into {}: {}; the next start on the root acts on "
                             "them", self.path, exc)
                return None
            self._state.restore(saved)
            try:
                self._file.cut_back(before)
                self._lines_in_file = lines_before
            except OSError as cut:
                logger.error("could not cut a failed adoption back out of the delivery journal {}: {}",
                             self.path, cut)
            # A full disk fails it at every rescan: said once per spell, with the commits' failed writes
            self._writes_failing.failed(
                "could not adopt the journal(s) of a gateway on this root that stopped or was killed into {}: {}. "
                "They stay where they are; the next rescan (or start) tries again; the failed writes that follow "
                "are logged at DEBUG until one lands",
                "could not adopt the journal(s) of a gateway on this root that stopped or was killed into {}: {}",
                self.path, exc)
            return None

    def stop(self) -> None:
        """Flush what is queued, stop the writer, close (and remove an empty) file."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._work.notify()
        if self._thread is not None:
            self._thread.join(timeout=self.stop_wait)
        with self._cond:
            # What was queued before the stop is committed first (by the writer, or by the caller that
            # leads its batch); a running commit ends first.
            self._cond.wait_for(lambda: not (self._writing or self._batch.items), timeout=self.stop_wait)
            if self._writing:
                # Closing now could hand its descriptor number to another file mid-write: the commit
                # closes the file when it ends instead.
                logger.error("a journal commit is still running after {}s; the file closes when it ends",
                             2 * self.stop_wait)
                self._close_after_commit = True
                return
            # The turn, for good: no commit may start on a closing file. A record still queued now
            # (nothing took it in time) is refused to its caller, never written.
            self._writing = self._closed = True
            self._work.notify()  # a writer thread still waiting exits
        if self._file.fd is not None and not self._check_home(walk=True):
            self._report_unkept()
        self._release_files()

    def _release_files(self) -> None:
        """Close our file and the descriptors of the adopted files we could not retire, on every path that ends
        the journal (its stop; the commit or writer thread a stop left to close it; a failed start).

        The held files' flocks go with their descriptors: the next start adopts them again, and folds them with
        our file's outcomes.
        """
        self._file.close()
        held, self._held_files = self._held_files, []
        for fd in held:
            os.close(fd)

    def keeps(self, timeout: float = 10.0) -> bool:
        """Whether what is journaled now is kept for the next start: asked by a stopping gateway.

        Takes the write turn and checks the file's path in full (a lost file is rewritten
        into a fresh one, see :meth:`_check_home`). False: our file is unreachable and no
        fresh one could be made, so a DM left journaled would be lost: the stop settles
        the queued DMs as ``cancelled`` instead (as without a journal). A check that cannot
        be made (out of file descriptors, say) is tried again for up to
        :attr:`stop_check_seconds`; still not made, it is False too (said at ERROR, with why):
        nothing tells that a start would find the file.

        Args:
            timeout: seconds to wait for a running commit; past it the last known answer.

        Returns:
            True when the next start on our root will find our records.
        """
        with self._cond:
            free = self._cond.wait_for(lambda: not self._writing or self._closed, timeout=max(0.0, timeout))
            if not free or self._closed:
                return not self._homeless
            self._writing = True
        try:
            return self._check_home(walk=True, retry_for=self.stop_check_seconds)
        finally:
            with self._cond:
                self._give_turn_back()

    def _report_unkept(self) -> None:
        """Say which DMs a stop with an unreachable file could not keep (the file closes where it is)."""
        live = self._state.folded.states
        unsettled = sorted(key for key, state in live.items() if state.outcome is None)
        if unsettled:  # the directory went between the stop's ``keeps`` and now: said, id by id
            logger.error(
                "the delivery journal {} is unreachable at stop and no fresh file could be made: it is closed "
                "where it is, and a restart will not find it. {} acked DM(s) without an outcome are NOT kept: {}. "
                "Restore bot_relay/journal/ as a directory of ours", self.path, len(unsettled), ", ".join(unsettled))
            return
        logger.error(
            "the delivery journal {} is unreachable at stop and no fresh file could be made: it is closed where it "
            "is. Every DM it held has its outcome, but a restart will not find the outcomes kept for wait_outcome. "
            "Restore bot_relay/journal/ as a directory of ours", self.path)

    def drain(self, timeout: float) -> bool:
        """Wait until every record appended so far is written and its listener told.

        A stopping gateway calls it before its last asks to the Dispatcher: the outcomes of
        the last commits are then published (and notified) before the stop returns, not only
        re-delivered by the next start.

        Args:
            timeout: seconds to wait at most.

        Returns:
            True when nothing was queued or being committed any more within ``timeout``.
        """
        with self._cond:
            return self._cond.wait_for(lambda: not (self._batch.items or self._writing), timeout=max(0.0, timeout))

    @property
    def running(self) -> bool:
        """Whether records are accepted (started, and ``stop`` has not begun)."""
        return self._file.fd is not None and not self._stopping

    @property
    def fsync_enabled(self) -> bool:
        """Whether a flushed batch is ``fdatasync``-ed (tests of speed may turn it off)."""
        return self._file.fsync_enabled

    @property
    def fsyncs(self) -> int:
        """How many ``fdatasync`` calls our file had so far."""
        return self._file.fsyncs

    def __enter__(self) -> Journal:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ── appending ───────────────────────────────────────────────────────────

    def append(
        self, record: dict[str, Any], callback: DurableCallback | None = None, *, token: Any = None,
        lazy: bool = False,
    ) -> CommitBatch:
        """Queue ``record``; the returned batch's ``done`` is set once it is durable.

        Args:
            record: a journal record (see :mod:`~hermes_actors.store.journal_records`).
            callback: called on the committing thread after the batch is durable
                (with None) or failed (with the error). Must not block.
            token: handed, with every other token of the same batch, to ``listener``
                in ONE call once the batch is durable — one message per group commit
                instead of one per record.
            lazy: nobody waits for it to be flushed (see the module docstring): it
                does not make its batch flush. With no commit running, the caller
                writes it (and whatever lazy records are queued) at once, without a
                sync and without waking the writer thread. With ``callback`` or
                ``token`` it is not lazy.

        Raises:
            StoreError: the journal is stopped, or (a lazy record written at once) the
                write failed; the record is then not in the file.
        """
        line = encode_record(record)
        flush = not lazy or callback is not None or token is not None
        with self._cond:
            batch = self._enqueue(record, line, flush=flush)
            if callback is not None:
                batch.callbacks.append(callback)
            if token is not None:
                batch.tokens.append(token)
            if batch.flush or self._writing or self._compact_due or not _may_commit():
                # The writer takes it, unless a waiting caller will: a running commit hands the turn
                # on as it ends, so the writer is woken now only if the turn is free. The main thread
                # never writes itself (see the module docstring).
                if not self._writing and self._writer_due():
                    self._work.notify()
                return batch
            # Only lazy records are queued and the turn is free: a write of a few hundred bytes
            # without a sync costs this thread less than waking the writer thread, which would
            # then compete with the next DM for the GIL.
            self._take_turn()
        self._commit(batch, compact=False)
        batch.raise_error()
        return batch

    def append_together(self, records: list[dict[str, Any]], *, token: Any = None) -> CommitBatch:
        """Queue ``records`` in one batch: they land together or fail together (``token`` tells which).

        :meth:`append` twice is not that: a commit may take the open batch between the two
        calls, and the second record could land while the first failed (a ``delivered``
        without its ``finished``: an outcome a restart does not know).

        Args:
            records: journal records, written in this order.
            token: handed to ``listener`` with the batch's other tokens once it is durable (or failed);
                None: nobody is told (the caller waits on the batch's ``done``).

        Returns:
            The batch (its ``done`` is set once it is durable).

        Raises:
            StoreError: the journal is stopped (nothing was queued), or refused one of the records
                (homeless: an acceptance; the ones before it stay queued, as :meth:`append` leaves them).
        """
        lines = [encode_record(record) for record in records]
        with self._cond:
            for record, line in zip(records, lines, strict=True):
                batch = self._enqueue(record, line, flush=True)
            if token is not None:
                batch.tokens.append(token)
            if not self._writing and self._writer_due():
                self._work.notify()
            return batch

    def _enqueue(self, record: dict[str, Any], line: bytes, *, flush: bool) -> CommitBatch:
        """Queue one record in the open batch (the caller holds ``_cond``); the batch.

        Raises:
            StoreError: the journal is stopped.
        """
        if self._stopping or self._file.fd is None:
            raise StoreError(0, "the delivery journal is not running")
        if self._homeless and record.get("t") == "accepted":
            # Acked, it would be a DM a restart cannot find: refused, and the writer thread looks again.
            self._recheck_due = True
            if not self._writing:
                self._work.notify()
            raise self._homeless_error()
        self._batch.add(record, line, flush=flush)
        return self._batch

    def _homeless_error(self) -> StoreError:
        """The refusal of an acceptance while the journal is homeless (see the module docstring)."""
        return StoreError(errno.ENOENT, f"the delivery journal {self.path} is no longer reachable at its path "
                                        "and no fresh file could be made there (see the log)")

    def append_durably(
        self, record: dict[str, Any], timeout: float = 30.0, *, on_interrupt: DurableCallback | None = None,
    ) -> None:
        """Append and wait until the record is on disk.

        With no commit running, the caller commits the queued batch itself (its own
        record and any queued before it); otherwise it waits for the next commit. The
        main thread never commits (see the module docstring): it waits for the writer
        thread's commit, or a waiting caller's.

        Args:
            record: a journal record (see :mod:`~hermes_actors.store.journal_records`).
            timeout: seconds to wait for a commit to take the record; then it is withdrawn,
                never written. Once a commit holds it (the caller's own, or another
                thread's), its end is waited for: the record lands or is refused, never
                both.
            on_interrupt: (the main thread) called once with the record's fate when an
                exception of the caller's own (a signal handler's KeyboardInterrupt) ends the
                wait: the record stays queued, so ``None`` once it landed, the error when its
                batch failed. Called on the committing thread (it must not block), or at once
                when the batch already ended.

        Raises:
            StoreError: the journal is stopped, the write or fsync failed (ENOSPC,
                EIO ...; the record is not in the file), no commit took the record in time,
                or (the main thread) a signal handler called it while its thread was inside
                the journal.
        """
        line = encode_record(record)
        deadline = time.monotonic() + timeout
        if not _may_commit():
            self._append_from_main_thread(record, line, deadline, timeout, on_interrupt)
            return
        with self._cond:
            batch = self._enqueue(record, line, flush=True)
            lead = None
            if not batch.leader:
                # The batch's first waiting caller commits it: it waits for the turn, not for the writer
                # thread, so when the running commit ends it commits at once on its own thread (one
                # wake-up) instead of the writer committing and then waking it (two). A due compaction is
                # the writer thread's (it keeps the file bounded) and takes the queued batch along.
                batch.leader = True
                try:
                    while batch is self._batch and (self._writing or self._compact_due):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                except BaseException:  # interrupted: a batch whose leader is gone is the writer thread's again
                    batch.leader = False
                    if batch is self._batch and not self._writing and self._writer_due():
                        self._work.notify()
                    raise
                batch.leader = False
                if batch is self._batch:
                    if self._writing or self._compact_due:
                        self._withdraw(record)
                        raise StoreError(0, f"the delivery journal did not confirm a write within {timeout}s")
                    lead = self._take_turn()
        if lead is not None:
            self._commit(lead, compact=False)
        elif not batch.done.wait(max(0.0, deadline - time.monotonic())):
            with self._cond:
                if batch is self._batch:
                    self._withdraw(record)
                    raise StoreError(0, f"the delivery journal did not confirm a write within {timeout}s")
        batch.done.wait()  # a commit holds the record: it lands or fails, and the caller is told which
        batch.raise_error()

    def _append_from_main_thread(
        self, record: dict[str, Any], line: bytes, deadline: float, timeout: float,
        on_interrupt: DurableCallback | None,
    ) -> None:
        """:meth:`append_durably` on the main thread: queue, leave the commit to another thread, wait.

        Its one gateway caller: a signal handler's ``message_agent`` between the main thread's ``stop()``
        closing the gateway's call thread and that stop's beginning (see the module docstring).

        Raises:
            StoreError: as :meth:`append_durably`.
        """
        if _held_here(self._lock):
            # A signal handler interrupted this thread inside the journal: the commit it would wait for
            # needs the lock its own interrupted frame holds, so it would wait out its whole timeout.
            # (A gateway's sends meet facade/sends.SendsInFlight's refusal first: this is the journal's own.)
            raise StoreError(0, "refused: a signal handler sent while its thread was inside the delivery journal "
                                f"{self.path} (it would wait on itself); nothing was queued. Send from outside "
                                "the handler (e.g. set a flag there and send from your main loop)")
        with self._lock:
            batch = self._enqueue(record, line, flush=True)
            waiter = batch.add_waiter()
            if not self._writing and self._writer_due():
                self._work.notify()
        withdrawn = False
        try:
            if not waiter.acquire(timeout=max(0.0, deadline - time.monotonic())):
                with self._lock:
                    if batch is self._batch:
                        self._withdraw(record)
                        withdrawn = True
                if not withdrawn:
                    waiter.acquire()  # a commit holds the record: it lands or fails, and the caller is told which
        except BaseException:
            # The interrupt is the caller's alone: the record stays where it is, and lands or fails with its batch.
            if on_interrupt is not None:
                self._tell_fate(batch, record, on_interrupt)
            raise
        if withdrawn:
            raise StoreError(0, f"the delivery journal did not confirm a write within {timeout}s")
        batch.raise_error()

    def _tell_fate(self, batch: CommitBatch, record: dict[str, Any], callback: DurableCallback) -> None:
        """Have ``callback`` told whether ``record`` (queued in ``batch``) landed: by its commit, or at once.

        Args:
            batch: the batch ``record`` was queued in.
            record: the very record object.
            callback: called once: None when it landed, the error when it did not (or was withdrawn).
        """
        with self._lock:  # a commit marks its batch done under the lock: the check and the append are one step
            held = any(queued is record for queued, _ in batch.items)
            ended = batch.done.is_set()
            if held and not ended:
                batch.callbacks.append(callback)
                return
        batch.call(callback, batch.error if held else StoreError(0, "the record was withdrawn, never written"))

    def _withdraw(self, record: dict[str, Any]) -> None:
        """Take ``record`` back out of the open batch (the caller holds ``_cond``): no commit took it in time.

        A caller that gives up waiting must not have its record written later: its sender is
        told the DM was NOT queued, and a record landing afterwards would be re-offered by
        the next start. What else the batch holds goes to the writer thread.
        """
        self._batch.withdraw(record)
        if self._writer_due():
            self._work.notify()

    def _give_turn_back(self) -> None:
        """Give the write turn back after work of our own under it (the caller holds ``_cond``): a caller queued
        meanwhile may take it, and the writer thread is woken when it has work."""
        self._writing = False
        self._cond.notify_all()
        if self._writer_due():
            self._work.notify()

    def _take_turn(self) -> CommitBatch:
        """Take the write turn and the open batch, everything queued (the caller holds ``_cond``)."""
        self._writing = True
        batch, self._batch = self._batch, CommitBatch()
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._writing or not self._writer_due()):
                    self._work.wait()
                if self._closed:  # ``stop`` holds the turn and closes the file
                    return
                if self._stopping and not self._batch.items:
                    # ``stop`` gave up on a commit (and returned): close the file once it ended, under the turn.
                    close = self._close_after_commit
                    if close:
                        self._writing = self._closed = True
                    break
                self._recheck_due = False  # the commit below checks the file (an empty batch: that only)
                batch = self._take_turn()
            try:
                self._commit(batch, compact=True)
            except BaseException:  # its waiters were told and the turn given back; the main thread's DMs need us
                logger.opt(exception=True).error("the journal writer's commit raised; it goes on writing")
        if close:
            self._release_files()

    def _writer_due(self) -> bool:
        """Whether the writer thread has work (the caller holds ``_cond``): not a batch a waiting
        caller will commit itself."""
        return ((bool(self._batch.items) and not self._batch.leader) or self._compact_due or self._recheck_due
                or self._stopping)

    def _commit(self, batch: CommitBatch, *, compact: bool) -> None:
        """Write and sync one batch under the write turn, wake its waiters, then give the turn back.

        Args:
            batch: its records (none: a compaction only), waiters, callbacks and tokens.
            compact: compact here if the file grew too long (the writer thread); a leading
                caller leaves that to the writer thread instead of making its sender wait.
        """
        items = batch.items
        lines = [line for _, line in items]
        before = self._file.end
        # An interrupt of the committing thread (or a bug) is re-raised to it once the commit ended as any
        # other does (waiters told, turn given back): it must not leave the journal half-way for the others.
        interrupt: BaseException | None = None
        try:
            try:
                if items:
                    self._write_now(lines, flush=batch.flush)
                    if self._said_landed():
                        self._space_came_back()
            except OSError as exc:
                batch.error = exc
                self._said_failed(len(items), exc)
            except BaseException as exc:  # a bug or an interrupt: its waiters must not think it landed
                batch.error = exc
                logger.opt(exception=exc).error("journal write failed for {} record(s)", len(items))
                if not isinstance(exc, Exception):
                    interrupt = exc
            # Before the waiters are told: records in a file no start finds are not durable. The path is
            # walked with each flushed batch (an eighth of an fdatasync; without fsync too: a directory moved
            # aside keeps its link counts, and a kill -9 would lose every DM acked into it); the link counts are
            # checked always.
            home = True
            try:
                home = self._check_home(walk=self._homeless or batch.flush,
                                        pending=lines if batch.error is None else [])
            except BaseException as exc:  # a bug or an interrupt here must not stop the writer: the stop checks again
                logger.opt(exception=exc).error("checking the delivery journal's path failed")
                interrupt = interrupt or (None if isinstance(exc, Exception) else exc)
            if batch.error is None and not home and any(record.get("t") == "accepted" for record, _ in items):
                # Acked, these DMs would be in a file no start finds: refused like the acceptances after them
                batch.error = self._take_back(len(lines), before)
            elif batch.error is None:
                try:
                    self._state.track([record for record, _ in items], keep=self.keep_delivered)
                except BaseException as exc:  # the records are on disk: their waiters are told so
                    logger.opt(exception=exc).error("folding a written journal batch failed")
                    interrupt = interrupt or (None if isinstance(exc, Exception) else exc)
            if self._compaction_due():
                self._compact_due = not compact
                if compact:
                    self._try_compact()
        finally:
            try:
                # The waiters, then the callbacks, then the turn: listeners see the batches in file order.
                # Done under the lock: an interrupted waiter's ``on_interrupt`` joins the callbacks or is
                # told at once, never neither (:meth:`_tell_fate`).
                with self._lock:
                    batch.finish()
                batch.report(self.listener)
            finally:
                with self._cond:
                    # ``stop`` gave up on this commit: the writer thread closes the file once it has
                    # committed what is queued, or this commit does if the writer is gone, keeping
                    # the turn so that no commit starts on the closing file.
                    writer = self._thread
                    close = self._close_after_commit and (writer is None or not writer.is_alive())
                    self._writing = close
                    self._closed = self._closed or close
                    self._cond.notify_all()
                    if self._writer_due():
                        self._work.notify()
                if close:
                    self._release_files()
        if interrupt is not None:
            raise interrupt

    def _said_failed(self, count: int, exc: OSError) -> None:
        """A commit's write failed (under the write turn): said once per spell (:class:`FailureSpell`).

        Args:
            count: the batch's records (none of them is in the file).
            exc: the write's error.
        """
        self._writes_failing.failed(
            "journal write failed for {} record(s): {}. Each record of a failed write is refused or held to be "
            "written again; the failed writes that follow are logged at DEBUG until one lands",
            "journal write failed for {} record(s): {}", count, store_error("write", self.path, exc))

    def _said_landed(self) -> bool:
        """A commit's write landed (under the write turn): after failed ones, the end of the spell is said (INFO).

        Returns:
            Whether a spell of failed writes ended here.
        """
        return self._writes_failing.landed("the delivery journal {} takes records again ({} failed write(s) before)",
                                           self.path)

    def _write_now(self, lines: list[bytes], *, flush: bool = True) -> None:
        """Write ``lines`` to our file under the write turn (see :meth:`JournalFile.write`) and count them."""
        self._file.write(lines, flush=flush)
        self.records += len(lines)
        self._lines_in_file += len(lines)

    def _take_back(self, count: int, before: int) -> StoreError:
        """Cut the ``count`` lines of a batch just written back out of our lost file (under the write turn).

        The batch holds an acceptance and our file turned out unreachable with no fresh one
        possible (:meth:`_check_home`): its waiters are refused, so its records must not be
        found later either (the directory moved back into place, say).

        Args:
            count: the batch's lines.
            before: the file's :attr:`JournalFile.end` before the batch was written.

        Returns:
            The refusal for the batch's waiters: the one the acceptances after it get.
        """
        try:
            self._file.cut_back(before)
            self._lines_in_file -= count
        except OSError as exc:
            logger.error("could not cut {} refused record(s) back out of the lost delivery journal {}: {}; "
                         "should the file come back at its path, a start may offer those DMs again",
                         count, self.path, exc)
        return self._homeless_error()

    def _check_home(self, *, walk: bool, pending: list[bytes] | None = None, retry_for: float | None = None) -> bool:
        """Make sure our records are where a start finds them (under the write turn); False when homeless.

        A file no longer reachable at its path (see :meth:`JournalFile.reachable`) is
        rewritten with the live state into a fresh file, as a compaction does, in the
        journal directory opened anew (recreated if it is gone). When that fails the
        journal is homeless (see the module docstring) and the next commit tries again.
        Said once per change, at ERROR when it is lost. A check that cannot be made (an error
        that says nothing about the path, out of file descriptors say:
        :func:`~hermes_actors.store.os_errors.resource_failure`) changes nothing while the journal
        runs: it is taken as where it was, said once per spell. At stop (``retry_for``) it is tried
        again for up to that many seconds (bounded waits, never a busy loop); one still not made is
        taken as a journal that is gone (False, said at ERROR with why): its queued DMs are then
        settled ``cancelled`` and their senders told, never kept in a file no start may read.

        Args:
            walk: check the path too, not only the link counts.
            pending: the lines of the batch being committed, written but not yet in the live state
                (it joins the state only once this check has kept it): a fresh file holds them too.
            retry_for: the stop's: seconds to try again a check that cannot be made (None: no second try).

        Returns:
            True when our file is reachable (again, or anew), or (``retry_for`` None) could not be checked and
            was not lost before.
        """
        try:
            reachable = self._reachable(walk=walk, retry_for=retry_for)
        except OSError as exc:  # out of file descriptors, say: no sign that the file moved
            if retry_for is None:  # running: it is kept
                return not self._homeless
            logger.error(
                "the delivery journal {} could not be checked at its path at stop (tried for {}s): {}. Nothing "
                "tells that a restart would find it: its queued DMs are settled cancelled and their senders told, "
                "as for a journal that is gone", self.path, retry_for, advised(exc))
            return False
        if walk:  # a check of the link counts alone made no walk of the path: it ends no spell
            self._checks_failing.landed("the delivery journal {} can be checked at its path again ({} failed "
                                        "check(s) before)", self.path)
        if reachable:
            if self._homeless:
                logger.warning("the delivery journal {} is reachable at its path again; DMs are accepted again",
                               self.path)
                self._set_homeless(False)
            return True
        lines = self._state.lines() + (pending or [])
        try:
            self._file.replace_with(lines, fresh_dir=True)
        except (OSError, HostileFileError) as exc:
            if not self._homeless:
                logger.error(
                    "the delivery journal {} is no longer reachable at its path (its directory or the file was "
                    "deleted, moved or replaced) and no fresh file can be made there: {}. New DMs are refused "
                    "until it can; queued DMs are cancelled at stop instead of kept. Restore bot_relay/journal/ "
                    "as a directory of ours", self.path, exc)
                self._set_homeless(True)
            return False
        self._written_whole(len(lines))  # a fresh file is compacted: the back-off starts over
        logger.error("the delivery journal {} was no longer reachable at its path (its directory or the file was "
                     "deleted, moved or replaced): its {} live record(s) were rewritten into a fresh file there",
                     self.path, len(lines))
        if self._homeless:
            self._set_homeless(False)
        return True

    def _reachable(self, *, walk: bool, retry_for: float | None) -> bool:
        """:meth:`JournalFile.reachable`, each check that cannot be made said once per spell; tried again after each
        of :func:`check_pauses` (``retry_for``) while it cannot be made.

        Raises:
            OSError: the last check could not be made (out of file descriptors, say).
        """
        pauses = iter(check_pauses(retry_for or 0.0))
        wait = threading.Event()  # never set: each pause is a bounded wait, the whole within retry_for
        while True:
            try:
                return self._file.reachable(walk=walk)
            except OSError as exc:
                self._checks_failing.failed(
                    "the delivery journal {} could not be checked at its path: {}. Nothing says it moved: it is "
                    "taken as still there while the gateway runs (DMs are accepted); a stop tries the check again "
                    "briefly, then settles the queued DMs cancelled if it still cannot be made; the checks that "
                    "fail next are logged at DEBUG until one works", "the delivery journal {} could not be "
                    "checked: {}", self.path, advised(exc))
                pause = next(pauses, None)
                if pause is None:
                    raise
                wait.wait(pause)

    def _set_homeless(self, homeless: bool) -> None:
        with self._cond:
            self._homeless = homeless

    # ── compaction (the writer thread, under the write turn) ────────────────

    compact_after = 50_000  # lines in our file before it is rewritten with only what matters
    compact_after_bytes = COMPACT_AFTER_BYTES  # ... or bytes appended since it was last written whole
    keep_delivered = KEEP_DELIVERED  # delivered outcomes kept for wait_outcome after a restart

    def _compaction_due(self) -> bool:
        """Whether our file is to be compacted: past ``compact_after`` lines, or ``compact_after_bytes`` appended
        since it was last written whole (lines alone bound no size: a line may hold up to 64 MiB); after a
        compaction failed, by another ``compact_after`` lines or ``compact_after_bytes`` since (under the write turn).

        A nearly full disk takes the appends while the whole compacted file does not fit: tried at every
        commit, the compaction would fail at every commit, writing and removing a whole temp file each time.
        A failed write's spell that ends (space came back) lifts the back-off (:meth:`_commit`).
        """
        grown = self._file.end - (self._whole_end if self._compact_failed_end is None else self._compact_failed_end)
        return (self._lines_in_file - (self._compact_failed_at or 0) > self.compact_after
                or grown > self.compact_after_bytes)

    def _space_came_back(self) -> None:
        """A failed write's spell ended: a compaction that did not fit may now (its back-off is lifted)."""
        self._compact_failed_at = self._compact_failed_end = None

    def _written_whole(self, lines: int) -> None:
        """Our file was just written whole (compacted, or rewritten fresh) with ``lines`` lines: counts start over."""
        self._lines_in_file = lines
        self._whole_end = self._file.end
        self._space_came_back()

    def _try_compact(self) -> None:
        """Compact (the writer thread, under the write turn); a failure is said once per spell and backs off.

        The commit's batch is on disk all the same, and the journal goes on appending to its file.
        """
        try:
            self._compact()
        except OSError as exc:
            self._compact_failed_at, self._compact_failed_end = self._lines_in_file, self._file.end
            self._compactions_failing.failed(
                "journal compaction failed: {}. The journal goes on appending to it (past its {} lines to compact at); "
                "compaction is tried again after another {} line(s), or once a failed write lands again; the "
                "failed compactions that follow are logged at DEBUG until one lands",
                "journal compaction failed: {} ({} lines; tried again after another {})",
                store_error("compact", self.path, exc), self.compact_after, self.compact_after)
            return
        self._compactions_failing.landed("the delivery journal {} is compacted again ({} failed compaction(s) "
                                         "before)", self.path)

    def _compact(self) -> None:
        """Rewrite our file with only live state and recent outcomes, then swap it in atomically."""
        lines = self._state.lines()
        self._file.replace_with(lines)
        self._written_whole(len(lines))
        self.compactions += 1
        logger.info("journal compacted to {} line(s)", len(lines))


def _may_commit() -> bool:
    """Whether this thread may commit (write and sync a batch): every thread but the main one.

    Signal handlers run in the main thread, between any two calls: their exception would
    land inside the commit (see the module docstring).
    """
    return threading.current_thread() is not threading.main_thread()


def _held_here(lock: Any) -> bool:
    """Whether the calling thread holds the re-entrant ``lock`` (a signal handler re-entering the journal).

    ``RLock._is_owned`` is what ``threading.Condition`` itself asks (not in the type stubs).
    """
    return bool(lock._is_owned())
