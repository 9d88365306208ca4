"""The conversation guard (docs/architecture.md, "The conversation guard"): pure checks against bot-to-bot loops.

``hop`` is a DM's depth in its conversation: a DM a caller sends through
``Gateway.message_agent`` is hop 1; a DM sent from inside the turn of a hop-N
delivery is hop N+1. The per-pair rate applies to DMs sent from inside turns
(hop >= 2), where loops happen; a person or program driving the gateway
directly is not rate-limited by it.
"""

from __future__ import annotations

from collections import deque

from hermes_actors.core.hops import MAX_HOP, is_hop
from hermes_actors.core.reasons import LOOP_GUARD
from hermes_actors.core.targets import Refusal

__all__ = ["PAIR_WINDOW_SECONDS", "check_hops", "check_pair_rate", "check_relay_hop", "pair_key"]

PAIR_WINDOW_SECONDS = 60.0


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The unordered pair two profiles form."""
    return (a, b) if a <= b else (b, a)


def check_hops(hop: int, max_hops: int) -> Refusal | None:
    """Refuse a DM deeper than ``max_hops`` in its conversation."""
    if max_hops > 0 and hop > max_hops:
        return Refusal(
            f"Conversation guard: this DM would be hop {hop} of a bot-to-bot chain (limit {max_hops}). "
            "The message was NOT sent. Stop messaging teammates and answer your user now.",
            LOOP_GUARD,
        )
    return None


def check_relay_hop(hop: int, label: str) -> Refusal | None:
    """Refuse a DM to another gateway whose hop no relayed envelope may carry (past ``MAX_HOP``).

    Its target, over either transport, refuses such an envelope as malformed and never answers it
    (``relay_protocol.parse_envelope``): the sender would wait for a ``delivery_timeout``. So nothing is
    queued and the caller is told at once. ``config.yaml`` takes no ``max_hops`` above ``MAX_HOP``, so the
    loop guard (:func:`check_hops`) refuses such a DM first; this check holds for a ``BotModeConfig`` built
    by hand past that range.

    Args:
        hop: the DM's hop.
        label: how the target is shown (``@bob on mini``).

    Returns:
        The ``loop_guard`` refusal, or None when the hop can be relayed.
    """
    if is_hop(hop):
        return None
    return Refusal(f"This DM to {label} would be hop {hop}, past the most a relayed envelope carries ({MAX_HOP}). "
                   "The message was NOT sent.", LOOP_GUARD)


def check_pair_rate(history: deque[float], now: float, limit: int, hop: int) -> Refusal | None:
    """Refuse when the pair exchanged ``limit`` DMs in the last minute.

    ``history`` (monotonic send times of the pair) is trimmed in place; the
    caller appends ``now`` when the DM is accepted.
    """
    while history and now - history[0] > PAIR_WINDOW_SECONDS:
        history.popleft()
    if hop < 2 or limit <= 0:
        return None
    if len(history) >= limit:
        return Refusal(
            f"Conversation guard: you and this teammate exchanged {len(history)} DMs in the last minute "
            f"(limit {limit}). The message was NOT sent. Stop messaging and answer your user now.",
            LOOP_GUARD,
        )
    return None
