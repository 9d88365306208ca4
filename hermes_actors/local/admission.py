"""The Dispatcher's admission of a DM: route it, apply the conversation guard, issue its id.

:class:`Admission` is owned by the DispatcherActor and used on its thread; it
holds the per-pair send history the guard needs. The decisions are the pure
``targets.plan_send`` and ``guard`` checks.
"""

from __future__ import annotations

import time
from collections import deque

from hermes_actors.core.guard import check_hops, check_pair_rate, pair_key
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.targets import LocalRoute, PeerRoute, Refusal, RelayRoute, plan_send
from hermes_actors.messages import Delivery, RosterSnapshot, SendRequest

__all__ = ["Admission"]


class Admission:
    """Turns a :class:`SendRequest` into a route and a :class:`Delivery`, or a refusal.

    The per-pair history is kept only for DMs sent from inside turns (hop >= 2).
    """

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str], deque[float]] = {}  # monotonic send times of each pair

    def admit(
        self, snapshot: RosterSnapshot, msg: SendRequest, *, max_hops: int, max_pair_rate: int
    ) -> Refusal | tuple[LocalRoute | RelayRoute | PeerRoute, Delivery]:
        """Route ``msg`` against ``snapshot`` and guard it.

        Args:
            snapshot: the current roster.
            msg: the request.
            max_hops: ``bot_mode.max_hops``.
            max_pair_rate: ``bot_mode.max_pair_rate`` (DMs a minute between two profiles; 0: unlimited).

        Returns:
            The refusal, or the route with the accepted delivery (its id newly issued).
        """
        route = plan_send(
            snapshot, sender=msg.sender, target=msg.target, message=msg.message, session=msg.session, now=time.time()
        )
        if isinstance(route, Refusal):
            return route
        hop = max(1, msg.hop)
        target_key = route.target.profile if isinstance(route, LocalRoute) else route.label
        pair = pair_key(route.sender.profile, target_key)
        history = self.pairs.setdefault(pair, deque())
        now_mono = time.monotonic()
        pair_refusal = check_pair_rate(history, now_mono, max_pair_rate, hop)  # trims the history either way
        refusal = check_hops(hop, max_hops) or pair_refusal
        if refusal is not None:
            return refusal
        if hop >= 2:
            history.append(now_mono)
        elif not history:
            del self.pairs[pair]
        delivery = Delivery(
            delivery_id=new_delivery_id(),
            sender=route.sender.profile,
            sender_handle=route.sender.handle,
            target=route.target.profile if isinstance(route, LocalRoute) else "",
            target_handle=route.target.handle if isinstance(route, LocalRoute | RelayRoute) else "",
            content=route.content,
            author=route.author,
            hop=hop,
            accepted_at=time.time(),
            label=route.label,
        )
        return route, delivery
