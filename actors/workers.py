"""A bounded pool of worker threads for blocking work done on an actor's behalf.

Actors must never block their mailbox; a blocking job (a subprocess, a model
call) runs here and reports back with a tell. Threads are created on demand up
to ``max_workers`` and exit after ``idle_seconds`` without work, so the thread
count follows the load, not the number of actors.

A job that raises (any ``BaseException``, ``SystemExit`` included) never kills
its worker thread: the error goes to the job's ``on_error`` callback, is logged,
and is counted in :attr:`WorkerPool.failed_jobs`. (A ``KeyboardInterrupt`` there too: a
worker is never the main thread, where a Ctrl-C lands, so it was raised by the job itself.)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from loguru import logger

__all__ = ["WorkerPool"]


class WorkerPool:
    """Run callables on up to ``max_workers`` daemon threads.

    Args:
        max_workers: the thread cap.
        idle_seconds: an idle thread exits after this long.
        name: thread name prefix.
    """

    def __init__(self, max_workers: int = 32, *, idle_seconds: float = 30.0, name: str = "worker") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.idle_seconds = idle_seconds
        self.name = name
        self._jobs: deque[tuple[Callable[[], Any], Callable[[BaseException], Any] | None]] = deque()
        self._lock = threading.Condition()  # guards the queue, the thread set and the idle count
        self._threads: set[threading.Thread] = set()  # threads in _run
        self._booting: set[threading.Thread] = set()  # threads handed to start() that have not entered _run yet
        self._idle = 0  # threads waiting for a job right now
        self._closed = False
        self._counter = 0
        self._failed = 0

    def submit(self, fn: Callable[[], Any], *, on_error: Callable[[BaseException], Any] | None = None) -> None:
        """Queue ``fn`` to run on a worker thread.

        Args:
            fn: the job.
            on_error: called on the worker thread with whatever ``fn`` raised (any
                ``BaseException``), e.g. to tell the owning actor. Without it the error
                is only logged. An error raised by ``on_error`` itself is logged.

        Raises:
            RuntimeError: after :meth:`shutdown`; or no thread could be started and none is left
                to run the job (it is not queued then).
        """
        thread = None
        job = (fn, on_error)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"worker pool {self.name!r} is shut down")
            self._jobs.append(job)
            # Spawn only when the queued jobs outnumber the threads waiting for work.
            # (Counted under the lock: a stale "idle" token must never stand in for a thread.)
            if len(self._jobs) > self._idle and len(self._threads) + len(self._booting) < self.max_workers:
                self._counter += 1
                thread = threading.Thread(target=self._run, name=f"{self.name}-{self._counter}", daemon=True)
                self._booting.add(thread)
            else:
                self._lock.notify()
        if thread is not None:
            # Started outside the lock: Thread.start() waits for the new thread to boot, and the
            # new thread's first act is to take this lock — the submitter must not hold it then.
            try:
                thread.start()
            except BaseException as error:
                self._unboot(thread, job, error)

    def _unboot(self, thread: threading.Thread, job: tuple[Callable[[], Any], Any], error: BaseException) -> None:
        """``thread.start()`` raised ``error``: free its place; raise it on unless ``job`` stays queued.

        The job stays queued when a thread is left to run it (it is then only raised on when it is not
        an ``Exception``: a Ctrl-C); with none left, it is taken out of the queue and ``error`` raised.
        """
        with self._lock:
            self._booting.discard(thread)
            self._lock.notify_all()  # a shutdown() waiting for the boots
            queued = bool(self._threads or self._booting)
            if not queued:
                try:
                    self._jobs.remove(job)  # nobody is left to run it: not queued
                except ValueError:
                    queued = True  # a thread that has exited since took it
        if queued:
            logger.warning("worker pool {!r}: a thread could not be started ({!r}); the job waits for a running "
                           "one", self.name, error)
            if isinstance(error, Exception):
                return
        raise error

    def _run(self) -> None:
        me = threading.current_thread()
        with self._lock:
            self._booting.discard(me)
            self._threads.add(me)
            self._lock.notify_all()  # a shutdown() waiting for the boots
        while True:
            with self._lock:
                deadline = time.monotonic() + self.idle_seconds
                while not self._jobs:
                    remaining = deadline - time.monotonic()
                    if self._closed or remaining <= 0:  # queued jobs are finished before shutdown exits
                        self._threads.discard(me)
                        return
                    self._idle += 1
                    try:
                        self._lock.wait(remaining)
                    finally:
                        self._idle -= 1
                job, on_error = self._jobs.popleft()
            try:
                job()
            except BaseException as error:  # reported, never kills the worker
                self._report(error, on_error)
            del job, on_error

    def _report(self, error: BaseException, on_error: Callable[[BaseException], Any] | None) -> None:
        with self._lock:
            self._failed += 1
        logger.opt(exception=error).error("worker job failed: {!r}", error)
        if on_error is None:
            return
        try:
            on_error(error)
        except BaseException:
            logger.opt(exception=True).error("worker job on_error callback failed")

    @property
    def failed_jobs(self) -> int:
        """How many jobs raised since the pool was made."""
        with self._lock:
            return self._failed

    @property
    def thread_count(self) -> int:
        """Threads currently alive in the pool (those starting included)."""
        with self._lock:
            return len(self._threads) + len(self._booting)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Refuse new jobs, let queued ones finish, and join the threads.

        Called from one of the pool's own threads (a job that shuts its pool down), that thread is not
        joined (it cannot be: ``RuntimeError: cannot join current thread``, which skipped whatever its
        caller had left to stop); it exits once its job returns.

        Returns:
            True when every thread exited within ``timeout`` (False when called from one of them).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            # A thread a submit() is starting right now cannot be joined yet: wait for it to run (or fail).
            booted = self._lock.wait_for(lambda: not self._booting, timeout=max(0.0, deadline - time.monotonic()))
            threads = list(self._threads)
        if not booted:
            return False
        me = threading.current_thread()
        for thread in threads:
            if thread is not me:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
