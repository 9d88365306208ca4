"""The Dispatcher's link to the relay: DMs to other connections and to relay-reached peers.

:class:`RelayLink` is owned by the DispatcherActor and runs on its thread. It
never blocks on the relay: a send is asked with :func:`actors.ask_reply_to`,
the caller gets a :class:`~hermes_actors.messages.PendingAck`, and the relay's
:class:`~hermes_actors.messages.RelayAccepted` completes it later. What the
relay can reach, and whether its envelopes are kept on this root, is announced once, at attach
(``AttachRelay.reaches_peers``, ``AttachRelay.journals_sends``).
"""

from __future__ import annotations

from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, ask_reply_to, tell
from hermes_actors.core.authors import bot_author
from hermes_actors.core.reasons import CANCELLED
from hermes_actors.core.targets import PeerRoute, Refusal, RelayRoute
from hermes_actors.messages import (
    Delivery,
    ForgetSent,
    Outcome,
    PeerSend,
    PendingAck,
    ProfileInfo,
    RelayAccepted,
    RelayOutcome,
    RelaySend,
)

__all__ = ["RelayLink", "delivery_from_envelope"]


class RelayLink:
    """The relay the Dispatcher talks to, and the sends it waits on.

    Args:
        dispatcher: the Dispatcher's own ref (the relay tells ``RelayAccepted`` to it).
    """

    def __init__(self, dispatcher: pykka.ActorRef[Any]) -> None:
        self.dispatcher = dispatcher
        self.ref: pykka.ActorRef[Any] | None = None
        self.reaches_peers = False
        self.journals_sends = False
        self._waiting: dict[str, tuple[Delivery, RelayRoute | PeerRoute, pykka.ThreadingFuture[Any]]] = {}

    def attach(self, ref: pykka.ActorRef[Any], *, reaches_peers: bool, journals_sends: bool = False) -> None:
        """The relay runs: ``ref``; ``reaches_peers``: it carries DMs to ``bot_peers`` peers itself;
        ``journals_sends``: nothing on this root keeps its envelopes (Redis), so their acks are journaled."""
        self.ref = ref
        self.reaches_peers = reaches_peers
        self.journals_sends = journals_sends

    def send(self, route: RelayRoute, delivery: Delivery) -> dict[str, Any] | PendingAck:
        """Hand a DM for another connection to the relay; the ack arrives with ``RelayAccepted``.

        Returns:
            A :class:`PendingAck`, or the refusal dict when no relay runs.
        """
        refusal = Refusal(f"The file relay is not running; {route.label} is unreachable.", "runtime_offline")
        if self.ref is None:
            return refusal.as_dict()
        return self._ask(RelaySend(route, delivery), route, delivery) or refusal.as_dict()

    def send_to_peer(self, route: PeerRoute, delivery: Delivery) -> PendingAck | None:
        """Offer a ``bot_peers`` DM to a relay that reaches peers (Redis).

        Returns:
            A :class:`PendingAck` (``RelayAccepted`` says whether the relay took it), or None:
            the relay does not reach peers, use the peer transport.
        """
        if self.ref is None or not self.reaches_peers:
            return None
        return self._ask(PeerSend(route, delivery), route, delivery)

    def _ask(self, message: Any, route: RelayRoute | PeerRoute, delivery: Delivery) -> PendingAck | None:
        assert self.ref is not None
        key = delivery.delivery_id
        try:
            ask_reply_to(
                self.ref,
                message,
                reply_to=self.dispatcher,
                make_reply=lambda ack, error: RelayAccepted(key, ack, error),
            )
        except ActorGone:
            return None
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        self._waiting[key] = (delivery, route, future)
        return PendingAck(future, waiting_for="The relay")

    def landed(self, delivery_id: str) -> tuple[Delivery, RelayRoute | PeerRoute, pykka.ThreadingFuture[Any]] | None:
        """The send of ``delivery_id`` the relay answered: its delivery, route and the caller's future."""
        return self._waiting.pop(delivery_id, None)

    def abandon(self) -> None:
        """The Dispatcher stops: callers still waiting on the relay get a refusal now."""
        for delivery, route, future in self._waiting.values():
            logger.warning("relay did not answer the send of {} before the stop", delivery.delivery_id)
            future.set(Refusal(f"The gateway stopped before the relay confirmed the message for {route.label}; "
                               "it may not have been queued.", "runtime_offline").as_dict())
        self._waiting.clear()

    def forget(self, envelope_id: str) -> None:
        """The outcome of our envelope ``envelope_id`` is kept here now: the relay may clear its record."""
        if self.ref is not None:  # a relay gone keeps its record: the next start settles the DM from it again
            tell(self.ref, ForgetSent(envelope_id))

    def answer_relay_in(self, outcome: Outcome, reply_connection: str, *, stopping: bool = False) -> None:
        """A drained delivery settled: the relay writes its reply for ``reply_connection``.

        Args:
            outcome: its outcome.
            reply_connection: where the reply goes.
            stopping: the gateway stops: a ``cancelled`` outcome is then the stop's, and the
                relay keeps the envelope for the next start unless its turn started.
        """
        if self.ref is not None:
            put_back = stopping and outcome.reason == CANCELLED
            if not tell(self.ref, RelayOutcome(outcome, reply_connection, put_back)):
                # its envelope stays on our shelf: the next start answers it (ambiguous once its turn started)
                logger.error("the relay is gone: the reply to {} is left to the next start", outcome.delivery_id)


def delivery_from_envelope(
    env: dict[str, Any], info: ProfileInfo, label: str, *, now: float, origin: str = ""
) -> Delivery:
    """Pure: the Delivery that runs a drained envelope on the local profile ``info``, accepted at ``now``.

    ``origin`` is the sender's connection id ("" when unknown: the Desktop RPC delivered it): the
    author id names it, so another machine's ``alice`` is not this install's own ``alice``.
    """
    hop = env.get("hop")
    return Delivery(
        delivery_id=env["id"],
        sender=str(env["from_profile"]),
        sender_handle=str(env["from_handle"]),
        target=info.profile,
        target_handle=info.handle,
        content=str(env["message"]),
        author=bot_author(str(env["from_profile"]), str(env["from_handle"]), origin),
        hop=hop if isinstance(hop, int) and hop > 0 else 1,  # checked by parse_envelope: absent or 0 is a first hop
        accepted_at=now,
        origin="relay",
        label=label,
    )
