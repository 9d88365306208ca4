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
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_from_record
from hermes_actors.core.names import profile_key
from hermes_actors.core.wake import WAKE_ORIGIN, WakeRequest, is_wake, wake_delivery, wake_enabled, wake_for
from hermes_actors.faults import crashpoint
from hermes_actors.local.durability import Durability
from hermes_actors.local.outcome_book import OutcomeBook, Pending
from hermes_actors.messages import Delivery, Outcome, ProfileInfo, RosterSnapshot

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

_KNOWN_KEEP = 100_000  # wake ids remembered against a second creation (bounded like the settled table)


class SenderWaker:
    """Creates wake turns from published outcomes and keeps wake outcomes out of the DM outcomes.

    Args:
        owner: the Dispatcher (its state is read and changed on its own thread).
        mode: ``bot_mode.wake_sender`` (``auto``, ``true``, ``false``).
        runner_is_hermes: turns run on the real Hermes (``auto`` is on then).
        root: the Hermes root.
    """

    def __init__(self, owner: WakeHost, *, mode: str, runner_is_hermes: bool, root: Path) -> None:
        self.owner = owner
        self.root = Path(root).absolute()  # named in a cut wake's note: the bot runs it from its own folder
        self.mode = mode
        self.runner_is_hermes = runner_is_hermes
        self.enabled = wake_enabled(mode, runner_is_hermes)  # journaled with each DM this gateway accepts
        self.wake_ids: dict[str, None] = {}  # every wake id created here or found in the journal (insertion order)
        # DMs whose outcome is on its way to being published (being journaled, or re-published after a restart)
        self.sources: dict[str, Delivery] = {}
        owner.counters.setdefault("wakes_sent", 0)
        owner.counters.setdefault("wakes_failed", 0)

    def adopt(self, states: dict[str, Any]) -> None:
        """Learn a previous run's wakes and the DMs whose outcomes will be re-published.

        Args:
            states: the journal's delivery states (id → ``DeliveryState``).
        """
        for key, state in states.items():
            if not isinstance(state.delivery, dict):
                continue
            if state.delivery.get("origin") == WAKE_ORIGIN:
                self._remember(key)
            elif state.outcome is not None and not state.delivered:
                self.sources[key] = delivery_from_record(state.delivery, key)

    @staticmethod
    def pending_wakes(pending: list[tuple[str, Pending]]) -> int:
        """How many of the pending entries are wake turns (not DMs: the DM counters leave them out)."""
        return sum(1 for _, entry in pending if is_wake(entry.delivery))

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
        info = owner.snapshot.index.get(profile_key(request.profile))
        if info is None:
            self._failed("@{} is gone: the outcome of {} wakes nobody", request.handle, request.source_id)
            return
        delivery = wake_delivery(request, now=time.time())
        # Booked pending at once (wait_outcome knows it); journaled with the DM's delivered record (both or
        # neither), it runs once they are on disk.
        owner.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=owner.durability.enabled))
        owner.counters["wakes_sent"] += 1  # (one whose records then fail counts in wakes_failed too)
        if not owner.durability.journal_wake(
                delivery, request.source_id, with_delivered=with_delivered,
                go=lambda: self._go(request, delivery, journaled=True),
                given_up=lambda error: self._not_journaled(request, delivery, error, again=with_delivered)):
            self._go(request, delivery, journaled=False)

    def _not_journaled(self, request: WakeRequest, delivery: Delivery, error: BaseException, *, again: bool) -> None:
        """A stop found the wake's records still unwritten: it is not run in this run.

        ``again``: its DM's ``delivered`` record was in the same batch, so the next start publishes
        the DM's outcome again and wakes the sender then (a peer DM's is not published again).
        """
        self.owner.book.withhold(delivery.delivery_id)
        if again:
            self._failed("the wake of @{} for {} could not be journaled before the stop ({}): it is not run now; "
                         "the DM is not marked delivered either, so the next start publishes its outcome again and "
                         "wakes @{} then", request.handle, request.source_id, error, request.handle)
        else:
            self._failed("the wake of @{} for peer DM {} could not be journaled before the stop ({}): @{} is not "
                         "woken with its outcome (a peer DM's outcome is not published again by a restart)",
                         request.handle, request.source_id, error, request.handle)

    def _go(self, request: WakeRequest, delivery: Delivery, *, journaled: bool) -> None:
        """Run a wake (its records are on disk when ``journaled``), or leave it to the next start when stopping."""
        owner = self.owner
        key = delivery.delivery_id
        if owner.book.entry(key) is None:  # a stop settled it (cancelled) while its records were being written
            return
        info = owner.snapshot.index.get(profile_key(request.profile))
        if info is None:  # removed while its records were being written: booked, it gets its outcome now
            owner.settle(outcomes.failed(key, delivery.label, outcomes.gone_text(request.profile), "unknown"))
            return
        if not owner.accepting:  # stopping: a journaled wake runs at the next start, else it is lost
            if journaled:  # (booked pending already: the stop leaves it journaled)
                logger.info("wake of @{} for {} journaled; the next start runs it", request.handle, request.source_id)
            else:
                owner.book.withhold(key)
                self._failed("the gateway is stopping: @{} is not woken with the outcome of {}",
                             request.handle, request.source_id)
            return
        logger.debug("waking @{} with the outcome of {} (wake {})", request.handle, request.source_id, key)
        owner.deliver_local(info, delivery, journaled=journaled)

    def _wake_settled(self, outcome: Outcome, delivery: Delivery | None) -> None:
        who = f"@{delivery.target_handle}" if delivery is not None else "the sender"
        if outcome.status in ("replied", "silent"):
            logger.info("{} was woken with an outcome (wake {}: {})", who, outcome.delivery_id, outcome.status)
        else:
            self._failed("waking {} failed (wake {}, {}): {}", who, outcome.delivery_id,
                         outcome.reason or outcome.status, outcome.error)
