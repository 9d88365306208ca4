"""NotifierActor: runs ``Gateway.subscribe`` callbacks on its own thread.

Callbacks see outcomes in arrival order. A slow callback only delays later
callbacks, never an actor (the Dispatcher tells and moves on). A raising one is
logged and counted (``callback_errors``) and the others still run: that holds
for ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` too, because a
``BaseException`` escaping an actor's handler makes pykka stop every actor in
the process, other gateways included. User code never stops the actors.

The backlog is bounded: when more than ``max_backlog`` notifications wait behind
a slow subscriber, the oldest are skipped (counted and logged) until it catches
up. The outcomes themselves are never lost: ``wait_outcome`` still answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from loguru import logger

from actors import TypedActor, handles
from hermes_actors.core.outcomes import delivery_details
from hermes_actors.messages import AddSubscriber, Flush, Notify, NotifyOutcomes, RemoveSubscriber

__all__ = ["NotifierActor", "NotifierCounts", "in_subscriber_callback"]

_calling = threading.local()  # .active: this thread is running a subscriber callback


def in_subscriber_callback() -> bool:
    """Whether the calling thread is the Notifier's, running a subscriber callback.

    ``Gateway.stop`` called from a callback must not wait for the Notifier: it is that thread.
    """
    return bool(getattr(_calling, "active", False))


class NotifierCounts:
    """The Notifier's counters, published for any thread to read.

    ``Gateway.stats()`` must not wait behind a subscriber callback that runs (or hangs) on the
    Notifier's thread, so it reads these instead of asking the actor. Written by the Notifier
    alone, as one tuple replaced after each change, never changed in place.
    """

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values = (0, 0, 0)

    def publish(self, notified: int, skipped: int, errors: int) -> None:
        """Replace the counters (the Notifier's thread only)."""
        self._values = (notified, skipped, errors)

    def as_dict(self) -> dict[str, int]:
        """``{"notified", "notify_skipped", "subscriber_errors"}`` as last published."""
        notified, skipped, errors = self._values
        return {"notified": notified, "notify_skipped": skipped, "subscriber_errors": errors}


class NotifierActor(TypedActor):
    """Owns the subscriber list.

    Args:
        max_backlog: notifications allowed to wait behind a slow subscriber.
        counts: where its counters are published (see :class:`NotifierCounts`).
    """

    def __init__(self, max_backlog: int = 100_000, counts: NotifierCounts | None = None) -> None:
        super().__init__()
        self.counts = counts if counts is not None else NotifierCounts()
        self.subscribers: dict[int, Callable[[dict[str, Any]], Any]] = {}
        self.wants_details: set[int] = set()  # subscribers whose dicts carry sender, target, latency_seconds
        self.wants_rooms: set[int] = set()  # subscribers that also get the rooms' events (not outcomes)
        self.delivered = 0
        self.skipped = 0
        self.callback_errors = 0  # subscriber calls that raised (any BaseException)
        self.max_backlog = max_backlog

    @handles(AddSubscriber)
    def _on_add(self, msg: AddSubscriber) -> None:
        self.subscribers[msg.token] = msg.callback
        if msg.details:
            self.wants_details.add(msg.token)
        if msg.rooms:
            self.wants_rooms.add(msg.token)

    @handles(RemoveSubscriber)
    def _on_remove(self, msg: RemoveSubscriber) -> None:
        self.subscribers.pop(msg.token, None)
        self.wants_details.discard(msg.token)
        self.wants_rooms.discard(msg.token)

    @handles(Notify)
    def _on_notify(self, msg: Notify) -> None:
        if self._shed(1):
            return
        if msg.outcome.get("kind") == "room":  # a room event, not an outcome: only for who asked for them
            self._call_all(msg.outcome, msg.details, only=self.wants_rooms)
            return
        self._call_all({"kind": "dm", **msg.outcome}, msg.details)

    @handles(NotifyOutcomes)
    def _on_outcomes(self, msg: NotifyOutcomes) -> None:
        if self._shed(len(msg.notes)):
            return
        details: dict[str, Any] | None = None
        for outcome, delivery, published in msg.notes:
            if self.wants_details:  # built only for a subscriber that asked for them
                details = delivery_details(delivery, published)
            self._call_all({"kind": "dm", **outcome}, details)

    def _shed(self, count: int) -> bool:
        """Skip ``count`` notifications when the backlog is over its bound (a stuck subscriber)."""
        if not self.subscribers or self.mailbox_size() <= self.max_backlog:
            return False
        before, self.skipped = self.skipped, self.skipped + count  # memory must not grow without bound
        self.counts.publish(self.delivered, self.skipped, self.callback_errors)
        if before == 0 or before // 1000 != self.skipped // 1000:
            logger.error(
                "subscribers are too slow: {} notification(s) skipped so far (backlog over {}); "
                "the outcomes stay available through wait_outcome",
                self.skipped,
                self.max_backlog,
            )
        return True

    def _call_all(self, payload: dict[str, Any], details: dict[str, Any] | None,
                  only: set[int] | None = None) -> None:
        """Call every subscriber (of ``only``, when given) with a copy of ``payload`` (plus ``details`` for
        those that asked for them)."""
        _calling.active = True
        try:
            for token, callback in list(self.subscribers.items()):
                if only is not None and token not in only:
                    continue
                try:
                    if details is not None and token in self.wants_details:
                        callback({**payload, **details})
                    else:
                        callback(dict(payload))
                except BaseException:  # user code: even SystemExit must not stop the actors
                    self.callback_errors += 1
                    logger.exception("outcome subscriber {} raised; it stays subscribed", token)
        finally:
            _calling.active = False
        self.delivered += 1
        self.counts.publish(self.delivered, self.skipped, self.callback_errors)

    @handles(Flush)
    def _on_flush(self, msg: Flush) -> int:
        return self.delivered
