"""A gateway's start runs on a thread of its own, so a Ctrl-C cannot cut it between two steps.

Python runs signal handlers (Ctrl-C's ``KeyboardInterrupt``, or whatever an embedder's handler raises) on the
main thread only, between any two bytecodes: one raised while ``start()`` was partway could land between an
actor's thread starting and the start recording it, and nothing stopped that actor (a non-daemon thread: the
process never exited). The start's own thread is never interrupted; the caller waits for it. Interrupted
meanwhile, the caller abandons the start: the start's thread builds on, then undoes what it built instead of
committing it, and the caller re-raises once that is done.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

__all__ = ["StartRun"]


_AWAKE_SECONDS = 0.1  # how often a waiting main thread runs the signal handlers a Ctrl-C left pending


def _wait_awake(done: threading.Event) -> None:
    """Wait for ``done`` in short waits: a signal the kernel delivered to another thread (the start's, an
    actor's) runs its handler only once the main thread runs again, which one long wait would hold off until
    the start is over.

    Args:
        done: the event to wait for.
    """
    while not done.wait(_AWAKE_SECONDS):
        pass


class StartRun:
    """One ``start()``: its thread, whether the caller abandoned it, and whether it committed.

    Usage: the caller calls :meth:`run` with the body; the body, on the start's thread, calls :meth:`commit`
    as its last step and undoes what it built when that returns False.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # orders the caller's abandon against the body's begin and commit
        self._began = False
        self._abandoned = False
        self.committed = False
        self._done = threading.Event()
        self._error: BaseException | None = None

    def run(self, body: Callable[[StartRun], None], *, name: str) -> None:
        """Run ``body(self)`` on a thread of its own and wait for it.

        Args:
            body: the start; it leaves nothing running when it raises, or when :meth:`commit` refused.
            name: the thread's name.

        Raises:
            BaseException: what ``body`` raised; or what interrupted this thread's wait (a ``KeyboardInterrupt``),
                re-raised once the start undid what it built (a second one ends that wait: the start still
                undoes it, on its own thread).
        """
        context = contextvars.copy_context()  # the caller's logging context (loguru's contextualize) goes along
        # Not a daemon: a start abandoned as the interpreter exits still undoes what it built.
        thread = threading.Thread(target=self._body, args=(context, body), name=name)
        try:
            thread.start()
            _wait_awake(self._done)
            thread.join()  # it is ending: a start() that returned leaves no thread of its own behind
        except BaseException:
            with self._lock:
                self._abandoned = True
                began = self._began
            if began:  # else it never builds anything: it sees the abandon first
                _wait_awake(self._done)
            raise
        if self._error is not None:
            raise self._error

    def _body(self, context: contextvars.Context, body: Callable[[StartRun], None]) -> None:
        """The start's thread: run ``body`` unless the caller abandoned the start before it began."""
        with self._lock:
            if self._abandoned:
                self._done.set()
                return
            self._began = True
        try:
            context.run(body, self)
        except BaseException as error:  # handed to the caller, which re-raises it
            self._error = error
        finally:
            self._done.set()

    def commit(self, commit: Callable[[], None]) -> bool:
        """On the start's thread, its last step: ``commit()`` unless the caller abandoned the start.

        Args:
            commit: what makes the started gateway visible (its state set to running); it must not fail.

        Returns:
            True once committed; False when abandoned (the body then undoes what it built).
        """
        with self._lock:
            if self._abandoned:
                return False
            commit()
            self.committed = True
            return True

    def wait_done(self) -> None:
        """Wait until the start's thread is done (an abandoned start: until it undid what it built)."""
        with self._lock:
            began = self._began
        if began:
            self._done.wait()
