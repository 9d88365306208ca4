"""The Dispatcher's outcome flow: how an outcome it settles is kept, then made visible.

:class:`OutcomeFlow` is owned by the DispatcherActor and used on its thread only. It
is the one path every outcome takes there: the first one for a delivery wins; a
journaled DM's outcome is journaled ``finished`` before it is published (published
once the commit lands, :meth:`OutcomeFlow.commit_landed`; held and written again while
the journal cannot be written, never published before it is on disk); a room member turn's outcome goes
back to its room, a relayed-in one back through the relay; everything else is
published: ``wait_outcome`` answered, the DM's log line written, and a note gathered
for the Notifier (told once per burst, :meth:`OutcomeFlow.take_notes`). A stop
settles what is still pending with :meth:`OutcomeFlow.finalize`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.faults import crashpoint
from hermes_actors.local.delivery_stats import DeliveryStats, log_settled
from hermes_actors.local.durability import KEPT_KINDS, Durability, OutcomeToken, outcome_records
from hermes_actors.local.outcome_book import Answers, OutcomeBook, answer
from hermes_actors.local.queue_gauge import QueueGauge
from hermes_actors.local.relay_in import kept_across_restarts
from hermes_actors.local.relay_link import RelayLink
from hermes_actors.local.wake_hook import SenderWaker
from hermes_actors.messages import Delivery, JournalDurable, Outcome

__all__ = ["NOTIFY_BATCH", "Note", "OutcomeFlow", "answer_room"]

NOTIFY_BATCH = 64  # outcomes per Notifier message at most: subscribers see them without waiting for a quiet moment

Note = tuple[dict[str, Any], Delivery | None, float]  # (outcome dict, its delivery, publish time): NotifyOutcomes


def answer_room(reply: Callable[[Outcome], None] | None, outcome: Outcome) -> None:
    """Hand a member turn's outcome back to its room (our own tell: it must never crash the Dispatcher)."""
    try:
        if reply is not None:
            reply(outcome)
    except Exception:
        logger.exception("could not hand the outcome of room turn {} back", outcome.delivery_id)


