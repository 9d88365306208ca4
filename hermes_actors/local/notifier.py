"""Subscriber callbacks: one NotifierActor per ``Gateway.subscribe``, told by the :class:`Notifier` fan-out.

Each subscription gets an actor (a thread) of its own, started when it subscribes and stopped when
it unsubscribes or the gateway stops. A slow or stuck callback only delays its own later
notifications: every other subscriber, and every actor, goes on. The Dispatcher tells each burst of
outcomes once, to :meth:`Notifier.tell`, which hands that same immutable message to each
subscriber's actor: one tell per burst per subscriber, never a thread per event.

A callback sees outcomes in arrival order, each as a dict of its own (a callback that changes its
dict never changes another's). A raising one is logged and counted (``subscriber_errors``) and stays
subscribed: that holds for ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` too, because
a ``BaseException`` escaping an actor's handler makes pykka stop every actor in the process, other
gateways included. User code never stops the actors.

The threads are daemon threads: ``Gateway.stop`` waits for the callbacks within its timeout, then
leaves one still running behind, and a callback that never returns cannot keep the process from
exiting (what was queued behind it follows if it returns while the process lives).

The backlog is bounded per subscriber: when more than ``max_backlog`` notifications wait behind a
slow callback, the oldest are skipped (counted and logged) until it catches up. The outcomes
themselves are never lost: ``wait_outcome`` still answers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, TypedActor, ask_later, handles, tell
from hermes_actors.core.outcomes import delivery_details
from hermes_actors.messages import Flush, Notify, NotifyOutcomes

__all__ = ["Notifier", "NotifierActor", "NotifierCounts", "SubscriberCounts", "in_subscriber_callback"]

_calling = threading.local()  # .active: this thread is a subscriber's, running its callback
_STOP_WAIT = 10.0  # seconds a stop waits, at most, for the subscriber actors that caught up to end

Counters = tuple[int, int, int]  # (notified, skipped, errors)


def in_subscriber_callback() -> bool:
    """Whether the calling thread is a subscriber's NotifierActor, running its callback.

    ``Gateway.stop`` called from a callback must not wait for that callback: it is this very thread.
    """
    return bool(getattr(_calling, "active", False))


def _summed(a: Counters, b: Counters) -> Counters:
    """Pure: two counter tuples added up."""
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


class SubscriberCounts:
    """One subscriber actor's counters, published for any thread to read.

    Written by that actor alone, as one tuple replaced after each change, never changed in place:
    the reader needs no lock.
    """

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: Counters = (0, 0, 0)


class NotifierCounts:
    """The counters of every subscriber actor of one gateway, summed for ``Gateway.stats()``.

    ``stats()`` must not wait behind a callback that runs (or hangs) on a subscriber's thread, so it
    reads these instead of asking the actors. The lock guards the table only (an actor joining, or
    folding in its last counters as it ends); each actor publishes to its own :class:`SubscriberCounts`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, SubscriberCounts] = {}  # token → the counters of a subscriber actor not ended
        self._ended: Counters = (0, 0, 0)  # those of the ended ones: the totals never go down

    def open(self, token: int) -> SubscriberCounts:
        """The counters a new subscriber actor publishes to.

        Args:
            token: the subscription's token.

        Returns:
            Its :class:`SubscriberCounts`, counted from now on.
        """
        cell = SubscriberCounts()
        with self._lock:
            self._live[token] = cell
        return cell

    def close(self, token: int) -> None:
        """Fold an ended subscriber actor's last counters into the totals (idempotent).

        Args:
            token: the subscription's token.
        """
        with self._lock:
            cell = self._live.pop(token, None)
            if cell is not None:
                self._ended = _summed(self._ended, cell.values)

    def as_dict(self) -> dict[str, int]:
        """``{"notified", "notify_skipped", "subscriber_errors"}``, summed over every subscriber.

        Returns:
            notified: callback calls made (an outcome two subscribers got counts twice);
            notify_skipped: notifications shed behind a slow subscriber;
            subscriber_errors: callback calls that raised.
        """
        with self._lock:
            total = self._ended
            for cell in self._live.values():
                total = _summed(total, cell.values)
        notified, skipped, errors = total
        return {"notified": notified, "notify_skipped": skipped, "subscriber_errors": errors}


