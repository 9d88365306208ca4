"""Pure recovery planning: what to do with each delivery a previous run journaled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_from_record, outcome_from_record
from hermes_actors.core.ids import is_delivery_id
from hermes_actors.core.reasons import DELIVERY_TIMEOUT
from hermes_actors.core.wake import WAKE_ORIGIN, is_wake
from hermes_actors.messages import PEER_ORIGIN, REDIS_ORIGIN, RELAY_ORIGIN, Delivery, Outcome
from hermes_actors.store.journal_records import delivery_origin

__all__ = [
    "RecoveryPlan",
    "TurnPlace",
    "known_outcomes",
    "owner_outcome",
    "plan_recovery",
    "readable_states",
    "redis_lost",
    "relayed_in_states",
    "running_at_stop_text",
    "stopped_mid_turn_text",
    "unreadable_deliveries",
]


@dataclass
class RecoveryPlan:
    """Actions, per delivery, in journal order.

    - ``known``: settled and delivered before; only remembered for ``wait_outcome``.
    - ``redeliver``: finished but the sender may not have seen it; publish it again.
    - ``ambiguous``: started, never finished: may have run; report "do not resend". So is a ``bot_peers`` DM
      without an outcome (origin ``peer``): handed to the peer transport as it was acked, it may have been sent;
      and a DM sent over Redis without an outcome (origin ``redis``) that Redis no longer holds (:func:`redis_lost`).
    - ``relayed``: a DM sent over Redis without an outcome, at a start whose relay could not read Redis yet: booked
      pending until it does (resumed as any envelope of ours if Redis holds it, else :func:`redis_lost`).
    - ``reoffer``: accepted, never started (or a wake that provably never reached its bot): run it now,
      same delivery id.
    """

    known: dict[str, dict[str, Any]] = field(default_factory=dict)
    redeliver: list[Outcome] = field(default_factory=list)
    ambiguous: list[tuple[Delivery, Outcome]] = field(default_factory=list)
    reoffer: list[Delivery] = field(default_factory=list)
    relayed: list[Delivery] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "reoffered": len(self.reoffer),
            "ambiguous": len(self.ambiguous),
            "redelivered": len(self.redeliver),
            "known": len(self.known),
        }


def unreadable_deliveries(states: dict[str, Any]) -> list[str]:
    """Pure: the ids that are no delivery id, or whose journaled ``accepted`` record cannot be rebuilt.

    An ``accepted`` record cannot be rebuilt when its ``d`` is no object (``"hello"``, or missing:
    ``DeliveryState.unreadable_acceptance``) or when :func:`~hermes_actors.core.acks.delivery_from_record`
    refuses it.

    A line of the right JSON shape with missing, mistyped or hostile fields (a corrupt or planted
    journal file: an id of ``../../x``, a target of ``../etc``) must neither stop every start on the
    root nor run: the caller skips those ids and says which. Every id is checked; only the deliveries
    recovery rebuilds are (not the delivered ones, up to 10,000).
    """
    bad: list[str] = []
    for key, state in states.items():
        if not is_delivery_id(key):
            bad.append(key)
            continue
        if state.delivered:
            continue
        if state.delivery is None:
            if state.unreadable_acceptance:  # "d": "hello" or no "d": a DM that was acked, and that nothing can run
                bad.append(key)
            continue  # no acceptance at all: a torn record, nothing was acked
        try:
            delivery_from_record(state.delivery, key)
        except (TypeError, ValueError):  # ValidationError included
            bad.append(key)
    return bad


def readable_states(states: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Pure: ``states`` without the deliveries :func:`unreadable_deliveries` names, and those names."""
    unreadable = unreadable_deliveries(states)
    skipped = set(unreadable)
    return {key: state for key, state in states.items() if key not in skipped}, unreadable


