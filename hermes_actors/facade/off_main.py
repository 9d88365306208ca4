"""A Gateway's calls made on the main thread run on a thread of their own, the main thread only waiting.

Python runs signal handlers on the main thread, between two bytecodes, and the exception one raises
(Ctrl-C's ``KeyboardInterrupt``) can land just after a lock was taken and before the ``with`` that
releases it began: a mailbox's lock (pykka's inbox is a ``queue.Queue``, whose lock is taken inside
a Python-level ``Condition.__enter__``) taken by ``message_agent`` on the main thread then stayed
taken, and every sender, the journal's writer and the stop waited on it for good. So a call made on
the main thread is put on a ``SimpleQueue`` (its ``put`` is one C call: nothing to interrupt half-way)
for the gateway's call thread, and the main thread waits on a lock of its own: an interrupt ends that
wait only, and the call itself finishes on the call thread (its result is dropped). A signal
handler's own call queues behind the call it interrupted, instead of waiting on its locks.

Calls from any other thread run where they are made, as before.
"""

from __future__ import annotations

import _thread
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["OffMainThread"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], list[tuple[bool, Any]], Any, bool]  # call, result box, lock to release, last


class OffMainThread:
    """Runs the main thread's calls on one daemon thread while the gateway runs (its lifetime is the gateway's).

    Started by the first such call; ended by the stop (:meth:`run` with ``last``, or :meth:`close`), after
    which calls run where they are made again (no actor is left whose mailbox could be wedged). A call made
    while the call thread still runs one whose wait was interrupted (a ``wait_outcome`` of minutes, left by
    a Ctrl-C) gets a thread of its own: the stop that follows is never queued behind it.

    Args:
        name: the call thread's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._spares: queue.SimpleQueue[_Job | None] | None = None  # calls for a thread of their own
        self._thread: threading.Thread | None = None
        self._pid = 0  # the process whose thread serves ``_jobs`` (a fork's child has no threads but its own)
        self._closed = False
        self._busy = False  # the call thread runs a call (set and cleared by it)

    def run(self, call: Callable[[], T], *, last: bool = False) -> T:
        """``call()``; on the main thread, run by the call thread while this thread waits.

        Args:
            call: the gateway call.
            last: the gateway's stop: the call thread ends after it (this thread waits for that too).

        Returns:
            What ``call`` returned.

        Raises:
            BaseException: what ``call`` raised; on the main thread also what a signal handler raised while
                it waited (the call goes on and its result is dropped).
        """
        if self._closed or threading.current_thread() is not threading.main_thread():
            try:
                return call()
            finally:
                if last:
                    self.close()
        done = _thread.allocate_lock()
        done.acquire()
        box: list[tuple[bool, Any]] = []
        job: _Job = (call, box, done, last)
        jobs, spares, thread = self._queues()
        spare = self._busy
        if spare:  # an interrupted call still runs there: this one gets a thread of its own, not a wait behind
            spares.put(job)  # started by the spare starter: Thread.start() waits on a Python-level lock, not here
            if last:
                self.close()
        else:
            if last:
                # From here the main thread's calls run where they are made, though the stop has not begun: a
                # signal handler's message_agent meanwhile journals on the main thread (store/journal.py keeps
                # its main-thread path for it).
                self._closed = True
                spares.put(None)  # the spare starter ends with the gateway too
            jobs.put(job)
        done.acquire()  # an interrupt here ends this wait only
        if last and not spare:
            thread.join()
        ok, value = box[0]
        if ok:
            return value
        raise value

    def close(self) -> None:
        """End the call thread once the calls queued before are done (not waited for: one may be a long
        ``wait_outcome``, and the stop must not wait for it); later calls run where they are made."""
        self._closed = True
        jobs, spares = self._jobs, self._spares
        if jobs is not None and spares is not None and self._pid == os.getpid():
            jobs.put(None)
            spares.put(None)

    def _queues(self) -> tuple[queue.SimpleQueue[_Job | None], queue.SimpleQueue[_Job | None], threading.Thread]:
        # Only the main thread comes here: no lock needed to start the threads once per process.
        if self._jobs is None or self._spares is None or self._thread is None or self._pid != os.getpid():
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            spares: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            thread = threading.Thread(target=self._serve, args=(jobs,), name=self.name, daemon=True)
            thread.start()  # kept only once started: a start an interrupt cut short is made again next time
            threading.Thread(target=self._start_spares, args=(spares,), name=f"{self.name}-spares", daemon=True).start()
            self._jobs, self._spares, self._thread, self._pid = jobs, spares, thread, os.getpid()
        return self._jobs, self._spares, self._thread

    def _start_spares(self, spares: queue.SimpleQueue[_Job | None]) -> None:
        """The spare starter: a thread for each call made while the call thread was busy."""
        while (job := spares.get()) is not None:
            threading.Thread(target=self._serve_one, args=(job,), name=f"{self.name}-spare", daemon=True).start()

    def _serve(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        """The call thread: run each job in turn; end at the last one (or at ``None``)."""
        while True:
            job = jobs.get()
            if job is None:
                return
            self._busy = True
            self._serve_one(job, on_call_thread=True)
            if job[3]:
                return

    def _serve_one(self, job: _Job, *, on_call_thread: bool = False) -> None:
        """Run one job, hand back its result or exception and release its waiter."""
        call, box, done, _last = job
        try:
            box.append((True, call()))
        except BaseException as exc:  # the caller's to see, as if it had run the call itself
            box.append((False, exc))
        finally:
            if on_call_thread:
                self._busy = False  # before the waiter goes on: its next call must find the call thread free
            done.release()
