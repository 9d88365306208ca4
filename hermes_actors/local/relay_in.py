"""Pure: what the Dispatcher does with an envelope the relay drained for one of its profiles.

A drained envelope is delivered at most once per envelope id: the relay may offer it again
(a reclaim, a restart, the Desktop retrying ``relay_deliver``), so the Dispatcher's book decides.
:func:`relay_in_step` returns either the answer the relay gets at once (:class:`RelayInAnswer`),
the turn to queue (:class:`RelayInTurn`), or None when the envelope is already under way here.

In durable mode the book knows the envelopes of previous runs too: a relayed-in turn journals its
``accepted`` and ``started`` records before it runs (``turn_launch.RelayedInStart``), and its outcome
is journaled with its ``delivered`` record (:func:`kept_across_restarts` says which), so the next
start remembers it, or settles it ``ambiguous`` when it started and never finished
(``journal_replay``). In memory this holds only while the gateway runs.

An envelope whose turn may have run in a process that died (``dead_why``: a Redis entry reclaimed from a dead
consumer that had claimed its turn, :func:`dead_holder_text`; an envelope the file relay adopted from a dead
gateway's shelf with its start mark) never runs here: it is answered with the outcome the book holds of it (the
journal's, after a restart: a turn that finished before the kill gets its real reply), else ``ambiguous`` for
that reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes_actors.core import outcomes, reasons
from hermes_actors.core.acks import outcome_from_record
from hermes_actors.core.guard import check_hops
from hermes_actors.core.names import profile_key
from hermes_actors.local.relay_link import delivery_from_envelope
from hermes_actors.messages import Delivery, Outcome, ProfileInfo

__all__ = ["RelayInAnswer", "RelayInTurn", "dead_holder_text", "kept_across_restarts", "relay_in_step"]


@dataclass(frozen=True, slots=True)
class RelayInAnswer:
    """Answer the envelope now, without a turn.

    Attributes:
        outcome: its outcome.
        stopping: the gateway stops and never ran it: the relay puts it back for later.
    """

    outcome: Outcome
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class RelayInTurn:
    """Queue the envelope's turn on the ProfileActor of ``info``, booked pending (route ``relay-in``)."""

    info: ProfileInfo
    delivery: Delivery


def kept_across_restarts(outcome: Outcome) -> bool:
    """Pure: whether a relayed-in DM's outcome is journaled (durable mode), so that a retry of its envelope after a
    restart is answered with it and runs no turn.

    Every outcome but ``cancelled``: that one says the turn never ran (the stop put it back, or gave up on it
    before it began; resending is safe), and its transport offers the envelope again (back in ``inbox/``, left
    pending in the Redis inbox, or retried by the Desktop): it runs then, once.

    Args:
        outcome: the relayed-in DM's outcome.

    Returns:
        True when it is journaled.
    """
    return outcome.reason != reasons.CANCELLED


def dead_holder_text(holder: str) -> str:
    """Pure: why an envelope whose turn a process that died had claimed is ``ambiguous`` (the book knows no outcome).

    Args:
        holder: that process (its Redis consumer name).

    Returns:
        The reason (:func:`~hermes_actors.core.outcomes.ambiguous` adds "do not resend").
    """
    return f"The gateway process that was running this turn ({holder}) died before it replied"


def relay_in_step(
    env: dict[str, Any],
    *,
    pending: bool,
    record: dict[str, Any] | None,
    accepting: bool,
    index: dict[str, ProfileInfo],
    max_hops: int,
    now: float,
    reply_connection: str,
    dead_why: str = "",
) -> RelayInAnswer | RelayInTurn | None:
    """Pure: the step for one drained envelope (idempotent by envelope id).

    Args:
        env: the envelope (already validated by the relay).
        pending: the book holds its delivery pending (its turn is under way).
        record: the outcome the book has settled for it (None: none).
        accepting: the gateway still accepts DMs.
        index: the local profiles, by key.
        max_hops: ``bot_mode.max_hops`` (0: no limit).
        now: the acceptance time of its delivery.
        reply_connection: the sender's connection id (its answer goes back through it).
        dead_why: why its turn may have run in a process that died ("": it did not): it never runs here;
            answered with ``record``, else ``ambiguous`` for this reason.

    Returns:
        None when it is already under way; else the answer to give now or the turn to queue.
    """
    if pending:
        return None
    key = env["id"]
    label = f"@{env['target_handle']}"
    if dead_why and record is None:  # it may have run there, and no outcome of it was recorded here
        return RelayInAnswer(outcomes.ambiguous(key, label, dead_why))
    if not accepting and (record is None or record["reason"] == reasons.CANCELLED):
        # Taken as the stop began, or taken again after the stop cancelled it (a reclaim): cancelled
        # unrun, so the relay puts it back for later (it answers it only if its turn had started).
        return RelayInAnswer(outcomes.cancelled(key, label), stopping=True)
    if record is not None:  # delivered before a crash, reply not written yet: write it again
        return RelayInAnswer(outcome_from_record(key, record))
    info = index.get(profile_key(str(env["target_profile"])))
    if info is None:
        text = f"No agent '{env['target_profile']}' on this gateway; the message was NOT delivered."
        return RelayInAnswer(outcomes.failed(key, label, text, "unknown"))
    delivery = delivery_from_envelope(env, info, label, now=now, origin=reply_connection)
    too_deep = check_hops(delivery.hop, max_hops)
    if too_deep is not None:  # a peer with a deeper limit, or a forged hop: our limit holds for our bots too
        return RelayInAnswer(outcomes.failed(key, label, too_deep.error, too_deep.reason))
    return RelayInTurn(info, delivery)
