"""Pure: the outcome a ProfileActor gives a DM it took, and which queued DMs a stop leaves for the next start.

The ProfileActor (``local/profile_actor.py``) owns the queue, the running turn and the
timers; what each of those ends in for the sender is decided here, from values only
(:func:`turn_escaped` also logs the escaped error, as the bug it is).
"""

from __future__ import annotations

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.local.turns import describe_error
from hermes_actors.messages import ROOM_ORIGIN, Delivery, Outcome, TurnFinished

__all__ = ["kept_at_stop", "outcome_of_turn", "timed_out_outcome", "turn_escaped"]


def kept_at_stop(delivery: Delivery, *, keep_journaled: bool) -> bool:
    """Whether a delivery still queued when the gateway stops is left for the next start, not cancelled.

    With ``keep_journaled`` (a durable gateway) a journaled delivery is dropped without an
    outcome: the next start on this root re-offers it. Relay-in and room deliveries are
    not in this root's journal while queued (a relay-in one is journaled from its turn's start
    only): they are always cancelled here (a relay-in one's relay then keeps its envelope for
    the next start: ``RelayOutcome.put_back``).
    """
    return keep_journaled and delivery.origin not in ("relay", ROOM_ORIGIN)


def turn_escaped(delivery_id: str, exc: BaseException) -> TurnFinished:
    """The result when an exception escaped the turn's code (a bug: those paths return results).

    Where it escaped is unknown, so the DM may have reached its target: ``ambiguous``.
    """
    logger.opt(exception=exc).error("the turn of {} raised outside its result paths", delivery_id)
    why = f"The gateway failed while delivering this DM ({describe_error(exc)})."
    return TurnFinished(delivery_id, None, why, "unknown", ambiguous=True)


def outcome_of_turn(delivery: Delivery, result: TurnFinished) -> Outcome:
    """Pure: the sender's outcome for a finished turn."""
    if result.ambiguous:
        return outcomes.ambiguous(delivery.delivery_id, delivery.label, result.error, result.reason or "unknown")
    if result.reply is not None:
        # A str: every runner's and owner's reply was checked where it returned it (runners.checked_reply), so no
        # user code runs here. A str subclass becomes a plain str (its methods never run); anything else would be
        # our bug, and crashes this ProfileActor only (its supervisor restarts it, the DM is ambiguous).
        reply = str.__str__(result.reply)
        return outcomes.from_reply(delivery.delivery_id, delivery.label, reply)
    return outcomes.failed(delivery.delivery_id, delivery.label, result.error, result.reason)


def timed_out_outcome(
    delivery: Delivery, *, profile: str, seconds: float, began: bool, live: bool, owner: bool = False
) -> Outcome:
    """Pure: the outcome of a turn given up on after ``turn_timeout_seconds``.

    Args:
        delivery: the delivery whose turn timed out.
        profile: the target profile (named in a ``target_busy`` text).
        seconds: ``turn_timeout_seconds``.
        began: the turn had begun (its gate said so): it may have reached its target.
        live: a turn process of ours ran it and is being ended now.
        owner: it was handed to the live Bot Chat owner (docs/architecture.md, "Live-owner handoff").

    Returns:
        ``ambiguous`` when the live owner had it (it may have shown the DM: do not resend),
        ``delivery_timeout`` when the runner's turn began (do not resend blindly; a turn that may still
        complete says its later answer is not passed on), else ``target_busy`` (it never runs now, and the
        sender may resend).
    """
    if began and owner:
        why = f"The live Bot Chat owner did not finish the turn of {delivery.label} within {seconds:g}s."
        return outcomes.ambiguous(delivery.delivery_id, delivery.label, why)
    if began:
        # only a turn process is ended; a warm turn goes on in hermes, an in-process one in its thread, and what
        # either answers then is dropped (this is the DM's one outcome: the first wins): the text never promises it
        fate = (" and was stopped; it may have been partly done" if live
                else "; it may still complete, but a later answer is not passed on")
        text = f"The turn of {delivery.label} did not finish within {seconds:g}s{fate}{outcomes.RESEND_BLINDLY_TAIL}"
        return outcomes.failed(delivery.delivery_id, delivery.label, text, "delivery_timeout")
    # still waiting for the flock (or a worker)
    return outcomes.failed(delivery.delivery_id, delivery.label, outcomes.busy_text(profile, seconds), "target_busy")
