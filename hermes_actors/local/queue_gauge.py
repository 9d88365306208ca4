"""How many DMs each local profile holds: the queue bound, applied in the ack.

``bot_mode.max_queued`` promises that a DM to a profile whose queue is full is
refused at once (``target_busy``, NOT delivered), not acked and failed a moment
later. The ack is given on the sender's thread (first-hop DMs, see
:class:`~hermes_actors.local.admission.CallerAdmission`) or the Dispatcher's,
before the ProfileActor has seen the DMs admitted just before it: a burst of
sends would all find its queue empty. So the count is kept where DMs are
admitted: each DM holds a place from its admission (the sender's thread or
the Dispatcher) until its ProfileActor settles it (its turn ended, or it never
ran); whatever else the Dispatcher queues on a ProfileActor (DMs re-offered at
a start, relayed-in DMs, room turns) holds one too, without being refused for
it. A sender's wake-up holds none while queued: the bound counts DMs
(:func:`~hermes_actors.core.wake.exempt_from_queue_bounds`); its turn takes the
place kept for the turn as it starts (``ProfileActor._maybe_start``). The
ProfileActor frees the place on its own thread as it settles the DM; the
Dispatcher frees it for the outcomes it gets from anyone else (freeing is
idempotent). The ProfileActor's own check on its queue stays, for a DM
admitted as the queue filled.

Shared by the sender threads and the Dispatcher, so it is the one piece of
admission state behind a lock: a check-and-take of a place must be atomic.
"""

from __future__ import annotations

import threading

__all__ = ["QueueGauge"]


class QueueGauge:
    """The DMs each local profile holds (waiting, or in their turn) and not yet settled.

    Args:
        max_queued: ``bot_mode.max_queued``, the DMs that may wait for one profile; one more
            may be in its turn, so ``max_queued + 1`` places per profile.
    """

    def __init__(self, max_queued: int) -> None:
        self.places = max_queued + 1
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}  # delivery id → the profile it holds a place at
        self._counts: dict[str, int] = {}

    def take(self, profile: str, delivery_id: str) -> int | None:
        """Take a place at ``profile`` for ``delivery_id``.

        Returns:
            None when the place is taken (or the id holds one already); else the
            number of DMs waiting there (the queue is full: nothing was taken).
        """
        with self._lock:
            if delivery_id in self._held:
                return None
            held = self._counts.get(profile, 0)
            if held >= self.places:
                return held - 1  # one of them is in its turn
            self._held[delivery_id] = profile
            self._counts[profile] = held + 1
            return None

    def hold(self, profile: str, delivery_id: str) -> None:
        """``delivery_id`` is queued for ``profile`` (a DM checked when it was admitted, or anything the
        Dispatcher queues unasked): it holds a place, past the bound if need be (the ProfileActor decides)."""
        with self._lock:
            if delivery_id not in self._held:
                self._held[delivery_id] = profile
                self._counts[profile] = self._counts.get(profile, 0) + 1

    def release(self, delivery_id: str) -> None:
        """The DM was settled (or never acked): its place is free. Unknown ids are ignored."""
        with self._lock:
            profile = self._held.pop(delivery_id, None)
            if profile is None:
                return
            left = self._counts[profile] - 1
            if left:
                self._counts[profile] = left
            else:
                del self._counts[profile]

    def held(self, profile: str) -> int:
        """The places ``profile``'s DMs hold now."""
        with self._lock:
            return self._counts.get(profile, 0)