class NotifierActor(TypedActor):
    """Runs one subscriber's callback, on a daemon thread of its own.

    Args:
        token: the subscription's token (names it in the log and the counters).
        callback: the subscriber's callback.
        details: put ``sender``, ``target`` and ``latency_seconds`` in the outcome dicts it gets.
        max_backlog: notifications allowed to wait behind this callback.
        counts: where its counters are published (see :class:`NotifierCounts`).
    """

    use_daemon_thread = True  # pykka: a callback that never returns must not keep the process from exiting

    def __init__(
        self,
        token: int,
        callback: Callable[[dict[str, Any]], Any],
        *,
        details: bool = False,
        max_backlog: int = 100_000,
        counts: NotifierCounts,
    ) -> None:
        super().__init__()
        self.token = token
        self.callback = callback
        self.details = details
        self.max_backlog = max_backlog
        self.counts = counts
        self.cell = counts.open(token)
        self.notified = 0
        self.skipped = 0
        self.callback_errors = 0  # calls that raised (any BaseException)

    def on_stop(self) -> None:
        self.counts.close(self.token)

    @handles(Notify)
    def _on_notify(self, msg: Notify) -> None:
        if self._shed(1):
            return
        # A room event is passed as it is (the fan-out tells it only to who asked for them); anything else is a DM's
        event = msg.outcome if msg.outcome.get("kind") == "room" else {"kind": "dm", **msg.outcome}
        self._call([{**event, **msg.details} if self.details else dict(event)])

    @handles(NotifyOutcomes)
    def _on_outcomes(self, msg: NotifyOutcomes) -> None:
        if self._shed(len(msg.notes)):
            return
        if self.details:  # built only for a subscriber that asked for them
            self._call({"kind": "dm", **outcome, **delivery_details(delivery, published)}
                       for outcome, delivery, published in msg.notes)
        else:  # the outcome dicts are shared by every subscriber: each gets a copy of its own
            self._call({"kind": "dm", **outcome} for outcome, _, _ in msg.notes)

    def _shed(self, count: int) -> bool:
        """Skip ``count`` notifications when the backlog is over its bound (a stuck callback)."""
        if self.mailbox_size() <= self.max_backlog:
            return False
        before, self.skipped = self.skipped, self.skipped + count  # memory must not grow without bound
        self._publish()
        if before == 0 or before // 1000 != self.skipped // 1000:
            logger.error(
                "subscriber {} is too slow: {} notification(s) skipped so far (backlog over {}); "
                "the outcomes stay available through wait_outcome",
                self.token,
                self.skipped,
                self.max_backlog,
            )
        return True

    def _call(self, payloads: Iterable[dict[str, Any]]) -> None:
        """Call the callback with each payload, in order; whatever it raises is logged and counted."""
        _calling.active = True
        try:
            for payload in payloads:
                try:
                    self.callback(payload)
                except BaseException:  # user code: even SystemExit must not stop the actors
                    self.callback_errors += 1
                    logger.exception("outcome subscriber {} raised; it stays subscribed", self.token)
                self.notified += 1
        finally:
            _calling.active = False
        self._publish()

    def _publish(self) -> None:
        self.cell.values = (self.notified, self.skipped, self.callback_errors)

    @handles(Flush)
    def _on_flush(self, msg: Flush) -> int:
        return self.notified


