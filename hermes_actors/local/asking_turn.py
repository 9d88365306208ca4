"""The Turn a local delivery runs: its ``message_agent`` asks the Dispatcher, one hop deeper.

The Dispatcher hands :func:`asking_turn` (bound to itself) to its ProfileActors as their
turn factory; it runs on their worker threads and reads the roster snapshot the
Dispatcher holds now. A DM the turn sends that the remote roster decides is asked after
``roster.json`` as it is now reached the Dispatcher, as a caller's (``sending.fresh_remote_roster``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pykka

from actors import ActorGone, ask
from hermes_actors.core import outcomes, reasons
from hermes_actors.core.acks import resolve_ack
from hermes_actors.core.names import profile_key
from hermes_actors.errors import TurnFailed
from hermes_actors.local.admission import CallerAdmission
from hermes_actors.local.sending import counted, fresh_remote_roster
from hermes_actors.local.turns import turn_for
from hermes_actors.messages import Delivery, ProfileInfo, SendRequest, Turn

__all__ = ["asking_turn"]


def asking_turn(
    dispatcher: pykka.ActorRef[Any], index: dict[str, ProfileInfo], root: Path, delivery: Delivery,
    lock_fd: int | None = None, admission: CallerAdmission | None = None,
) -> Turn:
    """The Turn of ``delivery``, whose ``message_agent`` sends as its target through ``dispatcher``.

    Args:
        dispatcher: the Dispatcher (asked ``SendRequest``; its ack is awaited).
        index: the local profiles now, by key.
        root: the Hermes root.
        delivery: the delivery whose turn runs.
        lock_fd: the profile's turn-lock descriptor (the turn's process inherits it).
        admission: the gateway's caller-side admission, whose check a DM the turn sends passes
            before it is asked of the Dispatcher (None: none).

    Returns:
        The Turn.

    Raises:
        TurnFailed: the target was removed since it was accepted (``unknown``): a turn that
            would recreate its home never runs.
    """
    info = index.get(profile_key(delivery.target))
    if info is None:  # removed since it was accepted: never run a turn that would recreate its home
        raise TurnFailed(outcomes.gone_text(delivery.target), reason=reasons.UNKNOWN)
    # a partial, not a closure: built for every turn, and a closure costs cells for what it uses besides
    send = functools.partial(_send_as_target, dispatcher, delivery, admission)
    return turn_for(delivery, home=info.home if info else None, root=root, send=send, lock_fd=lock_fd)


def _send_as_target(
    dispatcher: pykka.ActorRef[Any], delivery: Delivery, admission: CallerAdmission | None, target: str, message: str,
) -> dict[str, Any]:
    """A turn's ``message_agent``: a DM as ``delivery``'s target, one hop deeper, asked of ``dispatcher``."""
    request = SendRequest(delivery.target, target, message, hop=delivery.hop + 1, session=delivery.session)
    try:
        if admission is not None:
            fresh_remote_roster(admission, request, timeout=30)
        return counted(dispatcher, resolve_ack(ask(dispatcher, request, timeout=30), timeout=30))
    except ActorGone as exc:  # a Turn kept past its gateway's stop: the Gateway's own error
        raise RuntimeError("gateway is not running") from exc
