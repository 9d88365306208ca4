"""A DM's way in from its sender's thread: where a :class:`SendRequest` becomes an ack.

A first-hop DM to a local profile is admitted right here, on the sender's thread,
from the published roster snapshot (:class:`CallerAdmission`), and reaches the
Dispatcher as one tell (:class:`AcceptLocal`): in memory the sender has its ack
without waiting for any actor; in durable mode it waits only for the journal.
Every other request (DMs from inside turns, relay and peer targets, refusals) is
asked of the Dispatcher, which owns the state those need.
"""

from __future__ import annotations

from typing import Any

import pykka

from actors import ActorGone, ask, tell
from hermes_actors.core.acks import ack_payload, resolve_ack
from hermes_actors.local.admission import CallerAdmission
from hermes_actors.messages import AcceptLocal, PendingAck, SendRequest

__all__ = ["send_dm"]


def send_dm(
    dispatcher: pykka.ActorRef[Any],
    request: SendRequest,
    *,
    admission: CallerAdmission | None,
    durable: bool,
    timeout: float,
) -> dict[str, Any]:
    """Send ``request``; the tool's ack or refusal dict.

    Args:
        dispatcher: the DispatcherActor.
        request: the DM.
        admission: the caller-side admission (None: always ask the Dispatcher).
        durable: the gateway journals acceptances (the ack waits for the journal).
        timeout: seconds to wait for the Dispatcher or the journal.

    Returns:
        The ack (``delivery_id``...) or the refusal (``error``, ``reason``...).

    Raises:
        ActorGone: the Dispatcher is gone (the gateway stopped).
        RuntimeError: the gateway stopped accepting.
    """
    planned = admission.plan_local(request) if admission is not None else None
    if planned is None:
        return resolve_ack(ask(dispatcher, request, timeout=timeout), timeout=timeout)
    route, delivery = planned
    ack = ack_payload(delivery.delivery_id, route.label, now=delivery.accepted_at)
    reply: pykka.ThreadingFuture[dict[str, Any]] | None = pykka.ThreadingFuture() if durable else None
    if not tell(dispatcher, AcceptLocal(route.target, delivery, ack, reply)):
        raise ActorGone("cannot tell AcceptLocal: the Dispatcher is gone")
    return ack if reply is None else resolve_ack(PendingAck(reply), timeout=timeout)
