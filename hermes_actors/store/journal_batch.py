"""One group commit's batch: records written together, with their waiters, callbacks and listener tokens.

Records queue into the open batch of :class:`hermes_actors.store.journal.Journal`;
the commit that takes it writes them with one sync, sets ``done`` and reports the
result to the batch's callbacks and the journal's listener (:meth:`CommitBatch.report`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from loguru import logger

from hermes_actors.errors import StoreError

__all__ = ["BatchListener", "CommitBatch", "DurableCallback"]

DurableCallback = Callable[[BaseException | None], object]
# Called by the committing thread with the tokens of each durable batch (and its error).
BatchListener = Callable[[list[Any], BaseException | None], object]


class CommitBatch:
    """The records of one group commit: ``done`` is set once they landed, or failed with ``error``."""

    __slots__ = ("callbacks", "done", "error", "flush", "items", "leader", "tokens", "waiters")

    def __init__(self) -> None:
        self.items: list[tuple[dict[str, Any], bytes]] = []  # each record and its line, in file order
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.callbacks: list[DurableCallback] = []
        self.tokens: list[Any] = []
        self.flush = False  # a record someone may wait for is in it (not only lazy ones)
        self.leader = False  # a caller waits for the turn to commit this batch itself
        # Held locks, one per caller of the main thread waiting for this batch; released as ``done`` is set.
        self.waiters: list[threading.Lock] = []

    def add(self, record: dict[str, Any], line: bytes, *, flush: bool) -> None:
        """Queue ``record`` (encoded as ``line``); ``flush``: someone may wait for it to reach stable storage."""
        self.items.append((record, line))
        self.flush = self.flush or flush

    def add_waiter(self) -> threading.Lock:
        """A held lock released once the batch is done: what a caller that may be interrupted waits on.

        A signal handler's exception (KeyboardInterrupt) can land anywhere in the main thread, in
        ``Event.wait``'s Python code too, after it took the event's own lock and before it gave it
        back: the committing thread's ``done.set()`` would then block on that lock for good. A bare
        lock, acquired by its waiter and released by the commit, is never left held for anyone else.

        Returns:
            The lock, held: its ``acquire`` returns once :meth:`finish` ran.
        """
        waiter = threading.Lock()
        waiter.acquire()
        self.waiters.append(waiter)
        return waiter

    def finish(self) -> None:
        """Mark the batch done (its ``error`` set or not): ``done`` is set and every waiter released, once."""
        self.done.set()
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter.release()

    def withdraw(self, record: dict[str, Any]) -> None:
        """Take ``record`` (the very object added) back out: no commit took it in time."""
        self.items = [item for item in self.items if item[0] is not record]

    def report(self, listener: BatchListener | None) -> None:
        """Hand the finished batch's result to its callbacks, then its tokens to ``listener`` (they must not raise).

        Args:
            listener: the journal's listener, called once per batch that holds tokens.
        """
        for callback in self.callbacks:
            self.call(callback, self.error)
        if self.tokens and listener is not None:
            try:
                listener(self.tokens, self.error)
            except Exception:
                logger.exception("journal listener failed")

    @staticmethod
    def call(callback: DurableCallback, error: BaseException | None) -> None:
        """Call one ``callback`` with ``error`` (None: landed); what it raises is logged, never passed on."""
        try:
            callback(error)
        except Exception:
            logger.exception("journal callback failed")

    def raise_error(self) -> None:
        """Raise the batch's failure to a caller that waited for it.

        Raises:
            StoreError: the batch's write or sync failed; its records are not in the file.
        """
        if self.error is not None:
            raise StoreError(getattr(self.error, "errno", 0) or 0, f"journal write failed: {self.error}")