def relayed_in_states(states: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pure: ``states`` split into the relayed-in DMs' and the others (``states``: id → ``DeliveryState``).

    A relayed-in DM is journaled only once its turn starts (its ``accepted`` record, origin ``relay``, goes
    with its ``started`` one). :func:`plan_recovery` decides its fate by the same rules as a local DM's, but
    nobody here is told of it: its sender is on another connection, answered through the relay, and its
    envelope comes back (a reclaim, the Desktop retrying ``relay_deliver``) to be answered from the outcome
    the next start remembers. One that would be re-offered (an idempotent runner) is forgotten instead: the
    retry runs it.

    Args:
        states: the journal's states.

    Returns:
        ``(relayed_in, others)``, each in journal order.
    """
    relayed_in: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, state in states.items():
        (relayed_in if delivery_origin(state) == RELAY_ORIGIN else others)[key] = state
    return relayed_in, others


def _reoffered(delivery: Delivery) -> Delivery:
    """A delivery offered again after a restart (a wake stays a wake: its outcome is not a DM's)."""
    return delivery if delivery.origin == WAKE_ORIGIN else replace(delivery, origin="recovered")


def known_outcomes(states: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Pure: the outcomes a previous run settled and delivered (``states``: id → ``DeliveryState``), in order.

    Only remembered (for ``wait_outcome``); a second outcome of one of them in this run is dropped.
    """
    return {key: state.outcome for key, state in states.items() if state.delivered and state.outcome is not None}


# Why a turn its host lost is ``ambiguous``: the one source of these texts, for the next start (recovery)
# and for a clean stop that settles a turn still running (docs/hermes.md and docs/reliability.md quote them).
_STOPPED_MID_TURN = "The gateway stopped or crashed during the turn."
# The host was not the hermes gateway and the turn ran warm there, in a process of its own that did not stop
# with it: "the gateway stopped" read as if hermes had, though it may well have answered. The host is named by
# what it may be (serve, `send` running the DM itself, a Python program's Gateway), not as serve alone: the
# recovering start cannot tell which one it was.
_HOST_STOPPED_MID_WARM_TURN = ("The gateway (hermes-actors serve, or the process embedding it) stopped or crashed "
                               "during the turn, which the hermes gateway ran in its own process: hermes may still "
                               "have answered it.")
_RUNNING_AT_STOP = "The turn was still running when the gateway stopped."
# A bot_peers DM the previous run acked (journaled) and never settled: its peer transport had it (a clean stop
# settles one still under way ``ambiguous`` too, ``_RUNNING_AT_STOP``); it is never sent a second time
_PEER_LOST = "The gateway stopped or crashed while the peer transport was delivering it."
# A DM sent over Redis the previous run acked (journaled once Redis queued it) and never settled, whose envelope and
# sent record Redis no longer holds (it lost data: appendfsync everysec, a crash): its target may have run it before
# Redis lost it, so it is never sent again
_REDIS_LOST = ("The gateway restarted and Redis no longer holds this DM's envelope or its record (Redis lost data, "
               "e.g. its last second with appendfsync everysec): its target may have received and answered it before, "
               "but that reply cannot reach this gateway.")
# A turn process of ours (the hermes CLI, a command) the stop ends: the words of a timed-out one it ended
_ENDED_AT_STOP = ("The turn was still running when the gateway stopped and was stopped with it; it may have been "
                  "partly done.")

#: Where a turn still running at a stop runs: ``apart`` warm in a hermes gateway that is not the host's process
#: (the stop cannot end it), ``process`` in a turn process of the host's (the stop ends it), ``here`` anywhere
#: else (in-process runner code, a live owner, another machine).
TurnPlace = Literal["apart", "process", "here"]


def stopped_mid_turn_text(runs_apart: bool) -> str:
    """Pure: why a turn the previous host started and never finished is ``ambiguous``.

    Args:
        runs_apart: the turn ran warm in a hermes gateway that is not the host's process (the host is
            ``serve``, ``send`` or a program embedding the ``Gateway``), so the host's stop or crash did not
            end it.

    Returns:
        The text the sender reads before "The message may have been delivered — do not resend."
    """
    return _HOST_STOPPED_MID_WARM_TURN if runs_apart else _STOPPED_MID_TURN


def running_at_stop_text(place: TurnPlace) -> str:
    """Pure: why a turn still running when its host stopped cleanly is ``ambiguous`` (the stop settles it).

    A warm turn gets the words a ``kill -9`` of the host gets at the next start
    (:func:`stopped_mid_turn_text`): either way hermes' gateway goes on with it.

    Args:
        place: where the turn runs (:data:`TurnPlace`).

    Returns:
        The text the sender reads before "The message may have been delivered — do not resend."
    """
    if place == "apart":
        return stopped_mid_turn_text(True)
    return _ENDED_AT_STOP if place == "process" else _RUNNING_AT_STOP


def redis_lost(delivery_id: str, label: str) -> Outcome:
    """Pure: the outcome of a DM sent over Redis that a restart finds neither settled nor in Redis any more.

    ``ambiguous`` (reason ``delivery_timeout``: no reply can come), never ``failed``: its envelope may have reached
    the target's stream, and its turn run, before Redis lost it, so a resend could run it twice.
    """
    return outcomes.ambiguous(delivery_id, label, _REDIS_LOST, DELIVERY_TIMEOUT)


def owner_outcome(delivery: Delivery, record: dict[str, Any] | None) -> Outcome:
    """Pure: the outcome of a DM the previous run handed to a live owner and never finished.

    Its journal's ``started`` record says ``live``: it was written once the mailbox record was
    ``claimed``, before the owner was called, so the owner may have the DM whatever the mailbox
    file says now. Only a final answer there is taken: ``settled`` (the owner's reply) or
    ``failed``; anything else (``claimed``, a ``queued`` one rewritten by another writer of our
    uid, ``ambiguous``, no readable record) is ``ambiguous``, never offered again. A forged
    ``settled`` record is taken as the owner's answer: the mailbox's idempotency trusts a record
    of our uid (docs/architecture.md, "Live-owner handoff").

    Args:
        delivery: the DM.
        record: its live-mailbox record (None: none, or unreadable).

    Returns:
        ``replied``/``silent``, ``failed`` or ``ambiguous``.
    """
    key, label = delivery.delivery_id, delivery.label
    status = record.get("status") if record is not None else None
    if record is not None and status == "settled":
        return outcomes.from_reply(key, label, str(record.get("reply") or ""))
    if record is not None and status == "failed":
        error = str(record.get("error") or "The live Bot Chat owner failed the turn.")
        return outcomes.failed(key, label, error, str(record.get("reason") or ""))
    return outcomes.ambiguous(key, label, _STOPPED_MID_TURN)


def plan_recovery(
    states: dict[str, Any],
    *,
    idempotent_runner: bool = False,
    live_record: Callable[[Delivery], dict[str, Any] | None] | None = None,
    never_reached: Callable[[Delivery], bool] | None = None,
    runs_apart: Callable[[Delivery], bool] | None = None,
    relay_resumed: bool = True,
) -> RecoveryPlan:
    """Decide each journaled delivery's fate (``states``: id → ``DeliveryState``).

    A started-not-finished turn is re-offered only when the runner declared itself
    idempotent; otherwise it is ambiguous and never runs twice. A wake is re-offered too
    when ``never_reached`` (the runner's look at the bot's session) says its turn provably
    never reached the bot: it never ran, and ambiguous it would be lost for good (a DM's
    sender is told, a wake's bot is not). ``never_reached`` is asked about those wakes
    alone. ``runs_apart`` (the runner's: the turn ran warm in a hermes gateway apart from this
    host) words why such a turn is ambiguous (:func:`stopped_mid_turn_text`), unless its ``started``
    record says it ran with the CLI (``via``). One the journal says was
    handed to a live owner (its ``started`` record says ``live``) is judged by
    :func:`owner_outcome` from its live-delivery mailbox record (``live_record``): a
    ``settled`` or ``failed`` record is that turn's real result, anything else is
    ambiguous, and it is never re-offered (not even for an idempotent runner: the owner is
    not the runner). A ``bot_peers`` DM (origin ``peer``) without an outcome is ambiguous, never
    re-offered: its transport had it from its ack on (no record says whether it sent it), and the
    transport is not idempotent by delivery id (``hermes peer dm`` has no id to dedupe by). A DM sent
    over Redis (origin ``redis``) without an outcome is in ``states`` only when the relay did not resume
    it (the caller leaves out those it did): with ``relay_resumed`` (the relay read Redis's ``sent`` hash)
    Redis lost it: ambiguous (:func:`redis_lost`), never sent again; else ``relayed``, decided once the
    relay reads Redis. The mailbox
    is asked about no other DM: a planted record cannot make
    a runner's turn run twice.
    """
    plan = RecoveryPlan()
    plan.known.update(known_outcomes(states))
    for key, state in states.items():
        if state.delivered:
            continue
        if state.outcome is not None:
            plan.redeliver.append(outcome_from_record(key, state.outcome))
            continue
        if state.delivery is None:
            continue  # a torn record without its acceptance: nothing was acked
        delivery = delivery_from_record(state.delivery, key)
        if delivery.origin == PEER_ORIGIN:
            plan.ambiguous.append((delivery, outcomes.ambiguous(key, delivery.label, _PEER_LOST)))
        elif delivery.origin == REDIS_ORIGIN and not relay_resumed:
            plan.relayed.append(delivery)
        elif delivery.origin == REDIS_ORIGIN:
            plan.ambiguous.append((delivery, redis_lost(key, delivery.label)))
        elif state.started and state.live:
            outcome = owner_outcome(delivery, live_record(delivery) if live_record is not None else None)
            if outcome.status == "ambiguous":
                plan.ambiguous.append((delivery, outcome))
            else:
                plan.redeliver.append(outcome)
        elif state.started and not idempotent_runner and not (
                is_wake(delivery) and never_reached is not None and never_reached(delivery)):
            # a turn journaled as run by the CLI ran in a process of the dead host's, whatever runs_apart says
            why = stopped_mid_turn_text(state.via != "cli" and runs_apart is not None and runs_apart(delivery))
            plan.ambiguous.append((delivery, outcomes.ambiguous(key, delivery.label, why)))
        else:
            plan.reoffer.append(_reoffered(delivery))
    return plan
