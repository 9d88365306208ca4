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

A relayed DM whose outcome an adopted journal holds undelivered is left to whoever holds its ``sent/`` record
(:func:`relayed_fates`): that gateway reports it and wakes its sender, possibly another gateway than this one.
Its copy in our journal stays undelivered meanwhile, so each rescan looks again (:meth:`JournalTakeover.follow`):
once the record is gone the DM is settled in our journal by the same rule (``delivered`` when its ``consumed/``
mark says it was reported). A start does the same for the journals it adopts (:meth:`JournalTakeover.sort`,
:meth:`JournalTakeover.watch`), leaving out the records its own relay resumed. Before, nothing wrote that
``delivered`` record, and a later start adopting our journal published the DM's outcome a second time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Set
from typing import Any

import pykka
from loguru import logger

from actors import tell
from hermes_actors.messages import AdoptJournal, Recover
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_records import DeliveryState, JournalFolded
from hermes_actors.store.relay_inbox import InboxPaths, is_consumed

__all__ = ["JournalTakeover", "relayed_fates", "relayed_outcomes"]


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


def relayed_fates(keys: Iterable[str], *, recorded: Set[str], consumed: Set[str],
                  resumed: Set[str] = frozenset()) -> tuple[frozenset[str], frozenset[str]]:
    """Pure: which of these relayed DMs (:func:`relayed_outcomes`) are left to the relay, and which it reported.

    - its ``sent/`` record is there: ``waiting``, not published here (whoever holds the record reports it and wakes
      its sender; a second outcome here otherwise), not marked delivered either (its taker, which reads the root's
      journals before it reports, would take it for reported and wake nobody); unless our own relay resumed it
      at this start (``resumed``): then the start publishes it as before (or finds it reported already);
    - its record is gone and its ``consumed/`` mark is there: ``reported`` (a relay reported it and forgot it):
      marked delivered here, not published;
    - neither: no relay holds it, so it is in neither set: published here, once.

    Args:
        keys: the relayed DMs' ids.
        recorded: those whose ``sent/`` record is there (looked at first: a relay that reports a DM marks it
            consumed before it clears the record).
        consumed: those whose ``consumed/`` mark is there.
        resumed: the envelopes our relay waits for again after this start (empty at a running adoption).

    Returns:
        ``(waiting, reported)``.
    """
    keys = list(keys)
    waiting = frozenset(key for key in keys if key in recorded and key not in resumed)
    reported = frozenset(key for key in keys if key not in recorded and key in consumed)
    return waiting, reported


def _relay_marks(paths: InboxPaths, keys: Iterable[str]) -> tuple[set[str], set[str]]:
    """The ids whose ``sent/`` record is there, then the others whose ``consumed/`` mark is (in that order)."""
    recorded = {key for key in keys if paths.relay.id_file(paths.sent, key).exists()}
    consumed = {key for key in keys if key not in recorded and is_consumed(paths, key)}
    return recorded, consumed


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
        # relayed DMs an adopted journal left undelivered in ours while a relay holds their sent/ record: id → its
        # journal state, until the record goes (follow). Filled by the relay's thread and, once, by the start's.
        self._waiting: dict[str, DeliveryState] = {}
        self._lock = threading.Lock()

    def adopt(self) -> JournalFolded | None:
        """Adopt what is to adopt and tell the Dispatcher its settled outcomes and wakes (before the relay's takeover).

        Returns:
            The adopted state, for :meth:`recover` once the relay took over; None when nothing was adopted.
        """
        adopted = self.journal.adopt_dead()
        if adopted is not None:
            # never raises: a Dispatcher gone (our stop) leaves the adopted records in our journal for the next start
            tell(self.dispatcher, AdoptJournal(adopted.states, self.idempotent_runner))
        return adopted

    def recover(self, adopted: JournalFolded, paths: InboxPaths) -> None:
        """After the relay's takeover: tell the Dispatcher to act on the adopted journal.

        Args:
            adopted: what :meth:`adopt` returned.
            paths: the relay layout (whose ``sent/`` and ``consumed/`` say which relayed DMs the relay holds).
        """
        waiting, reported = self.sort(adopted.states, paths)
        tell(self.dispatcher, Recover(adopted.states, self.idempotent_runner, adopted_from=tuple(adopted.files),
                                     relayed=waiting | reported, relay_reported=reported))
        self.watch(adopted.states, waiting)

    def sort(self, states: dict[str, DeliveryState], paths: InboxPaths, *, resumed: Set[str] = frozenset()
             ) -> tuple[frozenset[str], frozenset[str]]:
        """The relayed DMs of an adopted journal left to the relay, and those it reported (:func:`relayed_fates`).

        Args:
            states: the adopted journal's delivery states.
            paths: the relay layout.
            resumed: at a start, the envelopes our relay waits for again (its own report settles them).

        Returns:
            ``(waiting, reported)``, for ``Recover``'s ``relayed`` (both) and ``relay_reported``.
        """
        keys = relayed_outcomes(states)
        try:
            recorded, consumed = _relay_marks(paths, keys)
        except OSError as exc:  # EACCES on sent/, say: none is published nor marked; each rescan looks again
            logger.warning("relay: could not look at the sent/ records of {} relayed DM(s) an adopted journal holds "
                           "({}): they wait, and each rescan looks at them again", len(keys), exc)
            recorded, consumed = set(keys), set()
        return relayed_fates(keys, recorded=recorded, consumed=consumed, resumed=resumed)

    def watch(self, states: dict[str, DeliveryState], waiting: Iterable[str]) -> None:
        """Look at these relayed DMs left to the relay again at each rescan (:meth:`follow`), once told ``Recover``.

        Args:
            states: the adopted journal's delivery states.
            waiting: the ids :meth:`sort` found waiting.
        """
        with self._lock:
            self._waiting.update((key, states[key]) for key in waiting)

    def follow(self, paths: InboxPaths) -> None:
        """At a rescan: settle in our journal the relayed DMs left to the relay whose ``sent/`` record went since.

        Their taker reported them and forgot them (its ``consumed/`` mark): a ``Recover`` of them marks them
        delivered here, never published; one whose record went without that mark (quarantined, removed by
        hand) is held by no relay any more: published here, once, as an adoption does. One whose record is still
        there stays watched.

        Args:
            paths: the relay layout.
        """
        with self._lock:
            states = dict(self._waiting)
        if not states:
            return
        recorded, consumed = _relay_marks(paths, states)
        waiting, reported = relayed_fates(states, recorded=recorded, consumed=consumed)
        settled = {key: state for key, state in states.items() if key not in waiting}
        if not settled:
            return
        if not tell(self.dispatcher, Recover(settled, self.idempotent_runner, relayed=reported,
                                             relay_reported=reported)):
            return  # our stop: they stay undelivered in our journal, and the next start sorts them again
        with self._lock:
            for key in settled:
                self._waiting.pop(key, None)
