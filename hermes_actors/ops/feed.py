"""The live page's feed: recent outcomes and room events, and waking every ``/events`` stream when one arrives.

Outcomes and room events (``kind: "room"``) come from ``Gateway.subscribe(details=True, rooms=True)`` on that
subscription's own notifier thread (its NotifierActor, :mod:`hermes_actors.local.notifier`);
:meth:`LiveFeed.publish` only appends and notifies (never blocks on a client).
Each stream remembers the sequence number it has sent; a stream that fell more
than :data:`RECENT_KEEP` outcomes behind gets a fresh snapshot instead, so a
slow browser costs no memory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RECENT_KEEP", "FeedBatch", "LiveFeed", "outcome_event", "room_event"]

RECENT_KEEP = 200


def outcome_event(outcome: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Pure: what the page shows of one outcome — never the message, the reply or the error text.

    Args:
        outcome: a ``subscribe(details=True, rooms=True)`` outcome dict.
        now: ``time.time()`` when it arrived.

    Returns:
        ``delivery_id``, ``status``, ``reason``, ``sender``, ``target`` (a handle), ``to`` (the target as the
        sender saw it, the outcome's ``from``: ``@bob``, ``@bob on mini`` for another connection's bob, ""
        when unknown), ``latency_seconds`` and ``at``.
    """
    latency = outcome.get("latency_seconds")
    return {
        "delivery_id": str(outcome.get("delivery_id", "")),
        "status": str(outcome.get("status", "")),
        "reason": str(outcome.get("reason", "")),
        "sender": str(outcome.get("sender", "")),
        "target": str(outcome.get("target") or str(outcome.get("from", "")).lstrip("@")),
        "to": str(outcome.get("from") or ""),  # the handle alone makes a relayed DM's target look local
        "latency_seconds": round(float(latency), 3) if isinstance(latency, int | float) else None,
        "at": round(now, 3),
    }


def room_event(event: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Pure: what the page shows of one room event — never a message's text.

    Args:
        event: a ``kind: "room"`` subscriber dict (``event`` is ``message`` or ``state``).
        now: ``time.time()`` when it arrived.

    Returns:
        ``kind`` ("room"), ``room_id``, ``room``, ``event``, ``at``; a state change adds ``state``,
        a message its ``message_id``, ``author``, ``round`` and ``status``.
    """
    out: dict[str, Any] = {"kind": "room", "room_id": str(event.get("room_id", "")), "room": str(event.get("room", "")),
                           "event": str(event.get("event", "")), "at": round(now, 3)}
    message = event.get("message")
    if out["event"] == "state":
        out["state"] = str(event.get("state", ""))
    elif isinstance(message, Mapping):
        out.update({"message_id": str(message.get("message_id", "")), "author": str(message.get("author", "")),
                    "round": message.get("round"), "status": str(message.get("status", ""))})
    return out


@dataclass(frozen=True)
class FeedBatch:
    """What a stream gets from :meth:`LiveFeed.wait_after`."""

    events: list[dict[str, Any]]
    seq: int  # the last sequence number included
    resync: bool  # the stream fell behind the kept window: send a snapshot instead of ``events``
    closed: bool  # the server is closing: end the stream


class LiveFeed:
    """Recent outcome events with sequence numbers, and a condition streams wait on."""

    def __init__(self, keep: int = RECENT_KEEP) -> None:
        self._cond = threading.Condition()
        self._recent: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._seq = 0
        self._closed = False

    def publish(self, outcome: Mapping[str, Any]) -> None:
        """Add one outcome or room event and wake the streams; never blocks long.

        Args:
            outcome: one ``subscribe(details=True, rooms=True)`` dict, given on its subscription's notifier thread.
        """
        now = time.time()
        event = room_event(outcome, now) if outcome.get("kind") == "room" else outcome_event(outcome, now)
        with self._cond:
            self._seq += 1
            self._recent.append((self._seq, event))
            self._cond.notify_all()

    def snapshot(self) -> tuple[list[dict[str, Any]], int]:
        """The kept events, oldest first, and the sequence number of the newest."""
        with self._cond:
            return [event for _, event in self._recent], self._seq

    def wait_after(self, seq: int, timeout: float) -> FeedBatch:
        """Wait up to ``timeout`` seconds for events after ``seq`` (or the close).

        Args:
            seq: the last sequence number the stream sent.
            timeout: the most to wait, in seconds.

        Returns:
            The batch (possibly empty when the timeout passed).
        """
        with self._cond:
            self._cond.wait_for(lambda: self._seq > seq or self._closed, timeout=max(0.0, timeout))
            if self._closed:
                return FeedBatch([], seq, resync=False, closed=True)
            oldest = self._recent[0][0] if self._recent else self._seq + 1
            if seq + 1 < oldest:
                return FeedBatch([], self._seq, resync=True, closed=False)
            return FeedBatch([e for n, e in self._recent if n > seq], self._seq, resync=False, closed=False)

    def close(self) -> None:
        """End every waiting stream now."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
