"""The Dispatcher's DMs that leave this machine: to the relay, or to a ``bot_peers`` peer.

:class:`RemoteSends` is owned by the DispatcherActor and used on its thread. A relay
send is answered later (``RelayAccepted``, never waited for here); a peer DM the relay
does not reach goes to the peer transport, off this thread, and its outcome comes back
as ``OutcomeReady``. Each one is booked pending under the id its outcome will carry. A peer
DM is accepted as a local DM is (:meth:`Durability.accept`): in durable mode its ``accepted``
record (origin ``peer``) is on disk before its ack and before the transport has it, so a crash
while the transport delivers it leaves a record the next start settles (``ambiguous``). So is a DM
sent over Redis, whose envelope nothing on this root keeps (origin ``redis``, once Redis queued it,
before its ack): the next start waits for it again while Redis's ``sent`` hash holds it, and settles
it ``ambiguous`` once the relay's resumed list (``RelayResumed``, complete) lacks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pykka
from loguru import logger

from actors import tell
from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.recovery import redis_lost
from hermes_actors.core.targets import PeerRoute, Refusal, RelayRoute
from hermes_actors.local.durability import Durability
from hermes_actors.local.outcome_book import DeliveryState, OutcomeBook, Pending
from hermes_actors.local.relay_link import RelayLink
from hermes_actors.messages import (
    PEER_ORIGIN,
    REDIS_ORIGIN,
    Delivery,
    Outcome,
    OutcomeReady,
    PendingAck,
    RelayAccepted,
    RelayResumed,
)

__all__ = ["PeerSubmit", "RemoteSends"]

PeerSubmit = Callable[[Delivery, PeerRoute, Callable[[Outcome], None]], None]  # (delivery, route, report)



def _report_peer_outcome(dispatcher: pykka.ActorRef[Any], outcome: Outcome) -> None:
    """Tell a peer DM's outcome (from the peer transport's worker); one that comes after the stop is dropped,
    logged: the stop reported that DM ``ambiguous`` (journaled) already."""
    if not tell(dispatcher, OutcomeReady(outcome)):
        logger.info("the peer outcome of {} ({}) came after the gateway stopped; it was reported ambiguous",
                    outcome.delivery_id, outcome.status)

class RemoteSends:
    """Sends DMs off this machine and books them until their outcome comes back.

    Args:
        dispatcher: the Dispatcher (told a peer DM's ``OutcomeReady``).
        relay: the link to the relay.
        book: the Dispatcher's OutcomeBook.
        counters: the Dispatcher's counters (``accepted`` is counted here).
        peer_submit: runs a peer delivery off-actor (None: no peer transport on this gateway).
        durability: the Dispatcher's durability strategy (a peer DM's acceptance is journaled before its ack).
        settle: settles an outcome (``OutcomeFlow.settle``): a peer DM whose acceptance landed once the stop
            began is ``cancelled``, never handed to the transport.
        stopping: whether the Dispatcher stopped accepting.
    """

    def __init__(
        self,
        *,
        dispatcher: pykka.ActorRef[Any],
        relay: RelayLink,
        book: OutcomeBook,
        counters: dict[str, int],
        peer_submit: PeerSubmit | None,
        durability: Durability,
        settle: Callable[[Outcome], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.dispatcher = dispatcher
        self.relay = relay
        self.book = book
        self.counters = counters
        self.peer_submit = peer_submit
        self.durability = durability
        self.settle = settle
        self.stopping = stopping
        self.relay_resumed = False  # the relay told its complete list of resumed envelopes (RelayResumed.complete)
        self.awaiting_resume: dict[str, str] = {}  # journaled Redis DMs the relay has not resumed yet: id -> label

    def send(self, route: RelayRoute | PeerRoute, delivery: Delivery) -> dict[str, Any] | PendingAck:
        """Send an admitted DM to the relay or a peer; the ack (or refusal), or the PendingAck the relay answers."""
        if isinstance(route, PeerRoute):  # a peer that is a connection on our relay (Redis), else the CLI transport
            return self.relay.send_to_peer(route, delivery) or self.to_peer(route, delivery)
        return self.relay.send(route, delivery)

    def to_peer(self, route: PeerRoute, delivery: Delivery) -> dict[str, Any] | PendingAck:
        """Hand a ``bot_peers`` DM to the peer transport (off this thread), once accepted.

        Accepted as a local DM is (:meth:`Durability.accept`): in durable mode its ``accepted`` record
        (origin ``peer``) is on disk before the ack and before the transport has it. Before, nothing was
        journaled until its outcome: a ``kill -9`` while the transport delivered it left no trace, and after
        the restart ``wait_outcome`` raised ``KeyError`` for a DM that had been acked ``queued``.

        Returns:
            The ack, the refusal (no peer transport; or the journal refused the record), or the PendingAck
            answered once its ``accepted`` record is on disk.
        """
        if self.peer_submit is None:
            return Refusal(
                f"Peer delivery to {route.label} is not available on this gateway.", "runtime_offline"
            ).as_dict()
        submit, me = self.peer_submit, self.dispatcher
        delivery = replace(delivery, origin=PEER_ORIGIN)  # so journaled: the next start never runs it here
        key = delivery.delivery_id

        def proceed() -> None:
            self.book.add(key, Pending(delivery, "peer"))
            self.counters["accepted"] += 1
            if self.stopping():  # its record landed as the stop began: never handed over, so NOT delivered
                self.settle(outcomes.cancelled(key, delivery.label))
                return
            submit(delivery, route, lambda outcome: _report_peer_outcome(me, outcome))

        return self.durability.accept(delivery, ack_payload(key, route.label, now=delivery.accepted_at), proceed)

    def landed(self, msg: RelayAccepted) -> None:
        """The relay answered a send: book it, and release the caller's ack."""
        waiting = self.relay.landed(msg.delivery_id)
        if waiting is None:
            return
        delivery, route, future = waiting
        if msg.error is not None:
            future.set_exception(exc_info=(type(msg.error), msg.error, msg.error.__traceback__))
            return
        ack = msg.ack
        if ack is None:  # the relay does not reach this peer: the peer transport carries it
            assert isinstance(route, PeerRoute)
            future.set(self.to_peer(route, delivery))  # its ack, or a PendingAck resolve_ack waits for too
            return
        if "delivery_id" in ack and self.relay.journals_sends and not self.book.has_outcome(ack["delivery_id"]):
            future.set(self.journal_sent(delivery, ack))
            return
        if "delivery_id" in ack:  # booked under the envelope's id: the relay reports its outcome by it
            if not self.book.has_outcome(ack["delivery_id"]):  # its reply may have beaten this ack here
                self.book.add(ack["delivery_id"], Pending(delivery, "relay"))
            self.counters["accepted"] += 1
        future.set(ack)

    def journal_sent(self, delivery: Delivery, ack: dict[str, Any]) -> dict[str, Any] | PendingAck:
        """A DM Redis queued: booked under its envelope's id, acked once its ``accepted`` record is on disk.

        In durable mode its record (origin ``redis``) is journaled before the ack: Redis may lose the envelope
        and its ``sent`` record (``appendfsync everysec``, a crash), and nothing else on this root names it, so
        a restart then left a DM acked ``queued`` with no outcome ever (``wait_outcome`` raised KeyError). It is
        booked now, not once its record lands: its reply, journaled ``finished`` after it, cannot beat it.

        Returns:
            The ack (no journal, or the journal refused the record: logged, it is in Redis), or the PendingAck
            answered with it once the record is on disk.
        """
        key = ack["delivery_id"]
        journaled = replace(delivery, delivery_id=key, origin=REDIS_ORIGIN)
        self.book.add(key, Pending(journaled, "relay"))

        def proceed() -> None:
            self.counters["accepted"] += 1

        return self.durability.accept(journaled, ack, proceed, queued=True)

    def resumed(self, msg: RelayResumed) -> None:
        """A restarted relay waits for these envelopes of ours again: book each one this run does not know.

        A complete list (``msg.complete``) also settles each journaled Redis DM it lacks (:meth:`await_resume`):
        Redis lost its envelope and ``sent`` record, so no reply or deadline of the relay's would ever settle it.
        """
        for entry in msg.entries:
            key = entry.envelope_id
            self.awaiting_resume.pop(key, None)  # Redis holds it: its reply or deadline settles it as before
            if self.book.state(key) is DeliveryState.UNKNOWN:  # its sender (when recorded) is woken by the outcome
                placeholder = Delivery(key, entry.sender, entry.sender_handle, "", "", "", label=entry.label,
                                       hop=entry.hop, origin="recovered", wake=entry.wake)
                self.book.add(key, Pending(placeholder, "relay"))
        if not msg.complete:
            return
        self.relay_resumed = True
        lost, self.awaiting_resume = self.awaiting_resume, {}
        for key, label in lost.items():
            if self.book.state(key) is DeliveryState.PENDING:
                self.settle(redis_lost(key, label))
        if lost:
            logger.warning("recovery: {} DM(s) sent over Redis before the restart are no longer in Redis (it lost "
                           "data): settled ambiguous", len(lost))

    def await_resume(self, delivery: Delivery) -> None:
        """A journaled Redis DM without an outcome, at a start whose relay has not resumed yet (Redis unreachable):
        booked pending (``wait_outcome`` waits) until the relay's complete list says whether Redis holds it."""
        self.book.add(delivery.delivery_id, Pending(delivery, "relay"))
        self.awaiting_resume[delivery.delivery_id] = delivery.label
