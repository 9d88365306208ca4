"""The Dispatcher's durability strategy: a journal, or none, behind one interface.

With a journal (durable mode) an acceptance is journaled with group commit and
its ack is released only once that batch is on disk (``PendingAck``); an
outcome is journaled before it is published, and one whose record failed (a full
disk) is held, unpublished, and written again until it lands
(:meth:`JournalDurability.hold`), as is a sender's wake, run once its batch is on disk
(:meth:`JournalDurability.journal_wake`), and a profile whose turn's ``started`` record failed
starts no turn until then (:meth:`JournalDurability.hold_turns`). Without one, all happen at once.
The DispatcherActor holds one strategy and never asks which one it is.
Everything here runs on the Dispatcher's thread, except the journal's
listener, which only tells the Dispatcher ``JournalDurable``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

from actors import tell
from hermes_actors.core.acks import accepted_record, journal_refusal
from hermes_actors.core.backoff import doubling
from hermes_actors.core.names import profile_key
from hermes_actors.errors import StoreError, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.local.live_handoff import LiveMailbox, give_up_on
from hermes_actors.messages import RELAY_ORIGIN, Delivery, JournalDurable, Outcome, PendingAck, ProfileInfo
from hermes_actors.store.journal import Journal

__all__ = ["KEPT_KINDS", "Durability", "JournalDurability", "NoDurability", "OutcomeToken", "WakeBatch",
           "durability_for", "live_gave_up", "live_record", "outcome_records"]

#: An outcome record's token in ``JournalDurable``: ("finished", its outcome) for a DM journaled here and
#: ("forget", …) for a DM sent through the relay (both published once their ``finished`` record landed;
#: ``forget``: then the relay's record goes), ("kept", …) for a peer's (published already: its ``finished``
#: and ``delivered`` records go together) and ("relayed-in", …) for a relayed-in DM's (answered through the
#: relay already: likewise, its ``finished`` record naming its origin, ``relay``).
OutcomeToken = tuple[str, Outcome]
#: The token kinds whose outcome went out already: their ``finished`` and ``delivered`` records go in one batch.
KEPT_KINDS = frozenset({"kept", "relayed-in"})
RETRY_FIRST = 0.25  # seconds before held-back outcome records are written again (doubled each time, see RETRY_MOST)
RETRY_MOST = 8.0  # the longest wait between two writes of held-back outcome records
LAST_WRITE_SECONDS = 5.0  # a stop's last write of a held-back outcome record waits this long at most


@dataclass
class WakeBatch:
    """One wake's journal batch (:meth:`JournalDurability.journal_wake`) and what follows once it is on disk.

    Attributes:
        wake_id: the wake's delivery id (its batch's token: ``("accepted", wake_id)``).
        records: the wake's ``accepted`` record, then (unless written apart) its DM's ``delivered`` record.
        go: runs the wake (once the batch landed).
        given_up: called with the last error when the batch is given up (a stop found it unwritten).
        then: called after ``go`` once the batch landed, never when it is given up (a relayed DM's: the relay
            forgets its record, see :meth:`JournalDurability.delivered`).
        error: why its last write failed (None: it has not failed).
    """

    wake_id: str
    records: list[dict[str, Any]]
    go: Callable[[], None]
    given_up: Callable[[BaseException], None]
    then: list[Callable[[], None]] = field(default_factory=list)
    error: BaseException | None = None


def outcome_records(kind: str, outcome: Outcome) -> list[dict[str, Any]]:
    """Pure: the journal records of one outcome token (see :data:`OutcomeToken`): its ``finished`` record, and
    ``delivered`` too for an outcome that went out already (:data:`KEPT_KINDS`). A relayed-in DM's ``finished``
    record names its origin: ``journal_records.delivery_origin`` reads it back whether or not its turn journaled
    an ``accepted`` record (one that never started did not), so ``status`` never counts it as this root's DM."""
    key = outcome.delivery_id
    finished: dict[str, Any] = {"t": "finished", "id": key, "o": outcome.as_dict()}
    if kind == "relayed-in":
        finished["origin"] = RELAY_ORIGIN
    return [finished, {"t": "delivered", "id": key}] if kind in KEPT_KINDS else [finished]


