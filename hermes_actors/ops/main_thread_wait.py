"""A wait on the main thread that every signal ends, whichever thread the kernel handed it to.

Python runs a signal's handler on the main thread only, when that thread next runs bytecode. The
kernel hands a process's signal to any thread that does not block it: one handed to an actor's
thread while the main thread waits on a lock or an event ran no handler, and ``serve`` went on
serving after a Ctrl-C. Blocking the signals in every other thread sent them to the main thread,
but every process those threads started (a hermes CLI turn) inherited the block and ignored the
SIGTERM meant to end it. So the main thread waits in ``select`` on the signal wakeup fd instead:
the C-level handler writes the signal's number there from whatever thread caught it, the
``select`` returns, and the handler runs on the main thread before the wait looks again.

A wait that cannot make its pipe (the process is out of descriptors: a flood of clients) is a
plain wait instead, woken by :meth:`MainThreadWait.wake` alone, as on another thread: a stop
asked then must still stop, not fail for want of a descriptor.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable
from types import TracebackType

from loguru import logger

__all__ = ["MainThreadWait"]

# until_set's watchers: an event → the waits it wakes when set. One watcher thread per event, started by its first
# wait and ended by its set(): a wait ended otherwise (a signal's handler raising) leaves it to the next wait on the
# same event instead of each wait leaving one more thread (an Event is waited on alone, with no timeout to poll).
# No lock: setdefault and pop are single dict operations (a lock taken on the main thread is what a signal's
# handler must never interrupt).
_WATCHED: dict[threading.Event, set[MainThreadWait]] = {}


def _watch(event: threading.Event) -> None:
    """A watcher thread: wait for ``event``, then wake every wait on it (and forget it)."""
    event.wait()
    for wait in tuple(_WATCHED.pop(event, ())):  # tuple(): one C call, however the set changes meanwhile
        wait.wake()


class MainThreadWait:
    """Wait until a condition holds, woken by :meth:`wake` from any thread or by any signal.

    Use it as a context manager: on the main thread it is the signal wakeup fd meanwhile (the
    previous one is put back at exit). On another thread no signal handler runs anyway; only
    :meth:`wake` ends a wait there, and so it is when its pipe could not be made (out of
    descriptors): :attr:`on_signals` is then False.
    """

    def __init__(self) -> None:
        self._read = -1
        self._write = -1
        self._previous: int | None = None  # the wakeup fd before ours; None: ours is not installed
        self._closing = threading.Lock()  # a wake() from another thread never writes to a closed (reused) fd
        self._woken = threading.Event()  # the plain wait's wake-up, when no pipe could be made
        self._entered = False

    def __enter__(self) -> MainThreadWait:
        self._entered = True
        try:
            self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:  # out of descriptors (EMFILE, ENFILE): a plain wait, which wake() alone ends
            logger.warning("cannot make the pipe signals would wake this wait through ({}): waiting without it", exc)
            return self
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._previous is not None:
            signal.set_wakeup_fd(self._previous)
            self._previous = None
        with self._closing:
            for fd in (self._read, self._write):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._read = self._write = -1
        self._entered = False

    @property
    def on_signals(self) -> bool:
        """Whether signals end this wait too (it was entered on the main thread)."""
        return self._previous is not None

    def wake(self) -> None:
        """End the current (or the next) :meth:`until` wait's sleep so it looks again; from any thread.

        Never blocks nor raises: a full pipe already holds a wake-up, a closed one has no waiter.
        """
        with self._closing, contextlib.suppress(OSError):
            self._woken.set()
            if self._write >= 0:
                os.write(self._write, b"\0")

    def until(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` holds; it is asked again after each wake-up and each signal.

        Whatever makes ``done()`` hold must call :meth:`wake` (or be a signal's handler, which runs
        on the main thread: the signal itself wakes the wait).

        Args:
            done: the condition, asked on this thread.

        Raises:
            RuntimeError: used outside its ``with`` block.
        """
        if not self._entered:
            raise RuntimeError("MainThreadWait.until() outside its with-block")
        if self._read < 0:  # no pipe (out of descriptors): a plain wait on wake()
            while not done():
                self._woken.wait()
                self._woken.clear()  # before done() is asked again: a wake() after it is not lost
            return
        poller = select.poll()  # not select(): it refuses a descriptor numbered 1024 or more
        poller.register(self._read, select.POLLIN)
        while not done():  # the loop's jump back runs the handler of a signal that woke the poll
            poller.poll()
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while os.read(self._read, 512):
                    pass

    def until_set(self, event: threading.Event) -> None:
        """Return once ``event`` is set, by anyone: a signal's handler, or any thread, without a word.

        A daemon thread waits on the event and wakes this wait: whoever sets it (a caller's thread, a
        failed gateway's) needs to know nothing of this wait. There is one such thread per event,
        whichever waits use it; it ends once the event is set, so a wait that an exception ends (a
        signal's handler that raised ``KeyboardInterrupt``) leaves it for the next wait on that event.

        Args:
            event: the event.

        Raises:
            BaseException: whatever a signal's handler raised meanwhile (the wait ends with it).
        """
        if not self.on_signals:  # no signal ends a wait here: the event itself is the wait
            event.wait()
            return
        mine: set[MainThreadWait] = set()
        started = False
        try:
            waits = _WATCHED.setdefault(event, mine)
            waits.add(self)  # before the watcher can pop it: it wakes this wait, or the event is set already
            if waits is mine:  # the first wait on this event: its watcher
                threading.Thread(target=_watch, args=(event,), name="stop-event-watch", daemon=True).start()
            started = True
            self.until(event.is_set)
        finally:
            mine.discard(self)
            _WATCHED.get(event, mine).discard(self)
            if not started and _WATCHED.get(event) is mine:
                # Interrupted (a signal's handler raised) between registering and the watcher's start: no
                # watcher may be left behind the entry, or the next wait on this event would find it and
                # start none. Should the watcher have started after all, the next wait starts a second
                # one, which ends at the event's set() too.
                _WATCHED.pop(event, None)
