"""Named crash points for the crash-matrix tests.

Set ``HERMES_ACTORS_CRASH_AT=<point>`` in a gateway process's environment and
it kills itself with SIGKILL the first time it reaches that point. Unset (the
normal case) every call is a dictionary-free string comparison.

Points: ``after-journal-before-ack``, ``after-ack-before-turn``, ``mid-turn``,
``after-turn-before-outcome``, ``after-outcome-before-delivered``; of the sender
wake-up (:data:`WAKE_CRASH_POINTS`): ``after-outcome-before-wake`` (the DM's outcome
is durable, its wake not written yet), ``mid-wake`` (the wake turn's start is durable); of the
relay hub (:data:`HUB_CRASH_POINTS`): ``hub-after-claim-before-post``; of the sending
gateway's relay (:data:`RELAY_CRASH_POINTS`): ``relay-after-sent-record`` (a DM's envelope staged
complete and recorded in ``sent/``, not yet renamed into ``outbox/``, not acked),
``relay-after-expiry-claim`` (its own envelope taken from ``outbox/`` at the TTL, the
``queued_expired`` reply not written yet),
``relay-after-expiry-reply`` (the reply written, the envelope still in ``expiring/``) and
``relay-before-forget`` (a relayed DM's outcome journaled and published, the batch of its
sender's wake with its ``delivered`` record on disk: its ``sent/`` record not yet forgotten); of the
Redis transport's receiving side (:data:`REDIS_CRASH_POINTS`): ``redis-after-reply-write``
(a relayed-in reply's ``MULTI`` ran, the reply kept in its start mark, the mark not cleared and,
when the sender's replies key refused it, the reply not yet owed).
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_POINTS", "HUB_CRASH_POINTS", "REDIS_CRASH_POINTS", "RELAY_CRASH_POINTS", "WAKE_CRASH_POINTS",
           "crashpoint"]

CRASH_POINTS = (
    "after-journal-before-ack",
    "after-ack-before-turn",
    "mid-turn",
    "after-turn-before-outcome",
    "after-outcome-before-delivered",
)
WAKE_CRASH_POINTS = ("after-outcome-before-wake", "mid-wake")
HUB_CRASH_POINTS = ("hub-after-claim-before-post",)  # the relay hub: an envelope claimed, not yet posted
# the sending gateway: an envelope recorded in sent/, not yet queued; an expired envelope taken, not answered;
# answered, not yet moved to claimed/; an outcome journaled and delivered, its sent/ record not yet forgotten
RELAY_CRASH_POINTS = ("relay-after-sent-record", "relay-after-expiry-claim", "relay-after-expiry-reply",
                      "relay-before-forget")
REDIS_CRASH_POINTS = ("redis-after-reply-write",)  # the target over Redis: a reply's MULTI ran, its mark not cleared

_ARMED = os.environ.get("HERMES_ACTORS_CRASH_AT", "")


def crashpoint(name: str) -> None:
    """Die here (SIGKILL, no cleanup) when this point is armed."""
    if _ARMED and name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
