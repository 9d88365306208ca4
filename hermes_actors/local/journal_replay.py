"""The Dispatcher's side of a start on a journaled root: act on what the previous run's journal says.

:func:`~hermes_actors.core.recovery.plan_recovery` decides (pure); :func:`replay_journal`
carries its plan out on the Dispatcher's thread: outcomes the previous run settled but never
reported are published once, DMs that may have run are settled ``ambiguous`` (a live owner's
mailbox record too), DMs that never started are offered again (or fail when their target is
gone). :func:`adopt_journal` runs before the relay resumes, so its resumed sends find the
journal's settled outcomes and wakes, and settles the relayed-in DMs for good (nobody here is told of
them): no transport can offer a relayed-in envelope before the Dispatcher knows the journal's verdict.
A running gateway adopting the journal of a gateway that stopped
or died beside it does the same, in the same order around its relay's takeover of that gateway's
``sent/`` records (:class:`~hermes_actors.relay.journal_takeover.JournalTakeover`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.core.names import profile_key
from hermes_actors.core.recovery import (
    RecoveryPlan,
    known_outcomes,
    plan_recovery,
    readable_states,
    relayed_in_states,
)
from hermes_actors.local.durability import live_gave_up, live_record
from hermes_actors.local.outcome_book import DeliveryState, OutcomeBook, Pending
from hermes_actors.local.outcome_flow import OutcomeFlow
from hermes_actors.messages import REDIS_ORIGIN, Delivery, ProfileInfo
from hermes_actors.store.journal_records import delivery_origin

__all__ = ["adopt_journal", "replay_journal"]


def adopt_journal(
    states: dict[str, Any],
    *,
    flow: OutcomeFlow,
    idempotent_runner: bool,
    index: dict[str, ProfileInfo],
    never_reached: Callable[[Delivery], bool] | None = None,
    runs_apart: Callable[[Delivery], bool] | None = None,
    settle_relayed_in: bool = True,
) -> dict[str, int]:
    """Learn the previous run's settled outcomes and wakes from its journal, and its verdict on relayed-in DMs.

    Done before the relay resumes, before any transport (the file relay's ``inbox/`` and shelves, the Desktop
    RPC, a Redis resume or reclaim) can offer an envelope: its resumed sends are settled from its files at
    once, so an outcome the journal already has is then a second one (dropped), and a wake the journal holds
    is not started again. A relayed-in DM is settled here for good (:func:`_keep_relayed_in`): one that started
    and never finished is ``ambiguous``, one that finished keeps its outcome, so its envelope offered again by
    whichever transport is answered with it (``relay_in_step``) and runs no turn. Local re-offers and
    re-publishes wait for :func:`replay_journal`, once the relay can carry what re-offered turns send.

    Args:
        states: the journal's state of each delivery id (unreadable ones are skipped here;
            :func:`replay_journal` names them, once).
        flow: the Dispatcher's outcome flow (its book learns the settled outcomes, its waker the wakes that
            exist already, its durability journals the relayed-in DMs' verdicts).
        idempotent_runner: the runner may run a turn twice (a relayed-in DM that started and never finished
            is then forgotten: its retry runs it).
        index: the local profiles now, by key.
        never_reached: as for :func:`replay_journal`.
        runs_apart: as for :func:`replay_journal`.
        settle_relayed_in: False once the gateway stops (a running gateway's adoption arriving then): the
            relayed-in DMs are only remembered, their live records stay journaled for the next start.

    Returns:
        The counts of what was done with relayed-in DMs: ``ambiguous`` and ``known`` (remembered outcomes).
    """
    readable, _unreadable = readable_states(states)
    flow.waker.adopt(readable)
    relayed_in, others = relayed_in_states(readable)
    flow.book.remember(known_outcomes(others))
    if not settle_relayed_in:
        flow.book.remember(known_outcomes(relayed_in))
        return {"ambiguous": 0, "known": 0}
    relayed_in = _not_known_here(relayed_in, flow)
    plan = plan_recovery(relayed_in, idempotent_runner=idempotent_runner,
                         live_record=lambda delivery: live_record(index, delivery), never_reached=never_reached,
                         runs_apart=runs_apart)
    counts = _keep_relayed_in(plan, relayed_in, index=index, flow=flow)
    if counts["ambiguous"]:
        logger.info("recovery: {} relayed-in DM(s) that started and never finished settled ambiguous (never run "
                    "again; a retry of the envelope is answered so)", counts["ambiguous"])
    return counts


def replay_journal(
    states: dict[str, Any],
    *,
    idempotent_runner: bool,
    index: dict[str, ProfileInfo],
    flow: OutcomeFlow,
    requeue: Callable[[ProfileInfo, Delivery], None],
    never_reached: Callable[[Delivery], bool] | None = None,
    runs_apart: Callable[[Delivery], bool] | None = None,
    adopted_from: tuple[str, ...] = (),
    relayed: frozenset[str] = frozenset(),
    relay_reported: frozenset[str] = frozenset(),
    relay_resumed: bool = True,
    await_resume: Callable[[Delivery], None] | None = None,
) -> dict[str, int]:
    """Act on the journal of a previous run, or of a gateway that stopped or died beside this running one
    (see ``recovery.plan_recovery``).

    A DM to re-offer or settle ``ambiguous`` that this run has pending or settled already (a journal adopted a
    second time) is left as it is, and one settled here has its ``delivered`` record journaled again, so the
    adopted copy leaves our journal's live state: it never runs twice, in this run or after a later start.

    Args:
        states: the journal's state of each delivery id.
        idempotent_runner: the runner may run a turn twice (an unfinished one is re-offered then).
        index: the local profiles now, by key.
        flow: the Dispatcher's outcome flow (its book, durability and waker are the ones used).
        requeue: queues a journaled delivery on the ProfileActor of its profile, booked pending
            (``DispatcherActor.deliver_local``).
        never_reached: whether a wake the previous run started provably never reached its bot
            (the runner's hook, ``turns.turn_never_reached``): it is offered again then.
        runs_apart: whether a turn ran warm in a hermes gateway apart from this host (the runner's
            hook, ``turns.turn_runs_apart``): its ``ambiguous`` text says hermes may still have answered.
        adopted_from: a running gateway's adoption: the journal files (named in its log line).
        relayed: outcomes of relayed DMs the relay still holds (their ``sent/`` record, or their ``consumed/``
            mark: :func:`~hermes_actors.relay.journal_takeover.relayed_fates`; at a start, not the records its own
            relay resumed): the gateway that took the record over reports them and wakes their senders, so they
            are not published here (a taker that is another gateway would make it two outcomes). One whose record
            is still in ``sent/`` stays undelivered in our journal until the record goes (the relay's rescans
            then settle it: ``JournalTakeover.follow``): marked delivered, its taker, which reads the root's
            journals before it reports, would take it for reported and wake nobody.
        relay_reported: those of ``relayed`` the relay reported and forgot already (their ``consumed/`` mark
            alone): marked delivered here.
        relay_resumed: the relay told its complete list of the envelopes it waits for again (``RelayResumed``):
            a DM sent over Redis without an outcome that it did not resume was lost by Redis (``ambiguous``).
            False: Redis was unreachable; such a DM goes to ``await_resume`` (settled once the relay reads Redis).
        await_resume: books such a DM pending until the relay's complete list (``RemoteSends.await_resume``).

    Returns:
        The counts of what was done (``reoffered``, ``ambiguous``, ``redelivered``, ``known``,
        and ``unreadable`` when some records could not be read); not of the relayed-in DMs, which
        :func:`adopt_journal` settled before.
    """
    readable, unreadable = readable_states(states)
    if unreadable:
        logger.warning("recovery: {} journaled DM(s) skipped, their 'accepted' record cannot be read "
                       "(a corrupt or foreign line in bot_relay/journal/): {}",
                       len(unreadable), ", ".join(map(repr, unreadable)))  # repr: an id may hold a newline
    book, durability = flow.book, flow.durability
    flow.waker.adopt(readable)
    _relayed_in, readable = relayed_in_states(readable)  # settled by adopt_journal, before any transport offered one
    readable = _not_known_here(_not_resumed(readable, book), flow)
    plan = plan_recovery(readable, idempotent_runner=idempotent_runner,
                         live_record=lambda delivery: live_record(index, delivery), never_reached=never_reached,
                         runs_apart=runs_apart, relay_resumed=relay_resumed)
    book.remember(plan.known)
    left = 0
    for outcome in plan.redeliver:
        if book.has_outcome(outcome.delivery_id):
            # the relay, resumed before this, already settled it (a relayed DM's reply still in its files):
            # published once in this run, first one wins
            durability.delivered(outcome.delivery_id)
            continue
        if outcome.delivery_id in relayed:  # a running gateway's adoption: whoever took its sent/ record reports it
            left += 1
            if outcome.delivery_id in relay_reported:
                durability.delivered(outcome.delivery_id)
            continue
        durability.note({"t": "finished", "id": outcome.delivery_id, "o": outcome.as_dict()})
        flow.publish(outcome)
        durability.delivered(outcome.delivery_id)
    for delivery, outcome in plan.ambiguous:
        if readable[delivery.delivery_id].live:  # handed to a live owner: its mailbox record says so too
            live_gave_up(index, delivery, outcome.error)  # (a runner's DM has none of ours: a planted one is left)
        book.add(delivery.delivery_id, Pending(delivery, "local", journaled=True))
        flow.settle(outcome)
    for delivery in plan.reoffer:
        _reoffer(delivery, index=index, flow=flow, requeue=requeue)
    for delivery in plan.relayed:  # Redis unreachable at start: settled once the relay reads it
        if await_resume is not None:
            await_resume(delivery)
    counts = plan.counts()
    if unreadable:
        counts["unreadable"] = len(unreadable)
    if adopted_from:  # one line per adoption, whatever it found
        logger.info(
            "recovery: adopted the journal {} of a gateway on this root that stopped or was killed: {reoffered} "
            "re-offered, {ambiguous} ambiguous, {redelivered} outcomes re-delivered ({left} of them left to the "
            "relay that took over their sent/ records), {known} settled outcomes known",
            ", ".join(adopted_from), left=left, **counts,
        )
    elif any(counts.values()):  # a start, or a rescan settling relayed DMs left to the relay (JournalTakeover.follow)
        logger.info(
            "recovery: {reoffered} re-offered, {ambiguous} ambiguous, {redelivered} outcomes re-delivered{left}, "
            "{known} settled outcomes known",
            left=f" ({left} of them left to the relay that took over their sent/ records)" if left else "", **counts,
        )
    return counts


def _keep_relayed_in(plan: RecoveryPlan, states: dict[str, Any], *, index: dict[str, ProfileInfo],
                     flow: OutcomeFlow) -> dict[str, int]:
    """Carry out what the journal says of relayed-in DMs (``recovery.relayed_in_states``): remember, never run.

    Their outcome is kept for a retry of their envelope (``relay_in_step`` answers it from the book) and journaled
    with its ``delivered`` record, as :meth:`OutcomeFlow.settle` keeps one: a DM that started and never finished is
    ``ambiguous`` (its live-mailbox record too, when a live owner had it), one whose ``delivered`` record was lost
    keeps its outcome. Nobody is told: their senders are on other connections, answered through the relay (a
    dead shelf's envelope by the file relay's adoption, a reclaimed Redis entry whose turn the dead process had
    claimed with this outcome, by ``relay_in_step``), or asking again (the Desktop). One the plan would re-offer (an
    idempotent runner) is forgotten: its retry runs it.

    Args:
        plan: :func:`~hermes_actors.core.recovery.plan_recovery` of ``states``.
        states: the relayed-in DMs' journal states.
        index: the local profiles now, by key.
        flow: the Dispatcher's outcome flow (its book and durability are the ones used).

    Returns:
        The counts to add to the recovery's: ``ambiguous``, and ``known`` (remembered outcomes).
    """
    book, durability = flow.book, flow.durability
    book.remember(plan.known)
    for delivery, outcome in plan.ambiguous:
        if states[delivery.delivery_id].live:  # handed to a live owner: its mailbox record says so too
            live_gave_up(index, delivery, outcome.error)
    for outcome in [*plan.redeliver, *(outcome for _delivery, outcome in plan.ambiguous)]:
        durability.finished(outcome, relayed_in=True)  # with its delivered record: it leaves the live state
        book.remember({outcome.delivery_id: outcome.as_dict()})
    for delivery in plan.reoffer:
        durability.delivered(delivery.delivery_id)
    return {"ambiguous": len(plan.ambiguous), "known": len(plan.known) + len(plan.redeliver)}


def _not_resumed(states: dict[str, Any], book: OutcomeBook) -> dict[str, Any]:
    """``states`` without the DMs sent over Redis that the relay resumed (pending in ``book``, booked by
    ``RemoteSends.resumed`` before the journal is replayed): Redis still holds them, and their reply or reply
    deadline settles them as before the restart (one outcome; not named as already known).

    Args:
        states: readable journal states.
        book: the Dispatcher's book.

    Returns:
        The states still to act on, in journal order.
    """
    return {key: state for key, state in states.items()
            if not (state.outcome is None and delivery_origin(state) == REDIS_ORIGIN
                    and book.state(key) is DeliveryState.PENDING)}


def _not_known_here(states: dict[str, Any], flow: OutcomeFlow) -> dict[str, Any]:
    """``states`` without the DMs this run has pending or settled already (:func:`_known_here`): a journal adopted
    a second time (never at a start: its book knows no DM yet) is not acted on for them, and, the DM settled here,
    its copy leaves our journal's live state (adoption made it live there: once our kept outcomes dropped the DM,
    a later start would offer it again).

    Args:
        states: readable journal states.
        flow: the Dispatcher's outcome flow (its book and durability).

    Returns:
        The states still to act on, in journal order.
    """
    book = flow.book
    known_here = _known_here(states, book)
    if not known_here:
        return states
    logger.warning("recovery: {} journaled DM(s) already pending or settled in this run are not acted on "
                   "again: {}", len(known_here), ", ".join(sorted(known_here)))
    for key in sorted(known_here):
        if book.state(key) is DeliveryState.SETTLED:  # published, its own delivered record written already
            flow.durability.delivered(key)
    return {key: state for key, state in states.items() if key not in known_here}


def _known_here(states: dict[str, Any], book: OutcomeBook) -> set[str]:
    """The journaled DMs without an outcome (to re-offer or settle ``ambiguous``) that this run has pending or
    settled already (a journal adopted a second time). One with an outcome is re-published unless this run has
    one (``has_outcome``); a delivered one is only remembered."""
    return {key for key, state in states.items()
            if not state.delivered and state.outcome is None and book.state(key) is not DeliveryState.UNKNOWN}


def _reoffer(
    delivery: Delivery, *, index: dict[str, ProfileInfo], flow: OutcomeFlow,
    requeue: Callable[[ProfileInfo, Delivery], None],
) -> None:
    """Offer a journaled DM that never started again; it fails (NOT delivered) when its target is gone."""
    info = index.get(profile_key(delivery.target))
    if info is not None:
        requeue(info, delivery)
        return
    flow.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=True))
    text = outcomes.gone_text(delivery.target)
    flow.settle(outcomes.failed(delivery.delivery_id, delivery.label, text, "unknown"))
