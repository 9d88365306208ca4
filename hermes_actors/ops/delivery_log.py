"""The one INFO line logged per settled delivery (by ``serve``'s gateway and by the relay hub).

Pure: it names the delivery, who sent it to whom, how it ended and how long it
took — never the message or reply text.
"""

from __future__ import annotations

__all__ = ["delivery_line"]


def delivery_line(
    delivery_id: str, sender: str, target: str, status: str, reason: str = "", latency: float | None = None
) -> str:
    """One log line for a settled delivery.

    Args:
        delivery_id: the delivery (or envelope) id.
        sender: who sent it (a profile, or ``handle@connection``).
        target: who it was for, as the sender named it.
        status: ``replied``, ``silent``, ``failed``, ``ambiguous`` (or ``relayed`` for the hub's hand-off).
        reason: the reason code ("" when none).
        latency: seconds from acceptance to the outcome (None when unknown).

    Returns:
        e.g. ``delivery 3f2a… alice → @bob: failed [target_busy] in 1.25 s``.
    """
    why = f" [{reason}]" if reason else ""
    took = "" if latency is None else f" in {max(0.0, latency):.2f} s"
    return f"delivery {delivery_id} {sender or '?'} → {target or '?'}: {status}{why}{took}"
