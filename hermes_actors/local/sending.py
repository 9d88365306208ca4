"""A DM's way in from its sender's thread (where a :class:`SendRequest` becomes an ack), and its
outcome's way back (:func:`outcome_future`).

A first-hop DM to a local profile is admitted right here, on the sender's thread,
from the published roster snapshot (:class:`CallerAdmission`), and reaches the
Dispatcher as one tell (:class:`AcceptLocal`): in memory the sender has its ack
without waiting for any actor; in durable mode it journals the acceptance itself
and waits only for that group commit, never for the Dispatcher. Every other
request (DMs from inside turns, relay and peer targets, refusals) is asked of the
Dispatcher, which owns the state those need; one the remote roster decides is
asked after ``roster.json`` as it is now reached the Dispatcher (:func:`fresh_remote_roster`).
"""

from __future__ import annotations

import functools
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, ask, tell
from hermes_actors.core.acks import accepted_record, ack_payload, journal_refusal, resolve_ack
from hermes_actors.errors import StoreError
from hermes_actors.faults import crashpoint
from hermes_actors.local.admission import CallerAdmission
from hermes_actors.messages import AcceptLocal, AwaitOutcome, RefusalAnswered, RemoteRosterHint, SendRequest
from hermes_actors.store.journal import Journal

__all__ = ["counted", "fresh_remote_roster", "outcome_future", "send_dm"]


def send_dm(
    dispatcher: pykka.ActorRef[Any],
    request: SendRequest,
    *,
    admission: CallerAdmission | None,
    journal: Journal | None,
    timeout: float,
) -> dict[str, Any]:
    """Send ``request``; the tool's ack or refusal dict.

    Args:
        dispatcher: the DispatcherActor.
        request: the DM.
        admission: the caller-side admission (None: always ask the Dispatcher).
        journal: the gateway's journal in durable mode (the acceptance is on disk
            before the ack is returned), None in memory.
        timeout: seconds to wait for the Dispatcher or the journal.

    Returns:
        The ack (``delivery_id``...) or the refusal (``error``, ``reason``...).

    Raises:
        ActorGone: the Dispatcher, the RosterActor or the journal is gone (the gateway stopped).
        RuntimeError: the gateway stopped accepting.
    """
    planned = admission.plan_local(request) if admission is not None else None
    if planned is None:
        if admission is not None:
            fresh_remote_roster(admission, request, timeout=timeout)
        return counted(dispatcher, resolve_ack(ask(dispatcher, request, timeout=timeout), timeout=timeout))
    route, delivery = planned
    assert admission is not None  # it planned the DM
    ack = ack_payload(delivery.delivery_id, delivery.label, now=delivery.accepted_at)  # the route's label, built once
    accept = AcceptLocal(route.target, delivery, ack, journaled=journal is not None)
    if journal is not None:
        try:
            # a partial, not a lambda: a closure here gave every DM, journaled or not, cells for what it uses
            journal.append_durably(accepted_record(delivery), timeout=timeout,
                                   on_interrupt=functools.partial(_interrupted, dispatcher, accept, admission))
        except StoreError as exc:
            admission.withdraw(delivery.delivery_id)  # nothing was acked: its place in the queue is free
            if not journal.running:
                raise ActorGone("the delivery journal stopped: the gateway is stopping") from exc
            return counted(dispatcher, journal_refusal(exc))
        crashpoint("after-journal-before-ack")
    told = tell(dispatcher, accept)
    if not told and journal is None:
        raise ActorGone("cannot tell AcceptLocal: the Dispatcher is gone")
    # Journaled, the DM is acked even if the Dispatcher is gone: the next start on this root re-offers it.
    return ack


