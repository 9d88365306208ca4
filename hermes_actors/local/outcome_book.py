"""The Dispatcher's book of outcomes: which deliveries are pending, being journaled, settled.

:class:`OutcomeBook` is owned by the DispatcherActor and used on its thread
only; it is the one place that changes the pending, settled and waiter
tables. Each delivery id is in exactly one :class:`DeliveryState`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import pykka

__all__ = ["SETTLED_KEEP", "DeliveryState", "OutcomeBook", "Pending", "Route"]

SETTLED_KEEP = 100_000  # settled outcomes remembered for wait_outcome (oldest dropped first; bounds memory)

#: How a pending delivery travels: to a local profile, to another connection through the
#: relay (ours, awaiting a reply), drained from the relay and run here, to a bot_peers peer,
#: or a group room member's turn (its outcome goes back to the room).
Route = Literal["local", "relay", "relay-in", "peer", "room"]


class DeliveryState(Enum):
    """Where one delivery id stands in the Dispatcher."""

    UNKNOWN = "unknown"  # never issued here (or forgotten: older than SETTLED_KEEP)
    PENDING = "pending"  # accepted, no outcome yet
    JOURNALING = "journaling"  # the outcome is known and is being made durable before it is published
    SETTLED = "settled"  # the outcome is published: wait_outcome answers it


@dataclass
class Pending:
    """A delivery the Dispatcher accepted and that has no outcome yet.

    Attributes:
        delivery: the delivery.
        route: how it travels.
        reply_connection: for ``relay-in``, the connection that waits for the reply.
        journaled: the journal records its lifecycle (durable mode).
        room_reply: for ``room``, called with the outcome (it goes back to the RoomActor).
    """

    delivery: Any  # messages.Delivery
    route: Route
    reply_connection: str = ""
    journaled: bool = False
    room_reply: Callable[[Any], None] | None = None


class OutcomeBook:
    """Pending deliveries, settled outcomes and the futures waiting for them.

    Args:
        keep: how many settled outcomes are remembered (oldest dropped first).
    """

    def __init__(self, keep: int = SETTLED_KEEP) -> None:
        self.keep = keep
        self._pending: dict[str, Pending] = {}
        self._journaling: dict[str, tuple[dict[str, Any], Any]] = {}  # id → (outcome dict, Delivery | None)
        self._settled: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._waiters: dict[str, list[pykka.ThreadingFuture[dict[str, Any]]]] = {}

    # ── reading ─────────────────────────────────────────────────────────────

    def state(self, key: str) -> DeliveryState:
        """The state of delivery ``key``."""
        if key in self._pending:
            return DeliveryState.PENDING
        if key in self._journaling:
            return DeliveryState.JOURNALING
        if key in self._settled:
            return DeliveryState.SETTLED
        return DeliveryState.UNKNOWN

    def has_outcome(self, key: str) -> bool:
        """True once an outcome for ``key`` arrived (a second one is dropped)."""
        return self.state(key) in (DeliveryState.JOURNALING, DeliveryState.SETTLED)

    def record(self, key: str) -> dict[str, Any] | None:
        """The outcome dict of ``key`` (journaling or settled), or None."""
        journaling = self._journaling.get(key)
        return journaling[0] if journaling is not None else self._settled.get(key)

    def entry(self, key: str) -> Pending | None:
        """The pending entry of ``key`` (None unless it is pending)."""
        return self._pending.get(key)

    def delivery(self, key: str) -> Any:
        """The ``Delivery`` of ``key`` while it is pending or journaling (None otherwise)."""
        entry = self._pending.get(key)
        if entry is not None:
            return entry.delivery
        journaling = self._journaling.get(key)
        return journaling[1] if journaling is not None else None

    def pending(self) -> list[tuple[str, Pending]]:
        """A copy of the pending entries, oldest first."""
        return list(self._pending.items())

    def pending_count(self) -> int:
        """How many deliveries wait for an outcome."""
        return len(self._pending)

    def export(self) -> dict[str, dict[str, Any]]:
        """The outcome dicts a stopped Gateway keeps answering (journaling and settled)."""
        return {**self._settled, **{key: record for key, (record, _) in self._journaling.items()}}

    # ── changing ────────────────────────────────────────────────────────────

    def add(self, key: str, entry: Pending) -> None:
        """``key`` is pending (accepted, or re-offered after a restart)."""
        self._pending[key] = entry

    def take(self, key: str) -> Pending | None:
        """An outcome for ``key`` arrived: remove and return its pending entry (None if it had none)."""
        return self._pending.pop(key, None)

    def journaling(self, key: str, record: dict[str, Any], delivery: Any = None) -> None:
        """The outcome of ``key`` is being journaled: held back until :meth:`settle`.

        Args:
            key: the delivery id.
            record: its outcome dict.
            delivery: its ``Delivery`` (kept for the subscribers' details until it is published).
        """
        self._pending.pop(key, None)
        self._journaling[key] = (record, delivery)

    def settle(self, key: str, record: dict[str, Any]) -> Pending | None:
        """Publish the outcome of ``key``: its waiters get it.

        Returns:
            The pending entry still held for ``key`` (None when :meth:`take` already removed it).
        """
        entry = self._pending.pop(key, None)
        self._journaling.pop(key, None)
        self._settled[key] = record
        if len(self._settled) > self.keep:
            self._settled.popitem(last=False)
        for future in self._waiters.pop(key, ()):
            future.set(record)
        return entry

    def remember(self, records: dict[str, dict[str, Any]]) -> None:
        """Outcomes a previous run settled (from the journal): ``wait_outcome`` answers them."""
        for key, record in records.items():
            if self.state(key) in (DeliveryState.UNKNOWN, DeliveryState.SETTLED):
                self._settled[key] = record

    def wait(self, key: str) -> pykka.ThreadingFuture[dict[str, Any]]:
        """A future that resolves with the outcome dict of ``key``.

        Raises:
            KeyError: ``key`` is unknown here.
        """
        future: pykka.ThreadingFuture[dict[str, Any]] = pykka.ThreadingFuture()
        state = self.state(key)
        if state is DeliveryState.SETTLED:
            future.set(self._settled[key])
        elif state is DeliveryState.UNKNOWN:
            raise KeyError(f"unknown delivery id {key!r}: this gateway did not issue it and no journal holds it")
        else:
            self._waiters.setdefault(key, []).append(future)
        return future
