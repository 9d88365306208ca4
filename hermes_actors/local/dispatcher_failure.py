"""What a failed Dispatcher still owes before it is gone: an outcome for each DM only its memory held.

The DispatcherActor's ``on_crash`` runs :func:`answer_after_failure`, best effort, on its own thread after an
error escaped a handler: :func:`read_failed_mailbox` (pure) sorts what its book and its
never-handled mailbox held; :func:`settle_after_failure` gives each DM acked from memory
only its outcome (:func:`~hermes_actors.core.failure.outcomes_after_failure` decides
which); :func:`answer_waiters_after_failure` answers every ``wait_outcome`` caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from hermes_actors.core.failure import HeldDelivery, failure_text, outcomes_after_failure
from hermes_actors.local.durability import Durability
from hermes_actors.local.notifier import Notifier
from hermes_actors.local.outcome_book import KeptOutcomes, OutcomeBook, Pending
from hermes_actors.local.outcome_flow import Note, answer_room
from hermes_actors.messages import (
    AcceptLocal,
    AwaitOutcome,
    Delivery,
    JournalDurable,
    NotifyOutcomes,
    Outcome,
    OutcomeReady,
    OutcomesReady,
    RelayedOutcome,
    RoomTurn,
)

__all__ = [
    "FAILED_DRAIN_SECONDS",
    "FailedCallback",
    "FailedMailbox",
    "answer_after_failure",
    "answer_waiters_after_failure",
    "read_failed_mailbox",
    "settle_after_failure",
]

FAILED_DRAIN_SECONDS = 10.0  # a failed Dispatcher waits this long for the journal's last commits

FailedCallback = Callable[[BaseException | None, KeptOutcomes, list[str]], None]


@dataclass
class FailedMailbox:
    """What the failed Dispatcher held, from its book and its never-handled mailbox.

    Attributes:
        held: every delivery it held: the book's pending ones (started), then the acked
            ones still in the mailbox (never started).
        arrived: outcomes that reached the mailbox but were never handled, by delivery id
            (the first one wins).
        rooms: where each room member turn still in the mailbox is answered, by delivery id.
        untaken: acked DMs still in the mailbox (the book never had them), by delivery id.
    """

    held: list[HeldDelivery] = field(default_factory=list)
    arrived: dict[str, Outcome] = field(default_factory=dict)
    rooms: dict[str, Callable[[Outcome], None]] = field(default_factory=dict)
    untaken: dict[str, Delivery] = field(default_factory=dict)


def read_failed_mailbox(pending: Iterable[tuple[str, Pending]], mailbox: Iterable[Any]) -> FailedMailbox:
    """Pure: sort what the failed Dispatcher held (see :class:`FailedMailbox`).

    Args:
        pending: the OutcomeBook's pending entries, by delivery id.
        mailbox: the messages it never handled, in order.

    Returns:
        The deliveries it held, the outcomes that arrived, the rooms to answer and the untaken DMs.
    """
    found = FailedMailbox(held=[HeldDelivery(key, entry.delivery.label, entry.route, entry.journaled, started=True)
                                for key, entry in pending])
    for message in mailbox:
        if isinstance(message, AcceptLocal):
            delivery = found.untaken[message.delivery.delivery_id] = message.delivery
            found.held.append(HeldDelivery(delivery.delivery_id, delivery.label, "local", message.journaled,
                                           started=False))
        elif isinstance(message, RoomTurn):
            delivery = message.delivery
            found.rooms[delivery.delivery_id] = message.reply
            found.held.append(HeldDelivery(delivery.delivery_id, delivery.label, "room", False, started=False))
        elif isinstance(message, OutcomeReady | RelayedOutcome | OutcomesReady):
            # (a relayed one's record stays with its relay: the next start settles it again)
            many = message.outcomes if isinstance(message, OutcomesReady) else (message.outcome,)
            for outcome in many:
                found.arrived.setdefault(outcome.delivery_id, outcome)
    return found


def settle_after_failure(
    book: OutcomeBook, notifier: Notifier, error: BaseException | None, mailbox: list[Any]
) -> None:
    """Give each DM acked from memory only its outcome (``outcomes_after_failure``): waiters, rooms, subscribers.

    Args:
        book: the failed Dispatcher's OutcomeBook (its waiters are answered as each settles).
        notifier: the subscribers' Notifier (each DM subscriber is told in one message).
        error: what escaped the handler (None: unknown).
        mailbox: the messages it never handled.
    """
    found = read_failed_mailbox(book.pending(), mailbox)
    settled = outcomes_after_failure(found.held, found.arrived, failure_text(error))
    notes: list[Note] = []
    for outcome in settled:
        key = outcome.delivery_id
        known: Delivery | None = book.delivery(key) or found.untaken.get(key)
        entry = book.settle(key, outcome.as_dict())
        room_reply = entry.room_reply if entry is not None else found.rooms.get(key)
        if room_reply is not None or (entry is not None and entry.route == "room"):
            answer_room(room_reply, outcome)
            continue
        notes.append((outcome.as_dict(), known, time.time()))
    if settled:
        logger.error("the Dispatcher failed: {} DM(s) held in memory only were settled (ambiguous, or "
                     "failed when they never started)", len(settled))
    if notes:
        notifier.tell(NotifyOutcomes(tuple(notes)))


def answer_waiters_after_failure(
    book: OutcomeBook, mailbox: list[Any], on_await: Callable[[AwaitOutcome], None]
) -> None:
    """``wait_outcome`` callers: the outcome when it is known now, else 'no outcome yet' at once.

    Args:
        book: the failed Dispatcher's OutcomeBook.
        mailbox: the messages it never handled (their ``AwaitOutcome`` asks are answered too).
        on_await: the Dispatcher's ``AwaitOutcome`` handler (answers now, or registers a waiter).
    """
    for message in mailbox:
        if isinstance(message, AwaitOutcome):
            on_await(message)  # answered now, or registered as a waiter below
    book.fail_waiters(lambda key: TimeoutError(
        f"delivery {key} has no outcome yet: the gateway's dispatcher failed; the next start on the root "
        "settles it (journaled DMs are re-offered)"))


def answer_after_failure(
    *,
    book: OutcomeBook,
    durability: Durability,
    notifier: Notifier,
    error: BaseException | None,
    mailbox: list[Any],
    on_await: Callable[[AwaitOutcome], None],
    on_failed: FailedCallback | None,
) -> None:
    """Answer everyone still waiting on the failed Dispatcher, then tell the gateway (``on_failed``).

    The DMs acked from memory only get their outcome, the acks waiting for a journal commit
    are answered, and so are the ``wait_outcome`` callers. Each step is best effort: the state
    that failed is the one read.

    Args:
        book: the failed Dispatcher's OutcomeBook.
        durability: its durability strategy (its parked acks are answered).
        notifier: the subscribers' Notifier.
        error: what escaped the handler (None: unknown).
        mailbox: the messages it never handled.
        on_await: its ``AwaitOutcome`` handler.
        on_failed: the gateway's callback: with the error, the outcomes a stopped Gateway keeps
            answering (``OutcomeBook.export``) and the ids of the deliveries whose turns may still run (None: none).
    """
    running = [key for key, entry in book.pending() if entry.route in ("local", "room")]
    reports = [message for message in mailbox if isinstance(message, JournalDurable)]
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("settle the DMs it held in memory", lambda: settle_after_failure(book, notifier, error, mailbox)),
        ("answer the acks waiting for their journal commit",
         lambda: durability.settle_parked(reports, timeout=FAILED_DRAIN_SECONDS)),
        ("answer the outcome waiters", lambda: answer_waiters_after_failure(book, mailbox, on_await)),
    ]
    for what, step in steps:
        try:
            step()
        except Exception:
            logger.exception("the failed Dispatcher could not {}", what)
    final: KeptOutcomes = {}
    try:
        final = book.export()
    except Exception:
        logger.exception("the failed Dispatcher could not export its settled outcomes")
    if on_failed is not None:
        try:
            on_failed(error, final, running)
        except Exception:
            logger.exception("the gateway's on_failure callback failed")