def fresh_remote_roster(admission: CallerAdmission, request: SendRequest, *, timeout: float) -> None:
    """Before ``request`` is asked of the Dispatcher: when the remote roster decides it and ``roster.json``
    was rewritten since the snapshot was read (:meth:`CallerAdmission.roster_rewritten`, one ``lstat``),
    ask the RosterActor, the file's one reader, to re-read it.

    The RosterActor tells its subscribers the new snapshot before it answers, so the Dispatcher has it
    in its mailbox ahead of ``request``: the DM is planned with the roster as it is at the call, not
    as the file's event (a few milliseconds later) would have made it. Asked from the sender's thread
    (the caller's, or a turn's): the RosterActor asks no actor, so this cannot deadlock.

    Args:
        admission: the caller-side admission (its snapshot, the roster file and the RosterActor).
        request: the DM.
        timeout: seconds to wait for the RosterActor.

    A RosterActor that does not answer within ``timeout`` (busy re-reading many profiles) holds the DM up no
    longer: it is planned with the snapshot the Dispatcher has, as before this check existed (the file's
    event brings the rewrite a moment later); the check is for freshness, never a reason to fail a DM.

    Raises:
        ActorGone: the RosterActor is gone (the gateway stopped).
    """
    if admission.roster is not None and admission.roster_rewritten(request):
        try:
            ask(admission.roster, RemoteRosterHint(), timeout=timeout)
        except AskTimeout:
            logger.debug("roster.json was rewritten, and the RosterActor did not re-read it within {}s: the DM is "
                         "planned with the roster the Dispatcher has", timeout)


def _interrupted(
    dispatcher: pykka.ActorRef[Any], accept: AcceptLocal, admission: CallerAdmission, error: BaseException | None,
) -> None:
    """The fate of a DM whose sender was interrupted (a KeyboardInterrupt) waiting for its ``accepted`` record.

    Only a send on the main thread can be interrupted there (the journal's ``on_interrupt``): a signal
    handler's, made between the main thread's ``stop()`` closing the gateway's call thread and that stop's
    beginning (facade/off_main.py; every other main-thread call runs on the call thread, and an interrupt
    ends only the main thread's wait for it). Called once by the journal (on the committing thread, or at
    once). Landed (``error`` None), the DM is journaled: it runs now, as it would at the next start,
    although its sender never got the ack (docs/reliability.md). Not written, its place in the queue is
    free again.
    """
    if error is None:
        tell(dispatcher, accept)
    else:
        admission.withdraw(accept.delivery.delivery_id)


def counted(dispatcher: pykka.ActorRef[Any], answer: dict[str, Any]) -> dict[str, Any]:
    """Have the Dispatcher count ``answer`` when it is a refusal; every answer to a DM's sender passes here.

    The one place refusals are counted: some are made on the sender's thread (a journal that
    could not record a first-hop DM, an ack not confirmed in time) or after the Dispatcher
    answered (a journal commit that failed, the relay's refusal), where the Dispatcher never
    sees them. Told before the answer is returned, so a ``stats()`` asked afterwards counts it.

    Args:
        dispatcher: the DispatcherActor (gone: the refusal is not counted, as no stats can be asked).
        answer: the ack or refusal (``error``, ``reason``) about to be returned to the caller.

    Returns:
        ``answer``, unchanged.
    """
    if "error" in answer:
        tell(dispatcher, RefusalAnswered(str(answer.get("reason") or "unknown")))
    return answer


def outcome_future(dispatcher: pykka.ActorRef[Any], delivery_id: str) -> pykka.ThreadingFuture[dict[str, Any]]:
    """A future the Dispatcher sets with the outcome dict of ``delivery_id`` (told, not asked).

    Its ``get`` raises ``KeyError`` when the Dispatcher never issued the id (and no journal
    holds it), and ``pykka.Timeout`` as any future. The Dispatcher may stop before it sees the
    request: the caller waits with a deadline, as for the outcome itself.

    Raises:
        ActorGone: the Dispatcher is gone (the gateway stopped).
    """
    future: pykka.ThreadingFuture[dict[str, Any]] = pykka.ThreadingFuture()
    if not tell(dispatcher, AwaitOutcome(delivery_id, future)):
        raise ActorGone(f"cannot wait for the outcome of {delivery_id}: the Dispatcher is gone")
    return future
