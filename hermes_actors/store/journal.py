"""The durable delivery journal, with group commit.

Layout: ``<root>/bot_relay/journal/j-<uuid>.log``, one file per gateway
process, held under an exclusive ``flock`` for that process's life. Each line
is one orjson record::

    {"t": "accepted",  "id", "d": {delivery fields}}   durable before the ack returns
    {"t": "started",   "id", "attempt"}                 durable before the turn runs
    {"t": "finished",  "id", "o": {outcome dict}}       durable before the outcome is published
    {"t": "delivered", "id"}                            the outcome reached the sender (lazy)

Group commit: writers enqueue records; one commit writes everything queued,
calls ``fdatasync`` once, then wakes every waiter of that batch. So N
concurrent DMs share one sync instead of paying N. One commit runs at a time
(the *write turn*). The writer thread takes the turn for records nobody waits
on; a caller that waits for its record (``append_durably``) and finds no commit
running takes the turn itself and commits on its own thread, so an unloaded
journal costs no hand-off to the writer and back. Callers that arrive during a
commit queue behind it and share the next one.

A record is either on disk and confirmed, or refused and absent, never both: a
failed write or sync is truncated back and fails its whole batch, and a caller
that no commit took within its timeout withdraws its record before it is told.

A *lazy* record (``delivered``) waits for nobody: it is written at once (so a
killed process loses nothing the kernel has) but a batch of lazy records only
is not flushed on its own; the next flushed batch, or ``stop``, carries it to
stable storage. Losing one to a power cut costs a repeated outcome at restart,
which recovery already handles. The flush it saves used to sit in front of the
next DM's ``accepted`` record.

At start a gateway adopts the journals of dead gateways on the same root (a
file whose flock it can take has no living owner): their live records are
copied into its own file, then the old file is removed.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import orjson
from loguru import logger

from hermes_actors.errors import StoreError
from hermes_actors.store.atomic import ensure_private_dir

__all__ = ["DeliveryState", "Journal", "JournalFolded", "StartRecorder", "fold_records", "parse_lines"]

MAX_LINE_BYTES = 1 << 20
DurableCallback = Callable[[BaseException | None], object]


class StartRecorder(Protocol):
    """What a turn needs to record its start durably before it runs: a :class:`Journal`, or the
    relay's ``TurnStartMarks`` for a turn that arrived through the file relay."""

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None: ...


@dataclass
class DeliveryState:
    """What the journal knows of one delivery."""

    delivery: dict[str, Any] | None = None
    started: int = 0
    outcome: dict[str, Any] | None = None
    delivered: bool = False


@dataclass
class JournalFolded:
    """The folded state of one or more journal files."""

    states: dict[str, DeliveryState] = field(default_factory=dict)
    corrupt_lines: int = 0

    def live(self) -> dict[str, DeliveryState]:
        """Deliveries whose outcome has not reached the sender yet."""
        return {k: s for k, s in self.states.items() if not s.delivered}


def parse_lines(lines: Iterable[bytes]) -> tuple[list[dict[str, Any]], int]:
    """Pure: decode journal lines; a torn or corrupt line (crash mid-write) is skipped and counted."""
    records: list[dict[str, Any]] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("id"), str) and record.get("t") in _KINDS:
            records.append(record)
        else:
            bad += 1
    return records, bad


_KINDS = frozenset({"accepted", "started", "finished", "delivered"})


def fold_records(records: Iterable[dict[str, Any]], into: JournalFolded | None = None) -> JournalFolded:
    """Pure: fold records (in file order) into per-delivery state."""
    folded = into or JournalFolded()
    for record in records:
        state = folded.states.setdefault(record["id"], DeliveryState())
        kind = record["t"]
        if kind == "accepted" and isinstance(record.get("d"), dict):
            state.delivery = record["d"]
        elif kind == "started":
            state.started = max(state.started, int(record.get("attempt") or 1))
        elif kind == "finished" and isinstance(record.get("o"), dict) and state.outcome is None:
            state.outcome = record["o"]  # the first outcome wins
        elif kind == "delivered":
            state.delivered = True
    return folded


class _Batch:
    __slots__ = ("callbacks", "done", "error", "flush", "tokens")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.callbacks: list[DurableCallback] = []
        self.tokens: list[Any] = []
        self.flush = False  # a record someone may wait for is in it (not only lazy ones)


