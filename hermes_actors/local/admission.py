"""Admission of a DM: route it, apply the conversation guard, issue its id.

:class:`Admission` is owned by the DispatcherActor and used on its thread; it
holds the per-pair send history the guard needs. :class:`CallerAdmission` is the
part a sender's thread does itself (first-hop local DMs, from the published
roster snapshot). Both decide with :func:`plan_delivery`, over the pure
``targets.plan_send`` and ``guard`` checks.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

import pykka

from hermes_actors.core.guard import check_hops, check_pair_rate, pair_key
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.outcomes import queue_full_text
from hermes_actors.core.reasons import TARGET_BUSY
from hermes_actors.core.targets import LocalRoute, Refusal, RelayRoute, Route, consults_remote_roster, plan_send
from hermes_actors.local.queue_gauge import QueueGauge
from hermes_actors.messages import Delivery, RosterSnapshot, SendRequest
from hermes_actors.store.relay_files import roster_identity

__all__ = ["Admission", "CallerAdmission", "plan_delivery"]

_TO_AN_AGENT = (LocalRoute, RelayRoute)  # the routes whose target has a handle (built once, not per DM)


def plan_delivery(
    snapshot: RosterSnapshot, msg: SendRequest, *, max_hops: int, wake: bool
) -> Refusal | tuple[Route, Delivery]:
    """Route ``msg`` against ``snapshot``, apply the hop guard, issue the delivery.

    Everything but the per-pair rate (which needs the Dispatcher's history): a
    function of the snapshot, the request and the clock, safe on any thread.

    Args:
        snapshot: the roster (immutable).
        msg: the request.
        max_hops: ``bot_mode.max_hops``.
        wake: whether the sender is woken with the outcome (this gateway's ``bot_mode.wake_sender``);
            journaled with the DM, so whichever gateway settles it honours it.

    Returns:
        The refusal, or the route with the accepted delivery (its id newly issued).
    """
    route = _route(snapshot, msg)
    if isinstance(route, Refusal):
        return route
    hop = max(1, msg.hop)
    refusal = check_hops(hop, max_hops)
    if refusal is not None:
        return refusal
    delivery = Delivery(
        delivery_id=new_delivery_id(),
        sender=route.sender.profile,
        sender_handle=route.sender.handle,
        target=route.target.profile if isinstance(route, LocalRoute) else "",
        target_handle=route.target.handle if isinstance(route, _TO_AN_AGENT) else "",
        content=route.content,
        author=route.author,
        hop=hop,
        accepted_at=time.time(),
        label=route.label,
        wake=wake,
    )
    return route, delivery


def _route(snapshot: RosterSnapshot, msg: SendRequest) -> Route | Refusal:
    """Pure but for the clock: ``plan_send`` of ``msg`` against ``snapshot`` now."""
    return plan_send(
        snapshot, sender=msg.sender, target=msg.target, message=msg.message, session=msg.session, now=time.time()
    )


class CallerAdmission:
    """The admission a sender's own thread may do: first-hop DMs to a local profile.

    Such a DM needs nothing but the roster snapshot (the pair-rate guard counts only
    DMs sent from inside turns), so the caller plans it and hands the Dispatcher one
    tell instead of asking it and waiting for the answer. Everything else (refusals
    included, so they are counted in one place) goes the Dispatcher's way.

    ``snapshot`` is published by the DispatcherActor (its owner) on every roster change:
    one reference to an immutable object, replaced, never changed.

    Args:
        snapshot: the roster at start.
        max_hops: ``bot_mode.max_hops``.
        wake: whether this gateway wakes senders (see :func:`plan_delivery`).
        gauge: the places each profile's queue has left (``bot_mode.max_queued``), shared with
            the Dispatcher; None: unbounded here (the ProfileActor's own check still applies).
        roster: the RosterActor, asked by a sender whose DM needs ``roster.json`` re-read first
            (:meth:`roster_rewritten`; ``local/sending.py``: ``fresh_remote_roster``).
        roster_file: ``bot_relay/roster.json`` (None: never checked).
    """

    def __init__(
        self, snapshot: RosterSnapshot, *, max_hops: int, wake: bool, gauge: QueueGauge | None = None,
        roster: pykka.ActorRef[Any] | None = None, roster_file: Path | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.max_hops = max_hops
        self.wake = wake
        self.gauge = gauge
        self.roster = roster
        self.roster_file = roster_file
        # profiles with a live owner attached (published by the Dispatcher, replaced, never changed): their
        # DMs get the seed's live-owner ack, which the Dispatcher gives
        self.live_owners: frozenset[str] = frozenset()

    def plan_local(self, msg: SendRequest) -> tuple[LocalRoute, Delivery] | None:
        """The local route and accepted delivery of ``msg`` (holding its place in the target's queue);
        None: ask the Dispatcher (which also refuses a DM to a full queue, counted with the other refusals)."""
        if msg.hop >= 2:
            return None
        planned = plan_delivery(self.snapshot, msg, max_hops=self.max_hops, wake=self.wake)
        if isinstance(planned, Refusal):
            return None
        route, delivery = planned
        if not isinstance(route, LocalRoute) or route.target.profile in self.live_owners:
            return None
        if self.gauge is not None and self.gauge.take(route.target.profile, delivery.delivery_id) is not None:
            return None
        return route, delivery

    def roster_rewritten(self, msg: SendRequest) -> bool:
        """Whether ``roster.json`` must be re-read before the Dispatcher plans ``msg``.

        Only a DM the remote roster decides (:func:`~hermes_actors.core.targets.consults_remote_roster`:
        another connection's agent, a name this install does not know, ``x@conn``) pays the check, one
        ``lstat`` of the file compared with the identity the published snapshot was read from. A DM
        :meth:`plan_local` admits never comes here: the local fast path never looks at the file.
        A transport's remote roster (Redis) is no file: never.

        Args:
            msg: a DM about to be asked of the Dispatcher.

        Returns:
            True when its plan consults the remote roster and the file was rewritten (or
            appeared, or went) since the snapshot was read.
        """
        snapshot = self.snapshot
        if self.roster_file is None or snapshot.remote_via:
            return False
        if not consults_remote_roster(_route(snapshot, msg)):
            return False
        return roster_identity(self.roster_file) != snapshot.remote_identity

    def withdraw(self, delivery_id: str) -> None:
        """A DM :meth:`plan_local` admitted was not acked after all (its journal write failed): free its place."""
        if self.gauge is not None:
            self.gauge.release(delivery_id)


class Admission:
    """Turns a :class:`SendRequest` into a route and a :class:`Delivery`, or a refusal.

    The per-pair history is kept only for DMs sent from inside turns (hop >= 2).

    Args:
        gauge: the places each profile's queue has left, shared with :class:`CallerAdmission`
            (None: not bounded here).
    """

    def __init__(self, gauge: QueueGauge | None = None) -> None:
        self.pairs: dict[tuple[str, str], deque[float]] = {}  # monotonic send times of each pair
        self.gauge = gauge

    def admit(
        self, snapshot: RosterSnapshot, msg: SendRequest, *, max_hops: int, max_pair_rate: int, wake: bool
    ) -> Refusal | tuple[Route, Delivery]:
        """Route ``msg`` against ``snapshot`` and guard it (:func:`plan_delivery`, the queue bound, the pair rate).

        Args:
            snapshot: the current roster.
            msg: the request.
            max_hops: ``bot_mode.max_hops``.
            max_pair_rate: ``bot_mode.max_pair_rate`` (DMs a minute between two profiles; 0: unlimited).
            wake: whether this gateway wakes senders (see :func:`plan_delivery`).

        Returns:
            The refusal, or the route with the accepted delivery (its id newly issued).
        """
        planned = plan_delivery(snapshot, msg, max_hops=max_hops, wake=wake)
        if isinstance(planned, Refusal):
            return planned
        route, delivery = planned
        target_key = route.target.profile if isinstance(route, LocalRoute) else route.label
        pair = pair_key(route.sender.profile, target_key)
        history = self.pairs.setdefault(pair, deque())
        now_mono = time.monotonic()
        refusal = check_pair_rate(history, now_mono, max_pair_rate, delivery.hop)  # trims the history either way
        if refusal is None and isinstance(route, LocalRoute) and self.gauge is not None:
            # taken here, last (nothing below refuses): a journal that refuses the record frees it (LocalIntake)
            waiting = self.gauge.take(route.target.profile, delivery.delivery_id)
            if waiting is not None:
                refusal = Refusal(queue_full_text(route.target.profile, waiting), TARGET_BUSY)
        if refusal is not None:
            if not history:
                del self.pairs[pair]
            return refusal
        if delivery.hop >= 2:
            history.append(now_mono)
        elif not history:
            del self.pairs[pair]
        return planned