class NoDurability:
    """No journal: acceptance and outcomes take effect at once; a stop loses what is queued."""

    enabled = False
    keeping = False  # a stop cancels what is queued: nothing is kept for the next start

    def keeps_at_stop(self) -> bool:
        """False: a stop settles every queued DM (``cancelled``)."""
        return False

    def accept(
        self, delivery: Delivery, ack: dict[str, Any], proceed: Callable[[], None],
        refused: Callable[[], None] | None = None, *, queued: bool = False,
    ) -> dict[str, Any]:
        """Accept ``delivery`` now: ``proceed()`` queues it; answers ``ack`` (``refused`` and ``queued`` unused)."""
        proceed()
        return ack

    def accepted_landed(self, delivery_id: str, error: BaseException | None) -> None:
        """Nothing is ever journaled, so nothing lands."""

    def settle_parked(self, held: Iterable[JournalDurable], timeout: float) -> int:
        """No ack ever waits for a commit here."""
        return 0

    def journal_outcome(self, outcome: Outcome, kind: str = "finished") -> bool:
        """False: publish the outcome now."""
        return False

    def journal_wake(self, wake: Delivery, source_id: str, *, with_delivered: bool = True, go: Callable[[], None],
                     given_up: Callable[[BaseException], None]) -> bool:
        """False: the wake is not journaled; the caller runs it now (a stop loses it)."""
        return False

    def note(self, record: dict[str, Any]) -> None:
        """Nothing to note."""

    def delivered(self, delivery_id: str, then: Callable[[], None] | None = None) -> None:
        """Nothing to note: ``then`` (if any) is called at once."""
        if then is not None:
            then()

    def finished(self, outcome: Outcome, *, relayed_in: bool = False) -> None:
        """Nothing to journal."""

    def write_now(self, record: dict[str, Any]) -> bool:
        """Nothing to write: True."""
        return True

    def hold(self, kind: str, outcome: Outcome, error: BaseException) -> None:
        """Never called: nothing is journaled, so no record fails."""

    def hold_turns(self, profile: str, error: BaseException) -> None:
        """Never called: no turn's start is journaled."""

    def written(self, outcome: Outcome) -> None:
        """Never called: nothing is journaled."""

    def commit_landed(self) -> None:
        """Never called: nothing is journaled."""

    def write_held(self) -> None:
        """Nothing is ever held."""

    def take_held(self) -> list[OutcomeToken]:
        """Nothing is ever held: []."""
        return []

    def write_last(self, held: list[OutcomeToken]) -> bool:
        """Nothing to write: True."""
        return True


