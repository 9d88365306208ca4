"""The subscribers and live owners an embedder registers on a Gateway, before or after its start.

:class:`Registrations` keeps those given before the start until ``Gateway.start`` hands them
to the actor system (a live owner is then attached before the journal is recovered), and
makes a registration from another thread wait while a start is under way (that start has
already read what was registered: a registration then would land in a dict nobody reads
again). Once the gateway runs, a subscriber gets its NotifierActor at once.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from hermes_actors.core.names import profile_key
from hermes_actors.local.notifier import Notifier

__all__ = ["Registrations", "SubscriberEntry"]

# A subscriber as ``Notifier.add`` takes it: (callback, details, rooms) (see ``Gateway.subscribe``).
SubscriberEntry = tuple[Callable[[dict[str, Any]], Any], bool, bool]


class Registrations:
    """The subscribers and live owners given before ``start()``, and whether a start is under way.

    Every method takes the one condition lock; none is on the message path.
    """

    def __init__(self) -> None:
        self._tokens = itertools.count(1)
        self._lock = threading.Condition()
        self._subscribers: dict[int, SubscriberEntry] = {}
        # profile key (``core.names.profile_key``: "Bob", "@bob" and "bob" are one) → (the name as given, owner),
        # so a detach before the start finds the owner however its name was spelt, as it does once started
        self._owners: dict[str, tuple[str, Any]] = {}
        self._starting: int | None = None  # the thread id of a start() under way

    def begin_start(self) -> tuple[dict[int, SubscriberEntry], dict[str, Any]]:
        """Mark a start under way on this thread and return (copies of) what was registered so far.

        Returns:
            (subscribers: token → entry, owners: profile (as given) → owner).
        """
        with self._lock:
            self._starting = threading.get_ident()
            return dict(self._subscribers), dict(self._owners.values())

    def taken(self, subscribers: dict[int, SubscriberEntry], owners: dict[str, Any]) -> None:
        """Forget what a successful start handed to the system (a failed start keeps it for the next one).

        Args:
            subscribers: the subscribers :meth:`begin_start` returned.
            owners: the owners :meth:`begin_start` returned.
        """
        with self._lock:
            for token in subscribers:
                self._subscribers.pop(token, None)
            for profile in owners:
                self._owners.pop(profile_key(profile), None)

    def end_start(self) -> None:
        """The start under way ended (started or failed): wake the registrations waiting for it."""
        with self._lock:
            self._starting = None
            self._lock.notify_all()

    def _before_start(self, register: Callable[[], object], is_new: Callable[[], bool]) -> bool:
        """Run ``register`` (under the lock) if the gateway has not started.

        A start() under way on another thread has already read what was registered: wait for it
        to end first (then the gateway runs, or it failed and is still new).

        Args:
            register: what to record.
            is_new: whether the gateway is still new (never started, not stopped).

        Returns:
            True when ``register`` ran; False when the gateway has started (or stopped).
        """
        with self._lock:
            while self._starting is not None and self._starting != threading.get_ident():
                self._lock.wait()
            if is_new() and self._starting is None:
                register()
                return True
            return False

    def subscribe(self, entry: SubscriberEntry, is_new: Callable[[], bool],
                  notifier: Callable[[], Notifier | None]) -> Callable[[], None]:
        """Keep a subscriber for the start, or start its NotifierActor at once (see ``Gateway.subscribe``).

        Args:
            entry: (callback, details, rooms).
            is_new: whether the gateway is still new (never started, not stopped).
            notifier: the running subscribers' Notifier, None once stopped.

        Returns:
            A function that unsubscribes.

        Raises:
            RuntimeError: the gateway stopped meanwhile.
        """
        token = next(self._tokens)
        if not self._before_start(lambda: self._subscribers.__setitem__(token, entry), is_new):
            current = notifier()
            if current is None or not current.add(token, *entry):  # stopped meanwhile
                raise RuntimeError("gateway is not running; subscribe before start() or while it runs")

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(token, None)
            current = notifier()
            if current is not None:
                current.remove(token)

        return unsubscribe

    def attach_owner(self, profile: str, owner: Any, is_new: Callable[[], bool]) -> bool:
        """Keep a live owner for the start, if the gateway has not started (it replaces one kept under another
        spelling of the name, as an attach does once started). Returns whether it was kept."""
        return self._before_start(lambda: self._owners.__setitem__(profile_key(profile), (profile, owner)), is_new)

    def detach_owner(self, profile: str, is_new: Callable[[], bool]) -> bool:
        """Forget the live owner kept for the start under any spelling of ``profile`` (none kept: nothing to do;
        the name is checked against the root's profiles only by the start), if the gateway has not started.
        Returns whether it had not."""
        return self._before_start(lambda: self._owners.pop(profile_key(profile), None), is_new)
