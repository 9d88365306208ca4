"""How a delivery for a profile of this machine enters the Dispatcher: booked pending, then queued.

:class:`LocalIntake` is owned by the DispatcherActor and used on its thread. Every local
delivery (a DM admitted here or on its sender's thread, a room member's turn, a relayed-in
envelope, a journaled DM re-offered at start) is booked in the OutcomeBook under its route,
then gathered on its profile's ProfileActor (``ProfileTable.queue``). One arriving as the
gateway stops is settled at once instead (a journaled one is left to the next start).
"""

from __future__ import annotations

from typing import Any

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.names import profile_key
from hermes_actors.core.targets import LocalRoute
from hermes_actors.core.wake import exempt_from_queue_bounds
from hermes_actors.local.durability import Durability
from hermes_actors.local.outcome_book import OutcomeBook, Pending
from hermes_actors.local.outcome_flow import OutcomeFlow, answer_room
from hermes_actors.local.profile_table import ProfileTable
from hermes_actors.local.queue_gauge import QueueGauge
from hermes_actors.local.relay_in import RelayInTurn
from hermes_actors.messages import AcceptLocal, Delivery, PendingAck, ProfileInfo, RoomTurn

__all__ = ["LocalIntake"]


class LocalIntake:
    """Books local deliveries and queues them on their ProfileActors.

    Args:
        book: the Dispatcher's OutcomeBook.
        profiles: the Dispatcher's ProfileActors.
        durability: the durability strategy (an accepted DM is journaled first in durable mode).
        flow: the outcome flow (a delivery refused at a stop is settled through it).
        counters: the Dispatcher's counters (``accepted`` is counted here).
        gauge: the places the profiles' queues have left: whatever is queued holds one but a wake, which the
            bound does not count (None: not kept).
    """

    def __init__(
        self,
        *,
        book: OutcomeBook,
        profiles: ProfileTable,
        durability: Durability,
        flow: OutcomeFlow,
        counters: dict[str, int],
        gauge: QueueGauge | None = None,
    ) -> None:
        self.book = book
        self.profiles = profiles
        self.durability = durability
        self.flow = flow
        self.counters = counters
        self.gauge = gauge

    def deliver(self, info: ProfileInfo, delivery: Delivery, *, journaled: bool = False, held: bool = False) -> None:
        """Book ``delivery`` as pending and queue it on the ProfileActor of ``info`` (started if needed).

        Args:
            info: the target profile.
            delivery: the delivery.
            journaled: the journal records its lifecycle.
            held: it holds its place in the profile's queue already (taken when it was admitted).
        """
        self.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=journaled))
        self._queue(info, delivery, held=held)

    def accept(self, route: LocalRoute, delivery: Delivery) -> dict[str, Any] | PendingAck:
        """Accept a local DM the Dispatcher admitted (journaled first in durable mode).

        Args:
            route: its route (the target profile, and how the ack names it).
            delivery: the delivery.

        Returns:
            The ack, or the PendingAck answered once its ``accepted`` record is on disk.
        """
        target, journaled = route.target, self.durability.enabled
        ack = ack_payload(delivery.delivery_id, route.label, now=delivery.accepted_at,
                          live_owner=target.profile in self.profiles.owners)

        def proceed() -> None:
            self._queue_accepted(target, delivery, journaled=journaled)

        def refused() -> None:  # the journal refused the record: nothing was acked, the place it took is free
            if self.gauge is not None:
                self.gauge.release(delivery.delivery_id)

        return self.durability.accept(delivery, ack, proceed, refused)

    def taken(self, msg: AcceptLocal, *, accepting: bool) -> None:
        """A first-hop local DM its sender's thread admitted (and journaled, in durable mode): acked."""
        delivery = msg.delivery
        if not accepting:  # the sender passed the running check just before stop began
            if msg.journaled:  # on disk, never started: like the DMs a stop leaves queued
                logger.info("{} arrived as the gateway stopped; the next start re-offers it", delivery.delivery_id)
                return
            self.book.add(delivery.delivery_id, Pending(delivery, "local"))  # acked: it gets an outcome
            self.flow.settle(outcomes.cancelled(delivery.delivery_id, delivery.label))
            return
        self._queue_accepted(msg.target, delivery, journaled=msg.journaled)

    def _queue_accepted(self, target: ProfileInfo, delivery: Delivery, *, journaled: bool) -> None:
        """A newly accepted local DM (acked, or about to be): queue it and count it.

        Its admission took its place in the profile's queue (``CallerAdmission.plan_local`` on the
        sender's thread, ``Admission.admit`` here), and nothing frees it before it is queued (a journal
        that refuses its record frees it, and then it is not queued): no second lock round to hold it.
        """
        self.deliver(target, delivery, journaled=journaled, held=True)
        self.counters["accepted"] += 1

    def _queue(self, info: ProfileInfo, delivery: Delivery, *, held: bool = False) -> None:
        """Queue ``delivery`` on its ProfileActor; it holds a place in the profile's queue until it is settled
        (``held``: it took its place when it was admitted; else it takes one now, past the bound if need be).
        A wake takes none while queued: the bound counts DMs (``exempt_from_queue_bounds``); the ProfileActor
        has its turn take the turn's place as it starts."""
        if self.gauge is not None and not held and not exempt_from_queue_bounds(delivery):
            self.gauge.hold(info.profile, delivery.delivery_id)
        self.profiles.queue(info, delivery)

    def room_turn(self, msg: RoomTurn, *, accepting: bool, index: dict[str, ProfileInfo]) -> None:
        """A room member's turn: queued on its ProfileActor like a DM; the outcome goes back to the room."""
        delivery = msg.delivery
        key, label = delivery.delivery_id, delivery.label
        info = index.get(profile_key(delivery.target))
        if accepting and info is not None:
            self.book.add(key, Pending(delivery, "room", room_reply=msg.reply))
            self._queue(info, delivery)
        elif not accepting:
            answer_room(msg.reply, outcomes.cancelled(key, label))
        else:
            gone = f"No local profile named {delivery.target!r} any more."
            answer_room(msg.reply, outcomes.failed(key, label, gone, "runtime_offline"))

    def relay_in(self, turn: RelayInTurn, reply_connection: str) -> None:
        """Queue a relayed-in envelope's turn; its outcome goes back through the relay (route ``relay-in``)."""
        self.book.add(turn.delivery.delivery_id, Pending(turn.delivery, "relay-in", reply_connection))
        self._queue(turn.info, turn.delivery)

    def give_up(self, profile: str, error: BaseException | None) -> None:
        """A ProfileActor keeps crashing: every delivery still pending for it fails as NOT delivered.

        Its running turn was settled ``ambiguous`` by its crash report (which comes first), so
        what is still pending for it never started: queued, in its mailbox, or held while it was
        down. Relayed-in ones fail too (their sender is answered through the relay).
        """
        text = (f"The target's actor failed repeatedly ({error!r}) before this message's turn started; "
                "the message was NOT delivered.")
        for key, entry in self.book.pending():
            if entry.route in ("local", "room", "relay-in") and entry.delivery.target == profile:
                self.flow.settle(outcomes.failed(key, entry.delivery.label, text, "unknown"))
        self.profiles.forget(profile)
