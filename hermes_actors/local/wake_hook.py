"""The Dispatcher's sender wake-up: an outcome becomes a turn in the sender's Bot Chat.

:class:`SenderWaker` is owned by the DispatcherActor and runs on its thread.
The Dispatcher calls :meth:`SenderWaker.after_publish` for every outcome it
publishes and :meth:`SenderWaker.adopt` with the journal of a previous run;
the decisions are :mod:`hermes_actors.core.wake`'s.

Exactly once, in durable mode: the wake is journaled as an ``accepted`` local
delivery (origin ``"wake"``, its id derived from the DM's) once the DM's outcome
is durable, in ONE batch with the DM's ``delivered`` record (both land or
neither), and it runs only once that batch is on disk. A batch that fails (a
full disk) is written again until it lands, then the wake runs. A restart then
either finds the wake in the journal (re-offered if it never started; a wake
that may have started is NOT run again) or, when the crash (or a stop with the
batch still unwritten) came before the batch landed, finds the DM not delivered
and re-publishes its outcome, which creates the wake once. A peer DM's
``delivered`` record goes with its ``finished`` record instead (its outcome is
published before either is journaled, and no restart publishes it again).

A wake attempt that fails retryable (``core.wake.wake_retryable``: its turn never began) is
tried again, as a delivery of its own (``core.wake.wake_retry_delivery``), until
``bot_mode.reply_wait_seconds`` passed since the wake was created; then it is given up (one
WARNING, counted in ``wakes_failed``). The next attempt is created, booked and journaled as the
failed one's outcome is published, its ``accepted`` record in ONE batch with the failed attempt's
``delivered`` record, as a first wake's goes with its DM's; it runs once that batch is on disk and
its back-off is over (``core.wake.wake_retry_delay``, a Dispatcher timer telling ``WakeDue``). So a
stop or a crash during the back-off leaves it journaled, never started: the next start runs it
once, at once (the back-off is not journaled: it is re-offered like any accepted DM). A crash
before the batch landed leaves the failed attempt not delivered: the next start publishes its
outcome again, which decides the retry again (the same id: created once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_from_record
from hermes_actors.core.names import profile_key
from hermes_actors.core.wake import (
    WAKE_ORIGIN,
    WakeRequest,
    is_wake,
    wake_delivery,
    wake_enabled,
    wake_failure_text,
    wake_for,
    wake_result,
    wake_retry_delay,
    wake_retry_delivery,
    wake_retryable,
)
from hermes_actors.faults import crashpoint
from hermes_actors.local.durability import Durability
from hermes_actors.local.outcome_book import OutcomeBook, Pending
from hermes_actors.messages import Delivery, Outcome, ProfileInfo, RosterSnapshot, WakeDue
from hermes_actors.store.journal_records import delivery_origin

__all__ = ["SenderWaker", "WakeHost"]


class WakeHost(Protocol):
    """What the waker reads and uses of the Dispatcher (on the Dispatcher's thread)."""

    snapshot: RosterSnapshot
    counters: dict[str, int]
    accepting: bool
    book: OutcomeBook
    durability: Durability

    def deliver_local(self, info: ProfileInfo, delivery: Delivery, *, journaled: bool = False) -> None:
        """Queue ``delivery`` on the ProfileActor of ``info`` and book it as pending."""

    def settle(self, outcome: Outcome) -> None:
        """Settle a booked delivery with ``outcome`` (journaled first when it is), as a turn's outcome is."""

    def tell_later(self, delay: float, message: Any) -> None:
        """Tell the Dispatcher ``message`` after ``delay`` seconds (its own timer, cancelled when it stops)."""

_KNOWN_KEEP = 100_000  # wake ids remembered against a second creation (bounded like the settled table)


class SenderWaker:
    """Creates wake turns from published outcomes and keeps wake outcomes out of the DM outcomes.

    Args:
        owner: the Dispatcher (its state is read and changed on its own thread).
        mode: ``bot_mode.wake_sender`` (``auto``, ``true``, ``false``).
        runner_is_hermes: turns run on the real Hermes (``auto`` is on then).
        root: the Hermes root.
        retry_window: ``bot_mode.reply_wait_seconds``: a failed wake is tried again until this long after it
            was created.
        retry_first: ``bot_mode.wake_retry_seconds``: the shortest back-off before an attempt.
        clock: the wall clock (``time.time``; a wake's creation time is one, kept across restarts).
    """

    def __init__(self, owner: WakeHost, *, mode: str, runner_is_hermes: bool, root: Path,
                 retry_window: float, retry_first: float, clock: Callable[[], float] = time.time) -> None:
        self.owner = owner
        self.root = Path(root).absolute()  # named in a cut wake's note: the bot runs it from its own folder
        self.mode = mode
        self.runner_is_hermes = runner_is_hermes
        self.enabled = wake_enabled(mode, runner_is_hermes)  # journaled with each DM this gateway accepts
        self.wake_ids: dict[str, None] = {}  # every wake id created here or found in the journal (insertion order)
        # DMs (and wake attempts) whose outcome is on its way to being published (being journaled, or re-published
        # after a restart)
        self.sources: dict[str, Delivery] = {}
        self.retry_window = retry_window
        self.retry_first = retry_first
        self.clock = clock
        owner.counters.setdefault("wakes_sent", 0)
        owner.counters.setdefault("wakes_retried", 0)
        owner.counters.setdefault("wakes_failed", 0)

    def adopt(self, states: dict[str, Any]) -> None:
        """Learn a previous run's wakes, and the DMs and wake attempts whose outcomes will be re-published.

        A wake attempt's delivery is kept too: a re-published retryable failure is tried again from it.

        Args:
            states: the journal's delivery states (id → ``DeliveryState``).
        """
        for key, state in states.items():
            if delivery_origin(state) == WAKE_ORIGIN:  # a rewritten journal keeps it on the finished record
                self._remember(key)
            if not isinstance(state.delivery, dict):
                continue
            if state.outcome is not None and not state.delivered:
                self.sources[key] = delivery_from_record(state.delivery, key)

    @staticmethod
    def pending_dms(pending: list[tuple[str, Pending]]) -> int:
        """How many of the pending entries are DMs, as the DM counters (``accepted``, ``settled``) count them.

        Args:
            pending: the pending entries (``OutcomeBook.pending``).

        Returns:
            Their number, less the wake turns (they hand an outcome to its sender) and the room members'
            turns (their outcomes go back to the room): neither is a DM.
        """
        return sum(1 for _, entry in pending if entry.route != "room" and not is_wake(entry.delivery))

    def settling(self, key: str, entry: Pending | None) -> None:
        """Called when the outcome of ``key`` arrives for ``entry``, before it is journaled and published.

        Remembers the DM until :meth:`after_publish` (the pending entry is gone by then).
        """
        if entry is not None and entry.route != "relay-in":
            self.sources[key] = entry.delivery

    def after_publish(self, outcome: Outcome, entry: Pending | None) -> bool:
        """Called for each published outcome, after ``wait_outcome`` waiters got it.

        Args:
            outcome: the outcome.
            entry: its pending entry (None: a re-published outcome of a previous run).

        Returns:
            True when the outcome is a wake turn's own: it is not a DM outcome and
            must not reach subscribers.
        """
        remembered = self.sources.pop(outcome.delivery_id, None)
        delivery = entry.delivery if entry is not None else remembered
        if is_wake(delivery) or (delivery is None and outcome.delivery_id in self.wake_ids):
            self._wake_settled(outcome, delivery)
            return True
        request = wake_for(
            outcome,
            delivery,
            mode=self.mode,
            runner_is_hermes=self.runner_is_hermes,
            local_profiles=self.owner.snapshot.index,
            root=self.root,
        )
        if request is not None and request.wake_id not in self.wake_ids:
            # A peer DM's delivered record goes with its finished one (OutcomeFlow.settle): not in the wake's batch
            self._start(request, with_delivered=entry is None or entry.route != "peer")
        return False

    def due(self, msg: WakeDue) -> None:
        """A wake attempt's back-off is over (the Dispatcher's timer told ``WakeDue``): run it now."""
        self._go(msg.delivery, f"the outcome wake {msg.previous} could not bring", journaled=msg.journaled)

    # ── internals ───────────────────────────────────────────────────────────

    def _remember(self, wake_id: str) -> None:
        self.wake_ids[wake_id] = None
        if len(self.wake_ids) > _KNOWN_KEEP:
            del self.wake_ids[next(iter(self.wake_ids))]

    def _failed(self, why: str, *args: Any) -> None:
        self.owner.counters["wakes_failed"] += 1
        logger.warning(why, *args)

    def _start(self, request: WakeRequest, *, with_delivered: bool) -> None:
        """Book and journal the wake ``request`` asks for; it runs once journaled (at once without a journal).

        ``with_delivered``: its DM's ``delivered`` record goes in the wake's batch (see
        ``JournalDurability.journal_wake``).
        """
        owner = self.owner
        crashpoint("after-outcome-before-wake")
        self._remember(request.wake_id)
        if owner.snapshot.index.get(profile_key(request.profile)) is None:
            self._failed("@{} is gone: the outcome of {} wakes nobody", request.handle, request.source_id)
            return
        delivery = wake_delivery(request, now=self.clock())
        owner.counters["wakes_sent"] += 1  # (one whose records then fail counts in wakes_failed too)
        self._book(delivery, request.source_id, with_delivered=with_delivered,
                   run=lambda journaled: self._go(delivery, f"the outcome of {request.source_id}",
                                                  journaled=journaled))

    def _retry(self, failed: Delivery, outcome: Outcome, delay: float) -> None:
        """Create the next attempt of wake attempt ``failed`` (it failed retryable): it runs after ``delay`` s.

        Booked and journaled now, its ``accepted`` record in one batch with ``failed``'s ``delivered``
        record (the Dispatcher writes that one next, :meth:`after_publish`'s caller): a crash before the
        batch lands leaves ``failed`` undelivered, so the next start publishes its outcome again and
        decides this retry again, once.
        """
        owner = self.owner
        attempt = wake_retry_delivery(failed)
        if attempt.delivery_id in self.wake_ids:  # created already (in this run, or the journal has it)
            return
        self._remember(attempt.delivery_id)
        who = f"@{failed.target_handle}"
        if owner.snapshot.index.get(profile_key(failed.target)) is None:
            self._failed("waking {} failed (wake {}, {}): {}; not tried again: {} is gone", who,
                         failed.delivery_id, outcome.reason, wake_failure_text(outcome.reason, outcome.error), who)
            return
        owner.counters["wakes_retried"] += 1
        logger.info("waking {} failed (wake {}, {}): {}; tried again in {:.1f} s (wake {}), until {:.0f} s after "
                    "the wake was created (bot_mode.reply_wait_seconds)", who, failed.delivery_id, outcome.reason,
                    wake_failure_text(outcome.reason, outcome.error), delay, attempt.delivery_id, self.retry_window)
        self._book(attempt, failed.delivery_id, with_delivered=True,
                   run=lambda journaled: owner.tell_later(delay, WakeDue(attempt, failed.delivery_id, journaled)))

    def _book(self, delivery: Delivery, source_id: str, *, with_delivered: bool,
              run: Callable[[bool], None]) -> None:
        """Book a wake attempt pending and journal it; ``run(journaled)`` once its records are on disk (at once,
        with ``False``, without a journal).

        ``source_id``: the DM (or the failed attempt) whose ``delivered`` record goes in the batch when
        ``with_delivered`` (see ``JournalDurability.journal_wake``).
        """
        owner = self.owner
        # Booked pending at once (wait_outcome knows it); journaled with the source's delivered record (both or
        # neither), it runs once they are on disk.
        owner.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=owner.durability.enabled))
        if not owner.durability.journal_wake(
                delivery, source_id, with_delivered=with_delivered, go=lambda: run(True),
                given_up=lambda error: self._not_journaled(delivery, source_id, error, again=with_delivered)):
            run(False)

    def _not_journaled(self, delivery: Delivery, source_id: str, error: BaseException, *, again: bool) -> None:
        """A stop found the wake attempt's records still unwritten: it is not run in this run.

        ``again``: its source's ``delivered`` record was in the same batch, so the next start publishes
        the source's outcome again and wakes the sender then (a peer DM's is not published again).
        """
        self.owner.book.withhold(delivery.delivery_id)
        who = f"@{delivery.target_handle}"
        if again:
            self._failed("the wake of {} for {} could not be journaled before the stop ({}): it is not run now; "
                         "{} is not marked delivered either, so the next start publishes its outcome again and "
                         "wakes {} then", who, source_id, error, source_id, who)
        else:
            self._failed("the wake of {} for peer DM {} could not be journaled before the stop ({}): {} is not "
                         "woken with its outcome (a peer DM's outcome is not published again by a restart)",
                         who, source_id, error, who)

    def _go(self, delivery: Delivery, carrying: str, *, journaled: bool) -> None:
        """Run a wake attempt (its records are on disk when ``journaled``), or leave it to the next start when
        stopping. ``carrying``: what it brings, for the log (``the outcome of <DM>``)."""
        owner = self.owner
        key = delivery.delivery_id
        who = f"@{delivery.target_handle}"
        if owner.book.entry(key) is None:  # a stop settled it (cancelled) while its records were being written
            return
        info = owner.snapshot.index.get(profile_key(delivery.target))
        if info is None:  # removed while its records were being written: booked, it gets its outcome now
            owner.settle(outcomes.failed(key, delivery.label, outcomes.gone_text(delivery.target), "unknown"))
            return
        if not owner.accepting:  # stopping: a journaled wake runs at the next start, else it is lost
            if journaled:  # (booked pending already: the stop leaves it journaled)
                logger.info("wake of {} with {} journaled; the next start runs it (wake {})", who, carrying, key)
            else:
                owner.book.withhold(key)
                self._failed("the gateway is stopping: {} is not woken with {} (wake {})", who, carrying, key)
            return
        logger.debug("waking {} with {} (wake {})", who, carrying, key)
        owner.deliver_local(info, delivery, journaled=journaled)

    def _wake_settled(self, outcome: Outcome, delivery: Delivery | None) -> None:
        """A wake attempt's outcome: logged; a retryable failure is tried again while its window is open."""
        who = f"@{delivery.target_handle}" if delivery is not None else "the sender"
        if outcome.status in ("replied", "silent"):
            logger.info("{} was woken with an outcome (wake {}: {})", who, outcome.delivery_id, outcome.status)
            return
        if delivery is None or not wake_retryable(outcome.status, outcome.reason):
            self._failed("waking {} failed (wake {}, {}): {}", who, outcome.delivery_id,
                         wake_result(outcome.status, outcome.reason),
                         wake_failure_text(outcome.reason, outcome.error, outcome.status))
            return
        delay = wake_retry_delay(self.clock(), delivery.accepted_at, self.retry_window, self.retry_first)
        if delay is None:
            self._failed("waking {} failed (wake {}, {}): {}; given up: {:.0f} s (bot_mode.reply_wait_seconds) have "
                         "passed since the wake was created, so {} never gets this outcome", who,
                         outcome.delivery_id, outcome.reason, wake_failure_text(outcome.reason, outcome.error),
                         self.retry_window, who)
            return
        self._retry(delivery, outcome, delay)
