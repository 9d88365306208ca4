"""Timers: tell an actor a message after a delay, or every interval.

One :class:`Scheduler` thread serves every timer of a system (no thread per
timer). Its lifetime is explicit: ``start()`` / ``stop()`` or a ``with`` block.
:class:`ManualScheduler` runs no thread at all; tests move its clock with
``advance()``, which fires what became due, in order, in the caller's thread.

A callable target is user code: whatever it raises (any ``BaseException``,
``SystemExit`` and ``pykka.ActorDeadError`` included) is logged and its timer
goes on; the thread never dies of it. The one exception is a
``KeyboardInterrupt`` raised in the main thread (only ``ManualScheduler.advance``
fires timers there): that is the user's Ctrl-C, and it is raised on. Only a
message timer whose target actor is dead is cancelled (its tell failed).

A timer scheduled on a stopped scheduler (after ``stop()``, before a new
``start()``) is refused: it comes back already cancelled, never fires and is not
counted by ``pending()``. One scheduled before the first ``start()`` waits for it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pykka
from loguru import logger

Target = pykka.ActorRef[Any] | Callable[[], None]

__all__ = ["ManualScheduler", "Scheduler", "TimerHandle", "TimerSet"]


@dataclass(eq=False)
class TimerHandle:
    """A scheduled tell; ``cancel()`` makes sure it never fires again."""

    target: Target
    message: Any
    interval: float | None
    due: float
    cancelled: bool = False
    owner: TimerSet | None = field(default=None, repr=False)
    scheduler: Scheduler | None = field(default=None, repr=False)
    in_heap: bool = field(default=False, repr=False)

    def cancel(self) -> None:
        """Cancel the timer; idempotent, safe from any thread."""
        if self.scheduler is not None:
            self.scheduler.cancel(self)
        else:
            self.cancelled = True
        if self.owner is not None:
            self.owner.forget(self)


# The heap is rebuilt without its cancelled entries when they are more than half of it
# (and at least this many): cancelled timers cost O(1) amortized and are never retained.
_COMPACT_MIN = 64


class Scheduler:
    """One thread that fires every timer of a system at its due time.

    Cancelled timers do not stay in memory until their due time: the heap is
    compacted once cancelled entries make up more than half of it.

    Args:
        clock: monotonic clock in seconds; injectable for tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None  # the one thread serving the heap; another one exits
        self._stopped = False  # stop() ran and no start() since: new timers are refused
        self._cancelled_in_heap = 0

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> Scheduler:
        """Start the timer thread (idempotent; a thread that died is replaced). Returns self.

        A thread of an earlier ``start()`` still running a callback after ``stop()`` exits once
        that callback returns: one thread serves the timers.
        """
        with self._cond:
            self._stopped = False
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name="actors-scheduler", daemon=True)
                self._thread = thread
                thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; pending timers are dropped, and new ones refused until ``start()``.

        Waits up to 5 s for a callback that is running; its thread exits once it returns.
        """
        with self._cond:
            self._stopped = True
            for _, _, handle in self._heap:
                handle.in_heap = False
            self._heap.clear()
            self._cancelled_in_heap = 0
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ── scheduling ──────────────────────────────────────────────────────────

    def after(self, delay: float, target: Target, message: Any = None) -> TimerHandle:
        """Tell ``message`` to ``target`` once, ``delay`` seconds from now.

        Args:
            delay: seconds (negative counts as 0).
            target: an actor ref (told ``message``) or a plain callable (called).
            message: what to tell.

        Returns:
            The handle to cancel it (already cancelled when the scheduler is stopped).
        """
        return self._schedule(target, message, None, delay, None)

    def every(self, interval: float, target: Target, message: Any = None) -> TimerHandle:
        """Tell ``message`` to ``target`` every ``interval`` seconds until cancelled.

        Args:
            interval: seconds between two firings; the first is one interval from now.
            target: an actor ref (told ``message``) or a plain callable (called).
            message: what to tell.

        Returns:
            The handle to cancel it (already cancelled when the scheduler is stopped).

        Raises:
            ValueError: when ``interval`` is not positive.
        """
        _check_interval(interval)
        return self._schedule(target, message, interval, interval, None)

    def _schedule(
        self, target: Target, message: Any, interval: float | None, delay: float, owner: TimerSet | None
    ) -> TimerHandle:
        handle = TimerHandle(target, message, interval, self.clock() + max(0.0, delay), owner=owner, scheduler=self)
        if owner is not None:
            owner._adopt(handle)  # before the push: a timer that fires at once is forgotten by _fire, not left behind
        if not self._push(handle):
            logger.debug("a timer was refused: the scheduler is stopped")
            handle.cancel()
        return handle

    def pending(self) -> int:
        """How many live (not cancelled) timers are scheduled."""
        with self._cond:
            return len(self._heap) - self._cancelled_in_heap

    def heap_size(self) -> int:
        """How many timer entries the scheduler holds in memory, cancelled ones included.

        Stays below about twice :meth:`pending` (plus a small constant), however
        many timers were cancelled.
        """
        with self._cond:
            return len(self._heap)

    def cancel(self, handle: TimerHandle) -> None:
        """Cancel ``handle`` (what :meth:`TimerHandle.cancel` calls); idempotent, any thread.

        Args:
            handle: a timer of this scheduler.
        """
        with self._cond:
            if handle.cancelled:
                return
            handle.cancelled = True
            if not handle.in_heap:
                return
            self._cancelled_in_heap += 1
            everything = self._cancelled_in_heap == len(self._heap)
            if everything or (self._cancelled_in_heap > _COMPACT_MIN and self._cancelled_in_heap * 2 > len(self._heap)):
                self._compact()

    def _compact(self) -> None:
        kept = []
        for entry in self._heap:
            if entry[2].cancelled:
                entry[2].in_heap = False
            else:
                kept.append(entry)
        heapq.heapify(kept)
        self._heap = kept
        self._cancelled_in_heap = 0

    def _push(self, handle: TimerHandle) -> bool:
        """Put ``handle`` in the heap; False (nothing done) when the scheduler is stopped."""
        with self._cond:
            if self._stopped:
                return False
            earliest = self._heap[0][0] if self._heap else None
            handle.in_heap = True
            heapq.heappush(self._heap, (handle.due, next(self._seq), handle))
            if earliest is None or handle.due < earliest:
                self._cond.notify()  # only a new head changes how long the thread sleeps
        return True

    def _pop_due(self, now: float) -> list[TimerHandle]:
        due: list[TimerHandle] = []
        while self._heap and self._heap[0][0] <= now:
            _, _, handle = heapq.heappop(self._heap)
            handle.in_heap = False
            if handle.cancelled:
                self._cancelled_in_heap -= 1
                continue
            due.append(handle)
            if handle.interval is not None:
                handle.in_heap = True
                handle.due += handle.interval
                if handle.due <= now:  # fell behind (suspended machine): skip missed ticks
                    handle.due = now + handle.interval
                heapq.heappush(self._heap, (handle.due, next(self._seq), handle))
        return due

    def _fire(self, handles: list[TimerHandle], thread: threading.Thread | None = None) -> None:
        """Fire ``handles`` in order; on a scheduler thread (``thread``), only while it still serves the heap."""
        for handle in handles:
            if handle.cancelled or (thread is not None and self._thread is not thread):
                continue
            if handle.interval is None and handle.owner is not None:
                handle.owner.forget(handle)
            _fire_one(handle)

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._cond:
                    if self._thread is not me:  # stopped, or replaced by a start() after a stop()
                        return
                    now = self.clock()
                    due = self._pop_due(now)
                    if not due:
                        wait = self._heap[0][0] - now if self._heap else None
                        self._cond.wait(timeout=wait)
                        continue
                self._fire(due, me)
        except BaseException:  # not a callback's (those are caught): the loop's own, e.g. an injected clock's
            logger.exception("the timer thread died; start() starts a new one")


def _check_interval(interval: float) -> None:
    """Refuse a periodic timer's interval that is not positive.

    Args:
        interval: seconds.

    Raises:
        ValueError: when ``interval`` is not positive.
    """
    if interval <= 0:
        raise ValueError(f"timer interval must be > 0 seconds, got {interval!r}")


def _raised_on(error: BaseException) -> bool:
    """Whether an error user code raised must be raised on rather than logged.

    Only a ``KeyboardInterrupt`` in the main thread: there it is the user's Ctrl-C, and
    swallowing it would make the program ignore it. Anywhere else (a signal is only ever
    delivered to the main thread) it was raised by the code itself, and is logged like
    ``SystemExit`` or any other error.

    Args:
        error: what the user code raised.

    Returns:
        True to raise it on, False to log it and go on.
    """
    return isinstance(error, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()


def _fire_one(handle: TimerHandle) -> None:
    """Tell or call one timer's target; a dead target actor cancels its timer, a callback's error is logged."""
    if isinstance(handle.target, pykka.ActorRef):
        try:
            handle.target.tell(handle.message)
        except pykka.ActorDeadError:
            handle.cancel()  # its actor is gone: the timer goes with it
        return
    try:
        handle.target()
    except BaseException as error:  # user code: logged, the timer and the thread go on
        if _raised_on(error):
            raise
        logger.opt(exception=error).error("timer callback failed: {!r}", error)


class ManualScheduler(Scheduler):
    """A scheduler whose time only moves when the test calls :meth:`advance`."""

    def __init__(self, start_at: float = 0.0) -> None:
        self.now = start_at
        super().__init__(clock=lambda: self.now)

    def start(self) -> ManualScheduler:
        """Take timers again after a ``stop()`` (no thread runs). Returns self."""
        with self._cond:
            self._stopped = False
        return self

    def advance(self, seconds: float) -> int:
        """Move time forward and fire, in order, what became due.

        Returns:
            How many timers fired.
        """
        target = self.now + seconds
        fired = 0
        while True:
            with self._cond:
                next_due = self._heap[0][0] if self._heap else None
                if next_due is None or next_due > target:
                    break
                self.now = max(self.now, next_due)
                due = self._pop_due(self.now)
            self._fire(due)
            fired += len(due)
        self.now = target
        return fired


class TimerSet:
    """The timers one actor owns: all cancelled together when it stops.

    Args:
        scheduler: the system's scheduler.
        ref: the owning actor's ref (the default target).
    """

    def __init__(self, scheduler: Scheduler, ref: pykka.ActorRef[Any]) -> None:
        self.scheduler = scheduler
        self.ref = ref
        self._live: set[TimerHandle] = set()
        self._lock = threading.Lock()  # handles are cancelled from the scheduler thread too

    def after(self, delay: float, message: Any) -> TimerHandle:
        """Tell ``message`` to the owner after ``delay`` seconds.

        Args:
            delay: seconds (negative counts as 0).
            message: what to tell.

        Returns:
            The handle to cancel it (already cancelled when the scheduler is stopped).
        """
        return self.scheduler._schedule(self.ref, message, None, delay, self)

    def every(self, interval: float, message: Any) -> TimerHandle:
        """Tell ``message`` to the owner every ``interval`` seconds.

        Args:
            interval: seconds between two firings; the first is one interval from now.
            message: what to tell.

        Returns:
            The handle to cancel it (already cancelled when the scheduler is stopped).

        Raises:
            ValueError: when ``interval`` is not positive.
        """
        _check_interval(interval)
        return self.scheduler._schedule(self.ref, message, interval, interval, self)

    def _adopt(self, handle: TimerHandle) -> None:
        with self._lock:
            self._live.add(handle)

    def forget(self, handle: TimerHandle) -> None:
        with self._lock:
            self._live.discard(handle)

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for h in self._live if not h.cancelled)

    def cancel_all(self) -> None:
        """Cancel every timer of the owner (call from on_stop / on_crash)."""
        with self._lock:
            live, self._live = self._live, set()
        for handle in live:
            self.scheduler.cancel(handle)
