"""A running gateway takes over the journals of gateways on its root that stopped or died beside it.

The start's rules and code, at each relay rescan (``bot_mode.rescan_seconds``), in the start's order
around the relay: the journal files whose ``flock`` is free and that hold something unfinished are
adopted into our own file (:meth:`hermes_actors.store.journal.Journal.adopt_dead`, under its write turn),
the Dispatcher learns their settled outcomes and wakes (``AdoptJournal``), then the relay takes over the
dead gateways' ``sent/`` records (:meth:`hermes_actors.relay.relay_actor.RelayActor._take_over`), then the
Dispatcher acts on the rest (``Recover``: what never started is re-offered, what may have run is
``ambiguous``, settled outcomes never reported are published once, unrun wakes are run). Each is a tell from
the relay's thread, so the Dispatcher handles them in that order, the relay's reports in between, as at a
start. Before, a running gateway only read those journals: their DMs and wakes waited for the next start.
"""

from __future__ import annotations

from typing import Any

import pykka

from actors import tell
from hermes_actors.messages import AdoptJournal, Recover
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_records import DeliveryState, JournalFolded
from hermes_actors.store.relay_inbox import InboxPaths, is_consumed

__all__ = ["JournalTakeover", "relayed_outcomes"]


def relayed_outcomes(states: dict[str, DeliveryState]) -> list[str]:
    """Pure: the ids whose journaled outcome is a relayed DM's, not yet delivered.

    A relayed DM's journal holds its ``finished`` record but no ``accepted`` one (its ``sent/``
    record is the relay's); a local or wake delivery always has its acceptance, a peer DM is
    journaled delivered with its outcome.

    Args:
        states: an adopted journal's delivery states.

    Returns:
        Those ids, in journal order.
    """
    return [key for key, state in states.items()
            if state.outcome is not None and not state.delivered and state.delivery is None
            and not state.unreadable_acceptance]


class JournalTakeover:
    """What the file relay calls at its rescans to take over dead gateways' journals (see the module docstring).

    Args:
        journal: this gateway's journal.
        dispatcher: the DispatcherActor (told, never asked: the relay's thread must not wait on it).
        idempotent_runner: the runner may run a turn twice (recovery re-offers an unfinished one then).
    """

    def __init__(self, journal: Journal, dispatcher: pykka.ActorRef[Any], *, idempotent_runner: bool) -> None:
        self.journal = journal
        self.dispatcher = dispatcher
        self.idempotent_runner = idempotent_runner

    def adopt(self) -> JournalFolded | None:
        """Adopt what is to adopt and tell the Dispatcher its settled outcomes and wakes (before the relay's takeover).

        Returns:
            The adopted state, for :meth:`recover` once the relay took over; None when nothing was adopted.
        """
        adopted = self.journal.adopt_dead()
        if adopted is not None:
            # never raises: a Dispatcher gone (our stop) leaves the adopted records in our journal for the next start
            tell(self.dispatcher, AdoptJournal(adopted.states))
        return adopted

    def recover(self, adopted: JournalFolded, paths: InboxPaths) -> None:
        """After the relay's takeover: tell the Dispatcher to act on the adopted journal.

        Args:
            adopted: what :meth:`adopt` returned.
            paths: the relay layout (whose ``sent/`` and ``consumed/`` say which relayed DMs the relay holds).
        """
        waiting: set[str] = set()
        reported: set[str] = set()
        for key in relayed_outcomes(adopted.states):
            # sent/ first: a relay that reports a DM marks it consumed before it clears the record
            if paths.relay.id_file(paths.sent, key).exists():
                waiting.add(key)  # its taker reads the journals before it reports: left live (not delivered) here
            elif is_consumed(paths, key):
                reported.add(key)
        tell(self.dispatcher, Recover(adopted.states, self.idempotent_runner, adopted_from=tuple(adopted.files),
                                     relayed=frozenset(waiting | reported), relay_reported=frozenset(reported)))
