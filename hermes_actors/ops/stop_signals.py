"""The stop signals of a process that runs a gateway or the relay hub: one rule for every command.

``serve``, ``send`` and ``room create|send`` without a host (each runs a gateway of its own) and ``relay``
take SIGINT (Ctrl-C), SIGTERM (a service manager's stop, ``timeout``, ``kill``) and SIGHUP (the terminal
closing) alike: the first asks a clean stop (running turns get the stop's grace), and any one received
once the stop runs abandons the running turns. The handlers are installed before the gateway
starts and stay until its stop is over: a signal during the start ends in the same clean stop. Before,
``send`` died at once on a SIGTERM or SIGHUP (its turn's process orphaned, the DM answered "ambiguous"
though it completed), and a signal during ``serve``'s start killed it (its heartbeat left behind) or
ended it without a word.

A command either waits for its own stop event (``serve``, the hub: the first signal sets it) or is
interrupted where it waits (``send``, ``room``: the first signal raises :class:`StopSignalled`, Ctrl-C's
``KeyboardInterrupt`` for the three alike; a start it cuts short is undone by ``Gateway.start``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from enum import Enum
from types import FrameType

__all__ = ["STOP_SIGNALS", "SignalEffect", "StopSignalled", "StopSignals", "signal_effect", "signal_exit_code"]

#: The signals that stop a command cleanly: Ctrl-C, a service manager's stop, and the terminal closing (a hang-up
#: used to kill ``serve`` outright, like a ``kill -9``: a reply on its way became "ambiguous, do not resend").
STOP_SIGNALS = (signal.Signals.SIGINT, signal.Signals.SIGTERM, signal.Signals.SIGHUP)


class SignalEffect(Enum):
    """What one stop signal does (:func:`signal_effect`)."""

    STOP = "stop"  # sets the command's stop event: it stops cleanly once its wait sees it
    INTERRUPT = "interrupt"  # sets it and raises StopSignalled where the command waits
    ABANDON = "abandon"  # the stop under way abandons the running turns (their outcome is ambiguous)


def signal_effect(*, earlier: bool, stopping: bool, interrupts: bool) -> SignalEffect:
    """Pure: what a stop signal does to a command that runs a gateway.

    Args:
        earlier: a stop signal was received before this one.
        stopping: the command's gateway is stopping (:meth:`StopSignals.stopping`).
        interrupts: the command is interrupted where it waits (``send``, ``room``), rather than waiting for
            its stop event (``serve``, the hub).

    Returns:
        ABANDON once the stop runs (whichever signal, or none, asked it); before, the first signal's STOP or
        INTERRUPT, and STOP for a later one: the stop it asked is on its way (a service manager's SIGTERM
        followed at once by a SIGHUP, or a second Ctrl-C during the start, does not abandon turns not yet
        waited for, nor interrupts the command twice).
    """
    if stopping:
        return SignalEffect.ABANDON
    if earlier or not interrupts:
        return SignalEffect.STOP
    return SignalEffect.INTERRUPT


def signal_exit_code(received: signal.Signals) -> int:
    """Pure: the exit code of a command a stop signal interrupted, as a shell reports a process that signal ended.

    Args:
        received: the signal.

    Returns:
        128 + its number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP.
    """
    return 128 + int(received)


class StopSignalled(KeyboardInterrupt):
    """The first stop signal interrupted the command where it waited (for SIGINT, Ctrl-C's ``KeyboardInterrupt``).

    Args:
        received: the signal.
    """

    def __init__(self, received: signal.Signals) -> None:
        super().__init__(received.name)
        self.received = received


class StopSignals:
    """The stop signals one command received, and its handler for them (:data:`STOP_SIGNALS`).

    Args:
        interrupts: the first signal raises :class:`StopSignalled` (besides setting ``stop``).
        stop: the event the first signal sets (a new one when None).
        received: a signal already received (the stop it asked is under way).

    ``received`` is the first signal that asked the stop; one received while a stop runs only abandons its
    turns (``serve`` still starts a failed gateway again after such a stop).
    """

    def __init__(self, *, interrupts: bool = False, stop: threading.Event | None = None,
                 received: signal.Signals | None = None) -> None:
        self.received = received  # the first stop signal; None: none yet
        self.stop = stop if stop is not None else threading.Event()
        self.abandon = threading.Event()  # set by a signal during the stop: it abandons the running turns
        self._interrupts = interrupts
        self._stopping = False

    @contextlib.contextmanager
    def routed(self) -> Iterator[StopSignals]:
        """Route the stop signals to this handler meanwhile; the previous handlers are put back after.

        Only the main thread can install handlers: elsewhere this does nothing (no handler would run there).

        Yields:
            self.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        saved = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, previous in saved.items():
                signal.signal(sig, previous)

    @contextlib.contextmanager
    def stopping(self) -> Iterator[StopSignals]:
        """While the gateway stops: every stop signal abandons its running turns (the handler routed meanwhile).

        Yields:
            self.
        """
        before, self._stopping = self._stopping, True
        try:
            with self.routed():
                yield self
        finally:
            self._stopping = before

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        """The handler (on the main thread).

        Raises:
            StopSignalled: the first signal, for a command that :data:`SignalEffect.INTERRUPT` applies to.
        """
        received = signal.Signals(signum)
        effect = signal_effect(earlier=self.received is not None, stopping=self._stopping,
                               interrupts=self._interrupts)
        if effect is SignalEffect.ABANDON:  # received stays what asked the stop (None: a failed gateway's stop,
            self.abandon.set()  # after which serve starts a new one)
            return
        if self.received is None:
            self.received = received
        self.stop.set()
        if effect is SignalEffect.INTERRUPT:
            raise StopSignalled(received)
