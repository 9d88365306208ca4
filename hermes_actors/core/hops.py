"""A DM's hop as the protocols carry it (docs/architecture.md, "The conversation guard"): the one rule for a hop
that came from outside.

A leaf module: the submit protocol, the relay's envelope parser and the conversation guard
(``core.guard``) all check a hop here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_HOP", "is_hop"]

MAX_HOP = 1000  # the deepest hop a submit request or a relayed envelope may carry; the most `max_hops` takes


def is_hop(value: Any) -> bool:
    """Whether ``value`` is a DM's hop as the protocols carry it: an integer from 0 to ``MAX_HOP``.

    The one rule for a hop that came from outside: a submit request's, and a relayed envelope's over
    either transport (``store.relay_protocol.parse_envelope``; a sender refuses a DM past it:
    ``core.guard.check_relay_hop``).

    Args:
        value: a decoded JSON value.

    Returns:
        True for an int (not a bool) in ``0..MAX_HOP``.
    """
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_HOP
