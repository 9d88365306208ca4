"""The ``message_agent`` calls in flight on a Gateway, which its stop (and a failing Dispatcher) waits for.

A call past its state check still hands its DM to the Dispatcher; waiting for those calls
(µs each) puts their DMs in before the Dispatcher stops accepting, so each acked DM gets
its outcome (``cancelled`` if it never ran) instead of an ack followed by nothing.
"""

from __future__ import annotations

import threading
import time

from loguru import logger

from hermes_actors.core.backoff import doubling

__all__ = ["SendsInFlight"]


class SendsInFlight:
    """The calls between :meth:`begin` and :meth:`end`.

    A set (add/discard are atomic) and no lock: the senders never contend on the hot path.
    """

    def __init__(self) -> None:
        self._calls: set[object] = set()
        # ``call``: the call this thread is in. A finalizer (``__del__``) can run in the middle of it, on this
        # thread, while it holds a mailbox's lock (pykka's inbox, a non-reentrant lock): a send from there would
        # wait on that lock forever, so :meth:`begin` refuses it.
        self._inside = threading.local()

    def begin(self) -> object:
        """A call begins (before its state check: a stop sees this call, or this call sees the stop).

        Returns:
            The call's token, for :meth:`end`.

        Raises:
            RuntimeError: this thread is inside a call already: a finalizer (``__del__``) that ran during that
                call calls again, where the interrupted call may hold a lock the new one needs (a mailbox's:
                it waited forever). Nothing is sent. (A signal handler's call on the main thread queues on
                the gateway's call thread instead, facade/off_main.py, except in the moment between a stop
                the main thread asked closing that thread and the stop's beginning: a handler interrupting
                another handler's send then comes here too.)
        """
        if getattr(self._inside, "call", None) is not None:
            raise RuntimeError(
                "message_agent was called on a thread already inside message_agent: a finalizer (__del__) or a "
                "signal handler ran in the middle of that call, whose locks the new one would wait for forever. "
                "Nothing was sent — send from another thread (e.g. have the finalizer or handler set an event, "
                "or put the DM on a queue, that a worker thread waits on)"
            )
        call = object()
        self._calls.add(call)
        self._inside.call = call
        return call

    def end(self, call: object) -> None:
        """The call with this token ended (its DM handed over, or refused)."""
        self._calls.discard(call)
        self._inside.call = None

    def await_all(self, timeout: float) -> None:
        """Let the calls that began before now hand their DM over (a few µs each).

        Only those: a call that begins after this one began sees the stop (or the failure) and is refused,
        so it is not waited for. Before, the set had to be empty: senders that kept retrying (a server loop
        resending on each ``RuntimeError``) kept it full, and a stop waited out ``timeout`` (30 s) for calls
        that would only be refused.

        Only a call that waits for a stalled journal commit takes longer; ``timeout`` bounds that
        wait (then a warning says how many are still in flight).

        Args:
            timeout: seconds to wait at most.
        """
        deadline = time.monotonic() + timeout
        delays = doubling(0.0001, 0.02)
        earlier = self._calls.copy()  # one C call under the GIL: the senders' add/discard never tear it
        while earlier:  # no event to wait on: the senders take no lock, by design
            earlier.intersection_update(self._calls)  # those still in flight (likewise one C call)
            if not earlier:
                return
            if time.monotonic() >= deadline:
                logger.warning("{} message_agent call(s) still in flight after {:g}s", len(earlier), timeout)
                return
            time.sleep(next(delays))