class JournalDurability:
    """Durable mode: the journal records each delivery's lifecycle.

    Args:
        journal: the started journal.
        dispatcher: told ``JournalDurable`` once per group commit.
    """

    enabled = True

    def __init__(self, journal: Journal, dispatcher: pykka.ActorRef[Any],
                 retry_after: Callable[[float], Any] | None = None,
                 resume_turns: Callable[[Iterable[str]], None] | None = None) -> None:
        self.journal = journal
        self.dispatcher = dispatcher
        # Arms the Dispatcher's timer that tells it RetryJournal after so many seconds (its handle has ``cancel``).
        self.retry_after = retry_after
        # Tells the ProfileActors of these profiles ResumeTurns: their held turns start again (hold_turns)
        self.resume_turns = resume_turns
        # Profiles whose turn's started record failed: they start no turn until write_held resumes them
        self._held_turns: set[str] = set()
        # Outcome records a commit failed to write (a full disk), by id: their outcomes wait, unpublished, until
        # they are written again (write_held). Only while some wait is a retry timer armed: no polling otherwise.
        self._held: dict[str, OutcomeToken] = {}
        self._again: set[str] = set()  # held ones (outcome ids, wake ids) written again, not landed yet
        self._retry: Any = None  # the armed retry timer's handle
        self._backoff = doubling(RETRY_FIRST, RETRY_MOST)  # the retry timer's waits, restarted after each spell
        self._failing = False  # a record (an outcome's, a wake's) failed and the held ones have not all landed since
        self.keeping = True  # queued journaled DMs stay journaled at stop (``keeps_at_stop`` decides)
        journal.listener = self._landed  # one message per group commit, not one per record
        # id → (proceed, the ack's future, the ack, refused): the acks waiting for their commit
        self._parked: dict[str, tuple[Callable[[], None], pykka.ThreadingFuture[Any], dict[str, Any],
                                      Callable[[], None] | None]] = {}
        # wake id → its batch, while its commit runs (it runs once on disk, see journal_wake)
        self._wakes: dict[str, WakeBatch] = {}
        # wake id → its batch, whose commit failed (or was refused): written again with the held outcome records
        self._held_wakes: dict[str, WakeBatch] = {}
        # DM id → the batch of the wake its outcome started, which carries its ``delivered`` record: from
        # journal_wake to the ``delivered`` call that follows it on the same message (it writes none of its own)
        self._with_wake: dict[str, WakeBatch] = {}
        self._final = False  # a stop took the held records (take_held): a wake batch that fails now is given up
        # ids of parked acceptances whose DM is queued already (a Redis envelope): acked even if their record fails
        self._queued: set[str] = set()
        # Commits the Dispatcher could no longer be told of (it failed): settle_parked reads them.
        self._orphaned: list[tuple[tuple[Any, ...], BaseException | None]] = []
        self._orphaned_lock = threading.Lock()

    def _landed(self, tokens: list[Any], error: BaseException | None) -> None:
        """The journal's listener (its writer thread): tell the Dispatcher, or keep it when it is gone."""
        if not tell(self.dispatcher, JournalDurable(tuple(tokens), error)):
            with self._orphaned_lock:
                self._orphaned.append((tuple(tokens), error))

    def keeps_at_stop(self) -> bool:
        """Whether a stopping gateway may leave its queued journaled DMs for the next start (asked once, at stop).

        Not when the journal's file is unreachable and no fresh one could be made
        (:meth:`Journal.keeps`): the DMs are then settled ``cancelled`` (never ran), as
        without a journal, rather than left in a file no start finds. The answer stays
        (``keeping``) for the rest of the stop.
        """
        self.keeping = self.journal.keeps()
        return self.keeping

    def accept(
        self, delivery: Delivery, ack: dict[str, Any], proceed: Callable[[], None],
        refused: Callable[[], None] | None = None, *, queued: bool = False,
    ) -> PendingAck | dict[str, Any]:
        """Journal the acceptance; ``proceed()`` and the ack follow once its group commit is on disk.

        Args:
            delivery: the accepted delivery.
            ack: the sender's ack, released once the acceptance is durable.
            proceed: queues the delivery (called once it is durable).
            refused: called when the journal refused the record instead (nothing acked, nothing queued).
            queued: the DM is queued already, where this root cannot take it back (a Redis envelope): a record
                the journal refuses is logged and the DM acked all the same (it then relies on Redis's own
                persistence), never refused "NOT queued".

        Returns:
            A :class:`PendingAck` (already answered with a refusal when the journal refused
            the record), or ``ack`` itself for a ``queued`` DM whose record the journal refused.
        """
        key = delivery.delivery_id
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        try:
            self.journal.append(accepted_record(delivery), token=("accepted", key))
        except StoreError as exc:
            if queued:
                _unjournaled_send(key, exc)
                proceed()
                return ack
            if refused is not None:
                refused()
            future.set(journal_refusal(exc))
            return PendingAck(future)
        self._parked[key] = (proceed, future, ack, refused)
        if queued:
            self._queued.add(key)
        return PendingAck(future)

    def accepted_landed(self, delivery_id: str, error: BaseException | None) -> None:
        """The acceptance of ``delivery_id`` is on disk (or failed): queue it and release its ack.

        A wake's batch that landed runs the wake (then its ``then`` callbacks); one that failed is
        held and written again (:meth:`_hold_wake`), as an outcome record is.
        """
        batch = self._wakes.pop(delivery_id, None)
        if batch is None:
            self._release(delivery_id, error, queue=True)
            return
        if error is not None:
            self._hold_wake(batch, error)
            return
        self._again.discard(delivery_id)
        batch.go()
        for then in batch.then:
            then()

    def _release(self, delivery_id: str, error: BaseException | None, *, queue: bool) -> None:
        """Answer the parked ack of ``delivery_id``: refused when its commit failed, else acked.

        ``queue``: queue the delivery first (False once the Dispatcher failed: the next start
        re-offers it from the journal).
        """
        parked = self._parked.pop(delivery_id, None)
        if parked is None:
            return
        proceed, future, ack, refused = parked
        if delivery_id in self._queued:  # queued already (Redis): acked whether or not its record landed
            self._queued.discard(delivery_id)
            if error is not None:
                _unjournaled_send(delivery_id, error)
            if queue:
                proceed()
            future.set(ack)
            return
        if error is not None:
            if refused is not None:
                refused()
            future.set(journal_refusal(error))  # nothing acked, nothing queued
            return
        crashpoint("after-journal-before-ack")
        if queue:
            proceed()
        future.set(ack)

    def settle_parked(self, held: Iterable[JournalDurable], timeout: float) -> int:
        """The Dispatcher failed: answer every sender whose ack waits for its commit; how many were answered.

        An acceptance on disk is acked (the next start on the root re-offers it, so the ack is
        true); one the journal refused, or did not confirm within ``timeout``, is refused.

        Args:
            held: the commit reports left in the failed Dispatcher's mailbox.
            timeout: seconds to wait for the commits still running.
        """
        if not self._parked:
            return 0
        count = len(self._parked)
        landed = [(report.tokens, report.error) for report in held]
        self.journal.drain(timeout)
        with self._orphaned_lock:
            landed += self._orphaned
            self._orphaned = []
        for tokens, error in landed:
            for kind, value in tokens:
                if kind == "accepted":
                    self._release(value, error, queue=False)
        unconfirmed = StoreError(0, "the journal did not confirm it before the gateway's dispatcher failed")
        for key, (_proceed, future, ack, _refused) in self._parked.items():
            future.set(ack if key in self._queued else journal_refusal(unconfirmed))  # a Redis DM is in Redis
        self._parked.clear()
        self._queued.clear()
        return count

    def journal_outcome(self, outcome: Outcome, kind: str = "finished") -> bool:
        """Journal ``outcome`` (group commit); True: it is published once its record landed (``JournalDurable``).

        ``kind``: ``finished`` (a DM journaled here) or ``forget`` (a DM sent through the relay,
        see :data:`OutcomeToken`).

        A journal that refuses the record outright (stopped, closed: not a failed write) gets
        the same rule as a failed commit: the outcome is held back, unpublished, and written
        again (:meth:`hold`); should the journal never take it, a stop names it at ERROR and
        the next start settles the DM as its journal says. Published now instead, the next
        start would give it a second outcome.
        """
        try:
            self._append_outcome(kind, outcome)
        except StoreError as exc:
            logger.error("the delivery journal {} refused the outcome record of {} ({}): the outcome is held back, "
                         "unpublished, and written again; should the journal never take it, the stop names it and "
                         "the next start settles the DM as the journal says (re-offered if its turn never started, "
                         "else ambiguous)", self.journal.path, outcome.delivery_id, exc)
            self._keep(kind, outcome)
        return True

    def _append_outcome(self, kind: str, outcome: Outcome) -> None:
        """Queue the records of one outcome token (see :data:`OutcomeToken`): ``finished``, and
        ``delivered`` in the same batch for a DM whose outcome went out already (:data:`KEPT_KINDS`).

        Raises:
            StoreError: the journal refused them (it is not running).
        """
        if kind in KEPT_KINDS:  # both or neither: a ``delivered`` without its ``finished``: an unknown outcome
            self.journal.append_together(outcome_records(kind, outcome), token=(kind, outcome))
        else:
            self.journal.append(outcome_records(kind, outcome)[0], token=(kind, outcome))

    def hold(self, kind: str, outcome: Outcome, error: BaseException) -> None:
        """The commit of an outcome's record failed: keep it to write again later (a retry timer, or the next
        commit that lands, :meth:`commit_landed`); its outcome stays unpublished meanwhile.

        Args:
            kind: the token's kind (see :data:`OutcomeToken`).
            outcome: the outcome.
            error: why the commit failed (said once per disk-full spell, at WARNING).
        """
        self._say_failing(error)
        self._keep(kind, outcome)

    def hold_turns(self, profile: str, error: BaseException) -> None:
        """A turn of ``profile`` could not have its ``started`` record written (a full disk): it never ran, and its
        ProfileActor queued it again and starts no turn until resumed, as a held record is written again (the
        retry timer, or the next commit that lands, :meth:`write_held`); failing again, it is held again.

        Args:
            profile: the profile (its folder id).
            error: why the record failed (said once per disk-full spell, at WARNING).
        """
        if self._final:  # the stop winds the profile down: nothing is resumed any more
            return
        self._say_failing(error)
        self._held_turns.add(profile)
        self._arm_retry()

    def _say_failing(self, error: BaseException) -> None:
        """Say that the journal cannot be written (WARNING), once per spell (until :meth:`commit_landed` ends it)."""
        if not self._failing:
            logger.warning("the delivery journal {} cannot be written ({}): outcomes are held back, unpublished, "
                           "and wakes not run, nor any queued turn started, until their records are on disk; they "
                           "are written again every few seconds. Free space on its filesystem", self.journal.path,
                           error)

    def _keep(self, kind: str, outcome: Outcome) -> None:
        """Hold the records of one outcome token to write again (see :meth:`hold`), the retry timer armed."""
        key = outcome.delivery_id
        self._again.discard(key)
        self._held[key] = (kind, outcome)
        self._arm_retry()

    def _hold_wake(self, batch: WakeBatch, error: BaseException) -> None:
        """Hold a wake's batch whose commit failed (or that the journal refused) to write again, unrun meanwhile.

        Held like an outcome record (:meth:`hold`): written again by the retry timer or the next commit
        that lands, and run once it is on disk. Once a stop took the held records (:meth:`take_held`)
        no timer writes it again: it is given up at once (``given_up``).
        """
        batch.error = error
        self._again.discard(batch.wake_id)
        if self._final:
            batch.given_up(error)
            return
        self._say_failing(error)
        logger.debug("wake {} held: its journal batch failed ({})", batch.wake_id, error)
        self._held_wakes[batch.wake_id] = batch
        self._arm_retry()

    def _arm_retry(self) -> None:
        """Something is held: the spell of failures goes on, and the retry timer is armed (unless it is)."""
        self._failing = True
        if self._retry is None and self.retry_after is not None:
            self._retry = self.retry_after(next(self._backoff))

    def written(self, outcome: Outcome) -> None:
        """The record of ``outcome`` landed (its first write, or a held one written again)."""
        self._again.discard(outcome.delivery_id)

    def commit_landed(self) -> None:
        """A commit of the Dispatcher's records landed: the journal takes records again.

        The held ones are written again now (not after their timer); once none is held or
        on its way any more, the end of the spell is said (INFO).
        """
        if self._held or self._held_wakes or self._held_turns:
            self.write_held()
        elif self._failing and not self._again:
            self._failing = False
            self._backoff = doubling(RETRY_FIRST, RETRY_MOST)
            logger.info("the delivery journal {} is written again: the outcomes held back are on disk and published "
                        "(and the wakes and turns held back run)", self.journal.path)

    def write_held(self) -> None:
        """Write the held outcome records and wake batches again, and resume the held profiles' turns (their
        ``started`` records are written as they start) (the retry timer fired, or a commit landed)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        profiles, self._held_turns = self._held_turns, set()
        if profiles and self.resume_turns is not None:
            self.resume_turns(sorted(profiles))
        wakes, self._held_wakes = self._held_wakes, {}
        for batch in wakes.values():
            self._write_wake(batch)  # refused: held again, the timer armed again
            if batch.wake_id in self._wakes:
                self._again.add(batch.wake_id)
        held, self._held = self._held, {}
        for key, (kind, outcome) in held.items():
            try:
                self._append_outcome(kind, outcome)
            except StoreError as exc:  # the journal stopped: the stop's last attempt (take_held) has them
                self._held[key] = (kind, outcome)
                logger.debug("held outcome record of {} not written again: {}", key, exc)
                continue
            self._again.add(key)

    def take_held(self) -> list[OutcomeToken]:
        """The held outcome records, for a stop's last attempt (:meth:`write_last`); none is held any more.

        The held wake batches are given up (``given_up``), and so is any wake batch that fails from now
        on: no timer writes them again. Unwritten, they leave their DM undelivered in the journal, so the
        next start publishes its outcome again and wakes the sender then, once (see :meth:`journal_wake`).
        The held profiles are not resumed: their DMs stay journaled (accepted, never started) and the
        next start runs them once.
        """
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._final = True
        self._held_turns.clear()  # their ProfileActors wind down: the journal keeps their DMs for the next start
        wakes, self._held_wakes = list(self._held_wakes.values()), {}
        for batch in wakes:
            batch.given_up(batch.error or StoreError(0, "the delivery journal did not take it before the stop"))
        held, self._held = list(self._held.values()), {}
        return held

    def write_last(self, held: list[OutcomeToken]) -> bool:
        """A stop's last attempt at the records of held outcomes: written in one batch, waited for.

        Args:
            held: the outcome tokens (see :data:`OutcomeToken`).

        Returns:
            True when they are all on disk (their outcomes may be published); False: none is (a batch
            lands whole or not at all; one not done within :data:`LAST_WRITE_SECONDS` lands, if ever,
            unpublished: the next start then re-delivers it, once).
        """
        records = [record for kind, outcome in held for record in outcome_records(kind, outcome)]
        try:
            batch = self.journal.append_together(records)
        except StoreError as exc:
            logger.debug("last write of {} held outcome record(s) refused: {}", len(held), exc)
            return False
        if not batch.done.wait(LAST_WRITE_SECONDS) or batch.error is not None:
            return False
        for _kind, outcome in held:
            self._again.discard(outcome.delivery_id)
        return True

    def journal_wake(self, wake: Delivery, source_id: str, *, with_delivered: bool = True, go: Callable[[], None],
                     given_up: Callable[[BaseException], None]) -> bool:
        """Journal a wake's acceptance and its DM's ``delivered`` record in one batch; run it once they landed.

        Both or neither (:meth:`Journal.append_together`): a ``delivered`` record on disk without
        its wake's would be a wake a crash loses for good (the next start sees the outcome
        delivered and wakes nobody); neither on disk, the next start re-publishes the DM's
        outcome, which wakes its sender then. The wake runs only once its record is on disk (as
        an ack waits for its commit): run before, its turn's records could land without it, and a
        restart would wake the sender a second time. A batch that fails (a full disk), or that the
        journal refuses outright, is held and written again as an outcome record is (:meth:`hold`),
        and the wake runs once it landed; one a stop finds still unwritten is given up
        (:meth:`take_held`): the next start wakes the sender, once.

        Args:
            wake: the wake's delivery.
            source_id: the DM whose outcome it carries (its ``delivered`` record goes along;
                :meth:`delivered`, called next for it, then writes none of its own).
            with_delivered: False when the DM's ``delivered`` record is written apart, with its
                ``finished`` record (a peer DM's, :meth:`finished`): the batch holds the wake's alone.
            go: runs the wake (called on the Dispatcher's thread once the batch landed).
            given_up: called with the last error when a stop finds the batch still unwritten (the
                wake is not run in this run).

        Returns:
            True: journaled (``go`` or ``given_up`` follows).
        """
        records = [accepted_record(wake)]
        if with_delivered:
            records.append({"t": "delivered", "id": source_id})
        batch = WakeBatch(wake.delivery_id, records, go, given_up)
        if with_delivered:  # even held or given up: the DM's delivered record never goes without the wake's
            self._with_wake[source_id] = batch
        self._write_wake(batch)
        return True

    def _write_wake(self, batch: WakeBatch) -> None:
        """Queue a wake's batch (its first write, or a held one written again); refused outright, it is held."""
        try:
            self.journal.append_together(batch.records, token=("accepted", batch.wake_id))
        except StoreError as exc:
            self._hold_wake(batch, exc)
            return
        self._wakes[batch.wake_id] = batch

    def note(self, record: dict[str, Any]) -> None:
        """Journal ``record`` without waiting; a failure is logged (it only costs a repeat at restart)."""
        try:
            self.journal.append(record)
        except StoreError as exc:
            logger.error("journal append failed: {}", exc)

    def delivered(self, delivery_id: str, then: Callable[[], None] | None = None) -> None:
        """Journal that the outcome of ``delivery_id`` reached its sender: a lazy record (never flushed on its own).

        Lost to a power cut, it costs the outcome published once more at restart. None is written
        for a DM whose outcome started a wake: its record goes in the wake's batch (:meth:`journal_wake`).

        Args:
            delivery_id: the DM (its outcome was just published).
            then: called once the DM's delivery is recorded: at once for a record of its own; for one
                in its wake's batch, once that batch landed (never, when a stop gives it up: a relayed
                DM's relay record then stays, so the next start wakes the sender from it).
        """
        batch = self._with_wake.pop(delivery_id, None)
        if batch is not None:
            if then is not None:
                batch.then.append(then)
            return
        try:
            self.journal.append({"t": "delivered", "id": delivery_id}, lazy=True)
        except StoreError as exc:
            logger.error("journal append failed: {}", exc)
        if then is not None:
            then()

    def finished(self, outcome: Outcome, *, relayed_in: bool = False) -> None:
        """Journal the outcome of a peer DM (already published; token ``kept``) or, ``relayed_in``, of a
        relayed-in DM (already answered through the relay; token ``relayed-in``) and that its sender has it.

        Both records go in one batch; ``JournalDurable`` hands the token back once they, and
        everything journaled before them, are on disk, or held to be written again when they
        failed (:meth:`hold`). Refused, ``wait_outcome`` after a restart misses a peer DM's: the next
        start settles it ``ambiguous`` from its ``accepted`` record (origin ``peer``); a retry of a
        relayed-in DM's envelope after a restart is then not answered from it (``ambiguous`` from the
        ``started`` record its turn journaled; run, had its turn not started).
        """
        try:
            self._append_outcome("relayed-in" if relayed_in else "kept", outcome)
        except StoreError as exc:
            logger.error("journal append failed for the outcome of {}: {}", outcome.delivery_id, exc)

    def write_now(self, record: dict[str, Any]) -> bool:
        """Journal ``record`` and wait for it (shutting down: no group commit to wait for); True once on disk."""
        try:
            self.journal.append_durably(record)
        except StoreError as exc:
            logger.error("could not journal {} of {}: {}", record.get("t"), record.get("id"), exc)
            return False
        return True


Durability = NoDurability | JournalDurability


def _unjournaled_send(delivery_id: str, error: BaseException) -> None:
    """Log a Redis DM acked without its ``accepted`` record (the journal refused or failed it)."""
    logger.error("the Redis DM {} is queued in Redis but its record could not be journaled ({}): it is acked, and "
                 "a restart of this gateway after Redis lost it (appendfsync everysec, a crash) leaves it without an "
                 "outcome; free disk space or fix bot_relay/journal/", delivery_id, error)


def durability_for(journal: Journal | None, dispatcher: pykka.ActorRef[Any],
                   retry_after: Callable[[float], Any] | None = None,
                   resume_turns: Callable[[Iterable[str]], None] | None = None) -> Durability:
    """The strategy for ``journal`` (None: no journal); ``retry_after`` arms the Dispatcher's RetryJournal timer,
    ``resume_turns`` tells held profiles' ProfileActors ``ResumeTurns``."""
    return NoDurability() if journal is None else JournalDurability(journal, dispatcher, retry_after, resume_turns)


def live_record(index: dict[str, ProfileInfo], delivery: Delivery) -> dict[str, Any] | None:
    """The live-delivery mailbox record of ``delivery`` (None: it never went to a live owner)."""
    info = index.get(profile_key(delivery.target))
    if info is None:
        return None
    try:
        return LiveMailbox(info.home).read(delivery.delivery_id)
    except (OSError, ValidationError):
        return None


def live_gave_up(index: dict[str, ProfileInfo], delivery: Delivery, error: str) -> None:
    """``delivery`` is reported ``ambiguous`` (with ``error``) by a stop or a restart: so is its live-mailbox record.

    A record still ``claimed`` (the owner had the DM when the gateway stopped or died) becomes
    ``ambiguous``; a final one, or none (a runner's turn), is left as it is (``give_up_on``).
    """
    info = index.get(profile_key(delivery.target))
    if info is not None:
        give_up_on(info.home, delivery.delivery_id, error)
