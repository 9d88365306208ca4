"""A bounded pool of worker threads for blocking work done on an actor's behalf.

Actors must never block their mailbox; a blocking job (a subprocess, a model
call) runs here and reports back with a tell. Threads are created on demand up
to ``max_workers`` and exit after ``idle_seconds`` without work, so the thread
count follows the load, not the number of actors.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from loguru import logger

__all__ = ["WorkerPool"]

_STOP = object()


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
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle_tokens = threading.Semaphore(0)
        self._closed = False
        self._counter = 0

    def submit(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` to run on a worker thread.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"worker pool {self.name!r} is shut down")
            self._jobs.put(fn)
            # An idle worker's token means "a thread is waiting": take it instead of spawning.
            if self._idle_tokens.acquire(blocking=False):
                return
            if len(self._threads) < self.max_workers:
                self._counter += 1
                thread = threading.Thread(target=self._run, name=f"{self.name}-{self._counter}", daemon=True)
                self._threads.add(thread)
                thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_seconds)
            except queue.Empty:
                # Exit only if our idle token is still ours; if a submitter took it a job is coming.
                if self._idle_tokens.acquire(blocking=False):
                    with self._lock:
                        self._threads.discard(me)
                    return
                continue
            if job is _STOP:
                with self._lock:
                    self._threads.discard(me)
                return
            try:
                job()
            except BaseException:  # a job must report its own errors; never kill the worker
                logger.exception("worker job failed")
            self._idle_tokens.release()

    @property
    def thread_count(self) -> int:
        """Threads currently alive in the pool."""
        with self._lock:
            return len(self._threads)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Refuse new jobs, let queued ones finish, and join the threads.

        Returns:
            True when every thread exited within ``timeout``.
        """
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