class Journal:
    """This gateway's journal file, written with group commit.

    Args:
        directory: ``<root>/bot_relay/journal``.
        fsync: call ``os.fdatasync`` per batch (tests of speed may turn it off).

    Use ``start()`` / ``stop()`` or ``with``.
    """

    stop_wait = 10.0  # seconds ``stop`` waits for the writer thread, then again for a running commit

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.directory = directory
        self.fsync_enabled = fsync
        self.path = directory / f"j-{uuid.uuid4().hex}.log"
        self._fd: int | None = None
        self._cond = threading.Condition()
        self._queue: list[tuple[dict[str, Any], bytes]] = []
        # Owned by whoever holds the write turn (``_writing``): the writer thread or a leading caller.
        self._fold = JournalFolded()  # live state of OUR file
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()  # delivered outcomes kept across compaction
        self._lines_in_file = 0
        self._batch = _Batch()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._writing = False  # a commit holds the write turn (guarded by ``_cond``)
        self._compact_due = False  # a leading caller's commit grew the file past ``compact_after``
        self._close_after_commit = False  # ``stop`` gave up waiting for a commit: it closes the file
        self.fsyncs = 0
        self._unflushed = False  # lazy records written since the last fdatasync
        self.records = 0
        # Called by the committing thread with the tokens of each durable batch (and its error).
        self.listener: Callable[[list[Any], BaseException | None], object] | None = None
        self.compactions = 0

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> JournalFolded:
        """Open our file, adopt dead gateways' journals, start the writer.

        Returns:
            The adopted state (what recovery must act on).

        Raises:
            StoreError: the directory or file cannot be used.
        """
        ensure_private_dir(self.directory)
        # Created under a name outside the ``j-*.log`` glob and locked before it is renamed in:
        # a gateway adopting at the same moment must never take (and remove) our new file.
        fresh = self.directory / f".{self.path.name}.new"
        try:
            self._fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(fresh, self.path)
        except OSError as exc:
            fresh.unlink(missing_ok=True)
            raise StoreError(exc.errno, f"cannot open the delivery journal {self.path}: {exc.strerror}") from exc
        with self._cond:  # adoption writes to our file: no caller may commit meanwhile
            self._writing = True
        try:
            adopted = self._adopt()
        finally:
            with self._cond:
                self._writing = False
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()
        return adopted

    def _adopt(self) -> JournalFolded:
        folded = JournalFolded()
        orphans: list[tuple[Path, int]] = []  # adopted files, still locked until they are removed
        for path in sorted(self.directory.glob("j-*.log")):
            if path == self.path or path.is_symlink():
                continue
            try:  # O_NONBLOCK: a FIFO planted under a journal's name must not hang the start
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
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
                    records, bad = parse_lines(stream)
                fold_records(records, folded)
                folded.corrupt_lines += bad
                orphans.append((path, fd))
                keep = True
            finally:
                if not keep:
                    os.close(fd)
        # Copy what still matters into our own file before the old files go.
        for key, state in folded.states.items():
            if state.delivered and state.outcome is not None:
                self._recent[key] = state.outcome
            elif not state.delivered:
                self._fold.states[key] = DeliveryState(state.delivery, state.started, state.outcome)
        while len(self._recent) > self.keep_delivered:
            self._recent.popitem(last=False)
        try:
            lines = self._state_lines()
            if lines:
                self._write_now(lines)
            for path, _ in orphans:
                try:
                    path.unlink()
                except OSError as exc:
                    logger.warning("could not remove adopted journal {}: {}", path, exc)
        finally:
            for _, fd in orphans:
                os.close(fd)
        return folded

    def stop(self) -> None:
        """Flush what is queued, stop the writer, close (and remove an empty) file."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.stop_wait)
        with self._cond:  # a leading caller may still be committing its batch
            if not self._cond.wait_for(lambda: not self._writing, timeout=self.stop_wait):
                # Closing now could hand its descriptor number to another file mid-write: the commit
                # closes the file when it ends instead.
                logger.error("a journal commit is still running after {}s; the file closes when it ends",
                             2 * self.stop_wait)
                self._close_after_commit = True
                return
        self._close()

    def _close(self) -> None:
        """Flush lazy records, close the file, and remove it if nothing was ever journaled."""
        if self._fd is not None:
            if self._unflushed:  # lazy records the last batches wrote without a flush
                try:
                    os.fdatasync(self._fd)
                    self.fsyncs += 1
                except OSError as exc:
                    logger.error("journal flush at stop failed: {}", exc)
            empty = os.fstat(self._fd).st_size == 0
            os.close(self._fd)
            self._fd = None
            if empty:  # nothing was ever journaled: leave no file behind
                self.path.unlink(missing_ok=True)

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
            return self._cond.wait_for(lambda: not (self._queue or self._writing), timeout=max(0.0, timeout))

    @property
    def running(self) -> bool:
        """Whether records are accepted (started, and ``stop`` has not begun)."""
        return self._fd is not None and not self._stopping

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
    ) -> _Batch:
        """Queue ``record``; the returned batch's ``done`` is set once it is durable.

        Args:
            record: a journal record (see the module docstring).
            callback: called on the committing thread after the batch is durable
                (with None) or failed (with the error). Must not block.
            token: handed, with every other token of the same batch, to ``listener``
                in ONE call once the batch is durable — one message per group commit
                instead of one per record.
            lazy: nobody waits for it to be flushed (see the module docstring): it
                is written with the next batch but does not make that batch flush.
                With ``callback`` or ``token`` it is not lazy.

        Raises:
            StoreError: the journal is stopped.
        """
        line = _line(record)
        with self._cond:
            batch = self._enqueue(record, line, flush=not lazy or callback is not None or token is not None)
            if callback is not None:
                batch.callbacks.append(callback)
            if token is not None:
                batch.tokens.append(token)
            self._cond.notify()
            return batch

    def _enqueue(self, record: dict[str, Any], line: bytes, *, flush: bool) -> _Batch:
        """Queue one record in the open batch (the caller holds ``_cond``); the batch.

        Raises:
            StoreError: the journal is stopped.
        """
        if self._stopping or self._fd is None:
            raise StoreError(0, "the delivery journal is not running")
        self._queue.append((record, line))
        batch = self._batch
        batch.flush = batch.flush or flush
        return batch

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None:
        """Append and wait until the record is on disk.

        With no commit running, the caller commits the queued batch itself (its own
        record and any queued before it); otherwise it waits for the next commit.

        Args:
            record: a journal record (see the module docstring).
            timeout: seconds to wait for a commit to take the record; then it is withdrawn,
                never written. Once a commit holds it (the caller's own, or another
                thread's), its end is waited for: the record lands or is refused, never
                both.

        Raises:
            StoreError: the journal is stopped, the write or fsync failed (ENOSPC,
                EIO ...; the record is not in the file), or no commit took the record in time.
        """
        line = _line(record)
        with self._cond:
            batch = self._enqueue(record, line, flush=True)
            # A due compaction is the writer thread's: waiting for it here keeps the file bounded. No
            # notify either way: the writer would not get a batch the caller commits, and a running
            # commit (or the due compaction) hands the turn on to the writer as it ends.
            lead = self._take_turn() if not self._writing and not self._compact_due else None
        if lead is not None:
            self._commit(*lead, compact=False)
        elif not batch.done.wait(timeout) and self._withdraw(record, batch):
            raise StoreError(0, f"the delivery journal did not confirm a write within {timeout}s")
        batch.done.wait()  # a commit holds the record: it lands or fails, and the caller is told which
        if batch.error is not None:
            raise StoreError(getattr(batch.error, "errno", 0) or 0, f"journal write failed: {batch.error}")

    def _withdraw(self, record: dict[str, Any], batch: _Batch) -> bool:
        """Take ``record`` back out of the queue if no commit took its batch yet; True if it was.

        A caller that gives up waiting must not have its record written later: its sender is
        told the DM was NOT queued, and a record landing afterwards would be re-offered by
        the next start.
        """
        with self._cond:
            if batch is not self._batch:
                return False
            self._queue = [item for item in self._queue if item[0] is not record]
            return True

    def _take_turn(self) -> tuple[list[tuple[dict[str, Any], bytes]], _Batch]:
        """Take the write turn and everything queued (the caller holds ``_cond``)."""
        self._writing = True
        items, self._queue = self._queue, []
        batch, self._batch = self._batch, _Batch()
        return items, batch

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._writing or not (self._queue or self._compact_due or self._stopping):
                    self._cond.wait()
                if self._stopping and not self._queue:
                    close = self._close_after_commit
                    break
                items, batch = self._take_turn()
            self._commit(items, batch, compact=True)
        if close:  # ``stop`` returned before the last commit ended
            self._close()

    def _commit(self, items: list[tuple[dict[str, Any], bytes]], batch: _Batch, *, compact: bool) -> None:
        """Write and sync one batch under the write turn, wake its waiters, then give the turn back.

        Args:
            items: the batch's records and lines (may be empty: a compaction only).
            batch: their waiters, callbacks and tokens.
            compact: compact here if the file grew too long (the writer thread); a leading
                caller leaves that to the writer thread instead of making its sender wait.
        """
        try:
            try:
                if items:
                    self._write_now([line for _, line in items], flush=batch.flush)
            except OSError as exc:
                batch.error = exc
                logger.error("journal write failed for {} record(s): {}", len(items), exc)
            except BaseException as exc:  # a bug or an interrupt: its waiters must not think it landed
                batch.error = exc
                logger.opt(exception=exc).error("journal write failed for {} record(s)", len(items))
                if not isinstance(exc, Exception):
                    raise
            else:
                try:
                    self._track([record for record, _ in items])
                except Exception:  # the records are on disk: their waiters are told so
                    logger.exception("folding a written journal batch failed")
            if self._lines_in_file > self.compact_after:
                self._compact_due = not compact
                if compact:
                    try:
                        self._compact()
                    except OSError as exc:  # the batch is on disk all the same; the next commit retries
                        logger.error("journal compaction failed: {}", exc)
        finally:
            try:
                # The waiters, then the callbacks, then the turn: listeners see the batches in file order.
                batch.done.set()
                self._report(batch)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
                    # ``stop`` gave up on this commit: the writer thread closes the file once it has
                    # committed what is queued, or this commit does if the writer is gone.
                    writer = self._thread
                    close = self._close_after_commit and (writer is None or not writer.is_alive())
                if close:
                    self._close()

    def _report(self, batch: _Batch) -> None:
        """Hand a finished batch's result to its callbacks and the listener (they must not raise)."""
        for callback in batch.callbacks:
            try:
                callback(batch.error)
            except Exception:
                logger.exception("journal callback failed")
        listener = self.listener
        if batch.tokens and listener is not None:
            try:
                listener(batch.tokens, batch.error)
            except Exception:
                logger.exception("journal listener failed")

    def _write_now(self, lines: list[bytes], *, flush: bool = True) -> None:
        assert self._fd is not None
        data = b"".join(lines)
        view = memoryview(data)
        before = os.fstat(self._fd).st_size
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync_enabled and flush:
                # fdatasync: the data and the size needed to read it back, without the mtime (half the
                # cost). It flushes every earlier write of this file too, lazy records included.
                os.fdatasync(self._fd)
                self.fsyncs += 1
                self._unflushed = False
            elif self.fsync_enabled:
                self._unflushed = True
        except OSError:
            # Never leave a torn record behind for the next batch to be glued onto, nor records whose
            # sync failed: their callers are told they were NOT recorded, so no start may find them.
            try:
                os.ftruncate(self._fd, before)
            except OSError:
                pass
            raise
        self.records += len(lines)
        self._lines_in_file += len(lines)

    # ── compaction (the writer thread, under the write turn) ────────────────

    compact_after = 50_000  # lines in our file before it is rewritten with only what matters
    keep_delivered = 10_000  # delivered outcomes kept for wait_outcome after a restart

    def _track(self, records: list[dict[str, Any]]) -> None:
        """Fold one written batch into the live state; a delivered DM leaves it for the recent outcomes.

        Only the batch's own ``delivered`` records are looked up: the cost follows the batch,
        not the number of DMs in flight.
        """
        fold_records(records, self._fold)
        states = self._fold.states
        for record in records:
            if record["t"] != "delivered":
                continue
            state = states.pop(record["id"], None)
            if state is not None and state.outcome is not None:
                self._recent[record["id"]] = state.outcome
                if len(self._recent) > self.keep_delivered:
                    self._recent.popitem(last=False)

    def _state_lines(self) -> list[bytes]:
        lines = [
            line
            for key, outcome in self._recent.items()
            for line in (_line({"t": "finished", "id": key, "o": outcome}), _line({"t": "delivered", "id": key}))
        ]
        for key, state in self._fold.states.items():
            if state.delivery is not None:
                lines.append(_line({"t": "accepted", "id": key, "d": state.delivery}))
            if state.started:
                lines.append(_line({"t": "started", "id": key, "attempt": state.started}))
            if state.outcome is not None:
                lines.append(_line({"t": "finished", "id": key, "o": state.outcome}))
        return lines

    def _compact(self) -> None:
        """Rewrite our file with only live state and recent outcomes, then swap it in atomically."""
        assert self._fd is not None
        tmp = self.directory / f".{self.path.name}.compact"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            lines = self._state_lines()
            os.write(fd, b"".join(lines))
            if self.fsync_enabled:
                os.fdatasync(fd)
                self._unflushed = False
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(tmp, self.path)  # readers see the old file or the new one, never a mix
        except OSError:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(self._fd)
        self._fd = fd
        self._lines_in_file = len(lines)
        self.compactions += 1
        logger.info("journal compacted to {} line(s)", len(lines))


def _line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"