class Notifier:
    """The subscriber actors of one gateway, and the fan-out that tells them; any thread may call it.

    Args:
        max_backlog: notifications allowed to wait behind each slow subscriber.
        counts: where every subscriber actor publishes its counters.
    """

    def __init__(self, max_backlog: int = 100_000, counts: NotifierCounts | None = None) -> None:
        self.max_backlog = max_backlog
        self.counts = counts if counts is not None else NotifierCounts()
        self._lock = threading.Lock()  # add, remove, stop; tell reads the tuples below without it
        self._actors: dict[int, tuple[pykka.ActorRef[Any], bool]] = {}  # token → (its actor, wants room events)
        # Replaced whole under the lock, never changed in place: the Dispatcher's tell reads them as they are
        self._everyone: tuple[pykka.ActorRef[Any], ...] = ()
        self._room_watchers: tuple[pykka.ActorRef[Any], ...] = ()
        self._stopped = False

    def add(self, token: int, callback: Callable[[dict[str, Any]], Any], details: bool = False,
            rooms: bool = False) -> bool:
        """Start the subscriber's actor: ``callback`` gets every notification told from now on.

        Args:
            token: the subscription's token.
            callback: the subscriber's callback.
            details: put ``sender``, ``target`` and ``latency_seconds`` in its outcome dicts.
            rooms: also give it the group rooms' events.

        Returns:
            False once the Notifier stopped (nothing started).
        """
        with self._lock:
            if self._stopped:
                return False
            ref = NotifierActor.start(token, callback, details=details, max_backlog=self.max_backlog,
                                      counts=self.counts)
            self._actors[token] = (ref, rooms)
            self._index()
        return True

    def remove(self, token: int) -> None:
        """Stop the subscriber's actor once it has run what it was told before (idempotent).

        Args:
            token: the subscription's token.
        """
        with self._lock:
            entry = self._actors.pop(token, None)
            if entry is None:
                return
            self._index()
        entry[0].stop(block=False)  # never waits: this may be that very subscriber's callback

    def _index(self) -> None:
        """Rebuild who gets what (under the lock)."""
        self._everyone = tuple(ref for ref, _ in self._actors.values())
        self._room_watchers = tuple(ref for ref, rooms in self._actors.values() if rooms)

    def tell(self, message: Notify | NotifyOutcomes) -> None:
        """Hand ``message`` to every subscriber that wants it: one tell each, never a wait.

        Args:
            message: DM outcomes (every subscriber), or one event (a room's: those subscribed with ``rooms``).
        """
        room_event = isinstance(message, Notify) and message.outcome.get("kind") == "room"
        for ref in self._room_watchers if room_event else self._everyone:
            tell(ref, message)  # one unsubscribed meanwhile is gone: it wants nothing more

    def flush(self, timeout: float) -> int:
        """Let every subscriber's callback catch up with what was told before, for ``timeout`` seconds in all.

        Args:
            timeout: seconds, for all the subscribers together (they catch up side by side).

        Returns:
            How many subscribers were still in a callback at the deadline (0: every one caught up).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            refs = list(self._everyone)
        replies = []
        for ref in refs:
            with contextlib.suppress(ActorGone):  # unsubscribed meanwhile: nothing to wait for
                replies.append(ask_later(ref, Flush()))
        busy = 0
        for reply in replies:
            try:
                reply.get(timeout=max(0.0, deadline - time.monotonic()))
            except AskTimeout:
                busy += 1
            except ActorGone:
                continue
        return busy

    def stop(self, *, wait: bool) -> None:
        """Stop every subscriber's actor once it has run what it was told; nothing is added after this.

        Args:
            wait: wait (up to 10 s) for them to end. False when a callback may still run (it may never
                return): its daemon thread is left behind, and ends once the callback returns.
        """
        with self._lock:
            self._stopped = True
            refs = list(self._everyone)
            self._actors.clear()
            self._index()
        stops = [ref.stop(block=False) for ref in refs]
        if not wait:
            return
        deadline = time.monotonic() + _STOP_WAIT
        for ref, stopping in zip(refs, stops, strict=True):
            try:
                stopping.get(timeout=max(0.0, deadline - time.monotonic()))
            except pykka.Timeout:
                logger.warning("{} did not stop within {:g}s", ref, _STOP_WAIT)