class OutcomeFlow:
    """Settles and publishes the Dispatcher's outcomes.

    Args:
        book: the Dispatcher's OutcomeBook (pending, journaling, settled; their waiters).
        durability: the durability strategy (a journal, or none).
        relay: the link to the relay (relayed-in answers, relay records to forget).
        waker: the sender waker (wake turns from published outcomes).
        stats: the per-DM log line and the ``deliveries`` view.
        counters: the Dispatcher's counters (``settled`` is counted here).
        stopping: whether the gateway has stopped accepting (a relayed-in DM is then put back).
        gauge: the places the profiles' queues have left: a settled DM frees its place (None: not kept).
    """

    def __init__(
        self,
        *,
        book: OutcomeBook,
        durability: Durability,
        relay: RelayLink,
        waker: SenderWaker,
        stats: DeliveryStats,
        counters: dict[str, int],
        stopping: Callable[[], bool],
        gauge: QueueGauge | None = None,
    ) -> None:
        self.book = book
        self.durability = durability
        self.relay = relay
        self.waker = waker
        self.stats = stats
        self.counters = counters
        self.stopping = stopping
        self.gauge = gauge
        self.notes: list[Note] = []  # published, not yet told to the Notifier
        self.finalized = False  # a stop settled what was pending: a failed outcome record gets one last write

    def settle(self, outcome: Outcome, *, freed: bool = False) -> None:
        """Keep ``outcome`` (journaled first when its DM is) and publish it; a second one is dropped.

        Args:
            outcome: the outcome.
            freed: whoever settled it freed its place in its profile's queue already (a ProfileActor
                does, on its own thread, before it tells the outcome): no second lock round here.
        """
        key = outcome.delivery_id
        if not freed:
            self._free_place(key)
        # Left pending until it is journaling or published: should anything below fail, the DM is
        # still held, and the failed Dispatcher settles it (on_crash) instead of losing it.
        entry = self.book.entry(key)
        if entry is None and self.book.has_outcome(key):  # (a pending one has none: one lookup, as a rule)
            logger.debug("second outcome for {} dropped (first one wins)", key)
            return
        if entry is not None and entry.route == "room":  # never journaled here: the room file records it
            self.publish(outcome)
            return
        self.waker.settling(key, entry)
        if entry is not None and entry.route == "relay-in":
            # The sender is on another connection: the reply goes back through the relay.
            log_settled(entry.delivery, outcome)
            self.relay.answer_relay_in(outcome, entry.reply_connection, stopping=self.stopping())
            self._keep_relayed_in(outcome)
            self.book.settle(key, outcome.as_dict())  # a stopping gateway waits for its running turns
            return
        if entry is not None and entry.journaled and self.durability.journal_outcome(outcome):
            # published once durable (JournalDurable); the delivery is kept for the subscribers' details
            self.book.journaling(key, outcome.as_dict(), entry.delivery)
            self._write_late_held()
            return
        if entry is not None and entry.route == "relay" and self.durability.journal_outcome(outcome, "forget"):
            # Nothing on the root keeps the outcome of a DM sent to another machine over Redis (the file relay's
            # replies/ are swept after 6 h): the journal keeps it, as a local DM's, so `hermes-actors outcome` and
            # wait_outcome still know it after this host restarted. Published, as a local DM's, once its record
            # is on disk: published before, a stop with the record unwritten left the relay's record, and the
            # next start published the reply a second time. The relay keeps its record until the outcome and
            # the wake it starts are on disk (ForgetSent, see _written).
            self.book.journaling(key, outcome.as_dict(), entry.delivery)
            self._write_late_held()
            return
        if entry is not None and entry.route == "peer":
            # Journaled for wait_outcome after a restart, but published now: held back, a stop with its record
            # unwritten would leave only its accepted record, which the next start settles ambiguous, for a DM
            # whose answer came (its transport is not asked again). Its finished and delivered
            # records go in one batch (kept); the wake its outcome starts journals its own record alone.
            self.publish(outcome)
            self.durability.finished(outcome)
            return
        self.publish(outcome)
        if entry is not None and entry.route == "relay":  # no journal: the outcome is kept here now
            self.relay.forget(key)

    def _keep_relayed_in(self, outcome: Outcome) -> None:
        """Journal a relayed-in DM's outcome with its ``delivered`` record (durable mode; :func:`kept_across_restarts`).

        Its turn journaled its ``accepted`` and ``started`` records before it ran (``turn_launch.RelayedInStart``):
        the next start remembers the outcome, and a retry of the envelope then (the Desktop's ``relay_deliver``
        cut by our restart, a reclaim) is answered with it (``relay_in_step``), never run again. Written as a peer
        DM's is, both records in one batch, while the relay answers at once: killed before they land, the next
        start settles the DM ``ambiguous`` from its ``started`` record. A ``cancelled`` one never ran and is not
        kept: its transport offers it again.
        """
        if kept_across_restarts(outcome):
            self.durability.finished(outcome, relayed_in=True)

    def _free_place(self, key: str) -> None:
        """The DM's turn is over (or never ran): its place in its profile's queue is free for the next one.

        Here for the outcomes no ProfileActor gave (its own frees the place on its thread first, and
        :meth:`settle` is told so); what is published without :meth:`settle` needs none: outcomes of a
        previous run, and a stop's (no DM is admitted once a stop began).
        """
        if self.gauge is not None:
            self.gauge.release(key)

    def settle_relayed(self, outcome: Outcome) -> None:
        """Our envelope settled: the relay clears its record once the outcome is kept (see :meth:`settle`)."""
        key = outcome.delivery_id
        entry = self.book.entry(key)
        self.settle(outcome)
        if entry is None or entry.route != "relay":
            # Settled before (in this run, or in a previous one whose journal has it) or booked by nobody:
            # nothing more to keep, so nothing for the relay to resume at the next start.
            self.relay.forget(key)

    def publish(self, outcome: Outcome, answers: Answers | None = None) -> None:
        """Make an outcome visible: wait_outcome answers, then the room or the DM subscribers get it.

        Args:
            outcome: the outcome.
            answers: where the ``wait_outcome`` answers go for the caller to give later (None: now).
        """
        key = outcome.delivery_id
        record = outcome.as_dict()
        delivery = self.book.delivery(key) or self.waker.sources.get(key)  # before the book and waker drop it
        entry = self.book.settle(key, record, answers)
        if entry is not None and entry.route == "room":  # a member turn's outcome goes back to its room
            answer_room(entry.room_reply, outcome)
            return
        if self.waker.after_publish(outcome, entry):  # a wake turn's own outcome is nobody's DM outcome
            return
        self.counters["settled"] += 1
        self.stats.published(delivery, outcome)
        self.notes.append((record, delivery, time.time()))

    def take_notes(self, *, drained: bool) -> tuple[Note, ...] | None:
        """The gathered notes for one ``NotifyOutcomes``, once the mailbox is drained or a batch is full.

        Args:
            drained: nothing is behind the message just handled (or it was an ask).

        Returns:
            The notes, in publish order, now cleared here (None: keep gathering).
        """
        if self.notes and (drained or len(self.notes) >= NOTIFY_BATCH):
            notes, self.notes = tuple(self.notes), []
            return notes
        return None

    def commit_landed(self, msg: JournalDurable) -> None:
        """One group commit landed: release its acks, publish its outcomes.

        The ``wait_outcome`` callers are answered last: by then the ``delivered`` records
        are appended (and, when no commit runs, written by this thread), so a caller that
        goes on to send finds the journal's write turn free instead of racing this thread
        for it.
        """
        answers: Answers = []
        try:
            self.land(msg, answers)
        finally:  # whatever happened, the outcomes settled so far are answered
            answer(answers)

    def land(self, msg: JournalDurable, answers: Answers) -> None:
        """Release the acks of one commit and publish its outcomes, their waiters' answers into ``answers``.

        An outcome is published only once its ``finished`` record is on disk: else a restart would
        re-offer its DM, or settle it ``ambiguous``, a second outcome. One whose commit failed (a
        full disk) is held, unpublished, and written again later (``Durability.hold``); after a
        stop's :meth:`finalize` it gets one last write instead (:meth:`_last_write`).
        """
        failed: list[OutcomeToken] = []  # after finalize: written once more, now
        for kind, value in msg.tokens:
            if kind == "accepted":  # an ack to release, or a wake to run (or to hold: see journal_wake)
                self.durability.accepted_landed(value, msg.error)
            elif msg.error is None:
                self._written(kind, value, answers)
            elif not self.finalized:
                self.durability.hold(kind, value, msg.error)
            else:
                failed.append((kind, value))
        self._last_write(failed, answers)
        if msg.error is None:
            self.durability.commit_landed()

    def _written(self, kind: str, outcome: Outcome, answers: Answers) -> None:
        """The records of an outcome token (see ``durability.OutcomeToken``) are on disk: act on it.

        A relayed DM's (``forget``) relay record goes once the wake its outcome starts is on disk
        too (``Durability.delivered``'s ``then``): the journal has no ``accepted`` record of a relayed
        DM, so the relay's record is what lets a next start wake its sender.
        """
        self.durability.written(outcome)
        if kind in KEPT_KINDS:  # a peer DM's (published) or a relayed-in DM's (answered) already
            return
        key = outcome.delivery_id
        self.publish(outcome, answers)
        crashpoint("after-outcome-before-delivered")
        self.durability.delivered(key, then=(lambda: self.relay.forget(key)) if kind == "forget" else None)

    def _last_write(self, held: list[OutcomeToken], answers: Answers) -> list[str]:
        """A stop's last write of held outcomes' records: those that land are published.

        What does not land stays unpublished, its DM no longer in the book (a stopped gateway
        answers it from the journal: pending), named at ERROR; the next start settles it as its
        journal says: re-offered if its turn never started, else ``ambiguous``. One outcome,
        never two (a relayed DM's from its relay record, which stays). A peer DM's outcome was published
        already.
        Unless the journal is lost (``keeping`` False: no start will find it): then the outcome is
        published all the same, as without a journal (withheld, its DM would get none), named at ERROR
        (:meth:`_withhold`, the rule :meth:`finalize` follows too).

        Returns:
            The ids whose records could not be written.
        """
        if not held:
            return []
        if self.durability.write_last(held):
            for kind, outcome in held:
                self._written(kind, outcome, answers)
            return []
        unkept: list[str] = []  # published all the same: no start will find the journal
        lost: list[str] = []  # withheld: the next start settles them
        for kind, outcome in held:
            key = outcome.delivery_id
            if kind == "kept":  # a peer DM's: published already; only a restarted wait_outcome misses it
                logger.error("stop: the outcome record of peer DM {} could not be written to the delivery journal; "
                             "it was published, but wait_outcome after a restart will not know it", key)
                continue
            if kind == "relayed-in":  # answered through the relay already
                logger.error("stop: the outcome record of relayed-in DM {} could not be written to the delivery "
                             "journal; it was answered through its relay, but a retry of its envelope after a "
                             "restart is not answered with it (ambiguous if its turn had started, else it runs)",
                             key)
                continue
            if not self._withhold(key, relay_keeps=kind == "forget", lost=lost, unkept=unkept):
                self.publish(outcome, answers)
        self._report_stop(lost, unkept)
        return lost

    def _withhold(self, key: str, *, relay_keeps: bool, lost: list[str], unkept: list[str]) -> bool:
        """A stop could not write the outcome record of ``key``: withhold the outcome, unless no start would settle it.

        The one rule for both of a stop's writes (:meth:`_last_write`, :meth:`finalize`). Withheld, the DM
        leaves the book unpublished and the next start settles it once, from its journal (or a relayed DM's
        from the relay's record, which stays). Unless the journal is lost (``keeping`` False: no start will
        find it) and no relay record keeps the DM: withheld, it would get no outcome at all, so the caller
        publishes it all the same, as without a journal.

        Args:
            key: the DM's id.
            relay_keeps: the relay keeps a record of the DM that a next start settles it from (a relayed DM's).
            lost: the withheld ids (``key`` is added when withheld), for :meth:`_report_stop`.
            unkept: the ids to publish without their records (``key`` is added when not withheld), likewise.

        Returns:
            True when withheld; False when the caller is to publish the outcome, the DM's only one.
        """
        if not (self.durability.keeping or relay_keeps):
            unkept.append(key)
            return False
        self.book.withhold(key)
        self.waker.sources.pop(key, None)
        lost.append(key)
        return True

    def _report_stop(self, lost: list[str], unkept: list[str]) -> None:
        """Name at ERROR the outcomes a stop could not write: withheld (``lost``), published without a record
        (``unkept``)."""
        if lost:
            self._report_unwritten(lost)
        if unkept:
            self._report_unkept(unkept)

    def _report_unwritten(self, ids: list[str]) -> None:
        """Say, id by id, which outcomes a stop could not write to the journal (ERROR)."""
        logger.error("stop: the outcome record(s) of {} DM(s) could not be written to the delivery journal (a full "
                     "disk, or a journal that refuses records) and are NOT published: {}. The next start settles "
                     "them as the journal says: re-offered if the turn never started, else ambiguous (a relayed "
                     "DM's from the relay's record)", len(ids), ", ".join(ids))

    def _report_unkept(self, ids: list[str]) -> None:
        """Say, id by id, which outcomes a stop published without their records: the journal is lost (ERROR)."""
        logger.error("stop: the delivery journal is lost (no fresh file could be made) and the outcome record(s) of "
                     "{} DM(s) could not be written to it either: they are published without their records, as "
                     "without a journal: {}. No start finds them: these are their only outcomes (should the lost "
                     "file come back into bot_relay/journal/, a start would settle them again). Restore "
                     "bot_relay/journal/ as a directory of ours and free space on its filesystem",
                     len(ids), ", ".join(ids))

    def _write_late_held(self) -> None:
        """After a stop's :meth:`finalize`, what was held since (a record the journal refused) gets its last write
        now: no retry timer runs any more, and it must not wait, unpublished and unnamed, forever."""
        if self.finalized:
            answers: Answers = []
            self._last_write(self.durability.take_held(), answers)
            answer(answers)

    def retry_held(self) -> None:
        """The retry timer fired: write the held outcome records again (after :meth:`finalize`: it had them)."""
        if not self.finalized:
            self.durability.write_held()

    def finalize(self, running: Mapping[str, str]) -> int:
        """Settle what is still pending at a stop: ambiguous if it may have run, else cancelled.

        Args:
            running: the ids of the turns still running (they may have reached their target), each with the
                text of its ambiguous outcome; every other one never started (e.g. queued on a ProfileActor
                stuck in a turn, that could not cancel it itself).

        Returns:
            How many were settled (the relay's own sends and never-started journaled DMs stay).
        """
        self.finalized = True
        answers: Answers = []
        self._last_write(self.durability.take_held(), answers)
        answer(answers)
        lost: list[str] = []  # the ambiguous outcomes below that could not be written
        unkept: list[str] = []  # … to a journal no start finds (``keeps_at_stop``): published all the same
        count = 0
        for key, entry in self.book.pending():
            if entry.route == "relay":
                continue  # our envelopes stay in outbox/: the next start resumes waiting for replies
            if key not in running:
                # Else it stays journaled and is re-offered by the next start (unless the journal's file was
                # lost: ``keeps_at_stop``).
                if not (entry.journaled and self.durability.keeping):
                    self.settle(outcomes.cancelled(key, entry.delivery.label))  # a relayed-in one goes back
                    count += 1
                continue
            outcome = outcomes.ambiguous(key, entry.delivery.label, running[key])
            # A peer DM's outcome is journaled as it arrives (see settle): one still under way is, too; and so is a
            # relayed-in DM's (_keep_relayed_in), for a retry of its envelope after the restart.
            remember = entry.journaled or entry.route in ("peer", "relay-in")
            # shutting down: write it now rather than through the async group commit
            # Not on disk: the next start settles it from its journal (ambiguous), so it is not published now,
            # unless no start finds its journal (then published below, its one outcome). A peer DM's is published:
            # no journal record of it would ever tell its sender anything.
            finished = outcome_records("relayed-in" if entry.route == "relay-in" else "finished", outcome)[0]
            if remember and not self.durability.write_now(finished) \
                    and entry.journaled and self._withhold(key, relay_keeps=False, lost=lost, unkept=unkept):
                continue
            if entry.route == "relay-in":  # its sender waits on another connection: tell it too
                self.relay.answer_relay_in(outcome, entry.reply_connection)
            self.publish(outcome)
            if remember:  # published now: the next start must not report it a second time
                self.durability.delivered(key)
            count += 1
        self._report_stop(lost, unkept)
        return count
