"""ProfileActor: one per bot; owns its turn queue and runs one turn at a time.

The mailbox never blocks on a turn that may block: such a turn runs on the
shared worker pool and comes back as :class:`TurnFinished`. A runner that
declared its turns never block (``runs_inline``) has them run right here, in
the handler that queued them, when the profile's flock is free at once: no
worker hop, no turn timer. A queued delivery waits at most
``turn_wait_seconds`` (one re-armed timer per profile watches the oldest), then
fails ``target_busy`` and is never run later; a wake is the exception, never
refused for a full queue nor expired in it
(:func:`~hermes_actors.core.wake.exempt_from_queue_bounds`). A turn whose ``started`` record the
delivery journal cannot take (a full disk) never ran: it goes back to the head of the queue, and
the profile starts no turn until the Dispatcher says the journal may take records again
(:class:`ResumeTurns`); a DM still waits no longer than its ``turn_wait_seconds``, a wake however
long it takes. The outcomes settled while
handling one message go to the Dispatcher after it, as one :class:`OutcomeReady`
(or :class:`OutcomesReady` for several).

Only the handlers and the state live here: what the actor is started with is
:mod:`~hermes_actors.local.profile_deps`, the outcomes it gives are decided in
:mod:`~hermes_actors.local.profile_outcomes`, and a turn is run by
:mod:`~hermes_actors.local.turn_launch` (inline or as a worker job).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from typing import Any

from loguru import logger

from actors import Link, TimerHandle, TypedActor, handles, tell
from hermes_actors.core import outcomes
from hermes_actors.core.wake import exempt_from_queue_bounds, wake_lock_wait, wake_turn_time_left
from hermes_actors.local.live_handoff import give_up_on, record_not_handed
from hermes_actors.local.profile_deps import ProfileDeps, ProfileSalvage
from hermes_actors.local.profile_outcomes import kept_at_stop, outcome_of_turn, timed_out_outcome
from hermes_actors.local.runners import TurnRunner, as_runner, runs_inline
from hermes_actors.local.turn_launch import end_timed_out_turn, live_owner_for, run_inline, worker_job
from hermes_actors.local.turns import TurnGate
from hermes_actors.messages import (
    AttachOwner,
    Deliver,
    Delivery,
    DetachOwner,
    IdleCheck,
    Outcome,
    OutcomeReady,
    OutcomesReady,
    ProfileIdle,
    ProfileInfo,
    ResumeTurns,
    RunSalvaged,
    StopProfile,
    TimedOutTurnPlace,
    TurnFinished,
    TurnHeld,
    TurnTimeout,
    WaitExpired,
    WindDown,
)
from hermes_actors.store.turnlock import TurnLock, turn_lock_path

__all__ = ["ProfileActor"]


class ProfileActor(TypedActor):
    """Serializes the turns of one profile.

    Its thread is a daemon thread: a "non-blocking" runner's turn that blocks (runner code) holds
    it forever, and the stop leaves it behind (its DM ``ambiguous``) rather than keep the
    interpreter from exiting.

    Args:
        info: the profile.
        deps: shared dependencies.
        link: supervision link (set by the Dispatcher).
        salvage: state of a crashed predecessor.
        owner: the live owner attached to the profile (the Dispatcher knows it), set
            before any message is handled: a restarted instance never hands a DM of
            the crashed one's mailbox to the runner while an owner is attached.
        wind_down: set when the gateway already stops (e.g. a crash restart whose
            predecessor missed the ``WindDown``): the instance starts winding down, and
            no delivery it is given starts a turn.
    """

    use_daemon_thread = True  # pykka: see above

    def __init__(
        self,
        info: ProfileInfo,
        deps: ProfileDeps,
        *,
        link: Link | None = None,
        salvage: ProfileSalvage | None = None,
        owner: Any = None,
        wind_down: WindDown | None = None,
    ) -> None:
        super().__init__(link=link)
        self.info = info
        self.deps = deps
        self.timers = self.own_timers(deps.scheduler)
        # queued deliveries in arrival order, with their monotonic enqueue time
        self.queue: OrderedDict[str, tuple[Delivery, float]] = OrderedDict()
        self.wait_timer: TimerHandle | None = None  # due when the oldest queued delivery's wait runs out
        self.inline = runs_inline(deps.runner)
        self.running: Delivery | None = None
        self.running_since = 0.0  # when the running delivery was queued (monotonic): kept if it is queued again
        # A turn's started record failed in the journal (a full disk): no turn starts until ResumeTurns
        self.journal_held = False
        self.handled = salvage.handled if salvage else 0  # Deliver messages handled (idle-stop handshake)
        self.lock = TurnLock(turn_lock_path(deps.root, info.profile)) if deps.cross_process_lock else None
        self.idle_timer: TimerHandle | None = None
        self.last_active = time.monotonic()
        self._salvage = salvage
        self._wind_down_at_start = wind_down
        self.winding_down = False
        self.owner: TurnRunner | None = as_runner(owner) if owner is not None else None
        self.turn_timer: TimerHandle | None = None
        # The running wake's flock wait ends then (monotonic; None: not a wake on the flock): its turn timer is
        # re-armed while it may still wait, and counts turn_timeout_seconds from when its turn began
        self.wake_waits_until: float | None = None
        self.abandoned: dict[str, bool] = {}  # timed-out turns whose late result is dropped: whether we ended them
        self.gate: TurnGate | None = None  # the running turn's gate: given up on when its time runs out, or at stop
        self.handed = False  # the running turn was handed to the live owner (set at each start, cleared at its end)
        # An owner's turn reported timed out (or ambiguous at a crash) that has not returned: it cannot be ended,
        # so no turn starts beside it while that owner is attached; a crashed predecessor's is carried over (its
        # result is routed here), unless the owner was detached meanwhile (a detach ends the wait: _on_detach)
        busy = salvage.owner_busy if salvage else None
        if busy is not None:
            self.abandoned[busy] = False  # its late result is dropped
        self.owner_busy: str | None = busy if self.owner is not None else None
        self.settled: list[Outcome] = []  # outcomes of the message being handled, told to the Dispatcher after it
        # the deliveries of the Deliver being handled not yet accepted: a crash in between salvages them too
        self.arriving: tuple[Delivery, ...] = ()

    def on_start(self) -> None:
        if self._salvage is not None and self._salvage.queued:
            for delivery, enqueued in self._salvage.queued:
                self._enqueue(delivery, enqueued)
        if self._wind_down_at_start is not None:
            # Started after the gateway began to stop (a crash restart, whose held deliveries the Dispatcher
            # already settled, or a first start): it winds down before any message, so nothing handed or
            # sent to it starts a turn; anything salvaged is settled as its WindDown would have.
            self._wind_down(self._wind_down_at_start)
            self.after_message(asked=False)
            self._salvage = self._wind_down_at_start = None
            return
        if self._salvage is not None and self._salvage.queued:
            # Run them in a handler, where a crash is salvaged again (see RunSalvaged). Whatever the supervisor
            # hands over may come before it: the first handler that starts turns starts these first.
            self.actor_ref.tell(RunSalvaged())
        else:
            self._arm_idle()
        self._salvage = None

    @handles(RunSalvaged)
    def _on_run_salvaged(self, msg: RunSalvaged) -> None:
        self._pump()

    def on_stop(self) -> None:
        self.after_message(asked=False)
        if self.lock is not None:
            self.lock.close()

    # ── deliveries ──────────────────────────────────────────────────────────

    @handles(Deliver)
    def _on_deliver(self, msg: Deliver) -> None:
        self.handled += 1
        for index, delivery in enumerate(msg.deliveries):
            self.arriving = msg.deliveries[index:]
            self._accept(delivery)
        self.arriving = ()
        self._pump()

    def _accept(self, delivery: Delivery) -> None:
        key = delivery.delivery_id
        # The Dispatcher sends each delivery once (its OutcomeBook is the one dedupe); this only keeps
        # the queue's invariant: one entry per id, never a second copy of the one running.
        if key in self.queue or (self.running and self.running.delivery_id == key):
            logger.debug("{}: duplicate delivery {} ignored", self.info.profile, key)
            return
        if self.winding_down:
            self._settle(outcomes.cancelled(key, delivery.label))
            return
        # A wake is queued past the bound: it is bounded by its sender's own DMs, and nobody could resend it
        # (exempt_from_queue_bounds).
        waiting = None if exempt_from_queue_bounds(delivery) else self._full_with()
        if waiting is not None:
            text = outcomes.queue_full_text(self.info.profile, waiting)
            self._settle(outcomes.failed(key, delivery.label, text, "target_busy"))
            return
        self._enqueue(delivery, time.monotonic())

    def _full_with(self) -> int | None:
        """The DMs waiting when ``max_queued`` of them wait already (the queue is full), as the QueueGauge counts them.

        With nothing running, the queue's head is the turn about to start (a batch is queued whole first):
        it is not waiting. Wakes are not counted (exempt_from_queue_bounds): queued past the bound, they
        would otherwise refuse DMs below it.

        Returns:
            The DMs waiting when the queue is full (for the refusal's text); None when a DM may still wait.
        """
        max_queued = self.deps.config.max_queued
        queued = len(self.queue)
        head_starts = self.running is None and queued > 0
        if queued - head_starts < max_queued:  # fewer deliveries than the bound, so fewer DMs: no need to count
            return None
        behind = itertools.islice(self.queue.values(), int(head_starts), None)  # the head that starts is not waiting
        waiting = sum(not exempt_from_queue_bounds(delivery) for delivery, _ in behind)
        return waiting if waiting >= max_queued else None

    def _enqueue(self, delivery: Delivery, enqueued: float) -> None:
        self.queue[delivery.delivery_id] = (delivery, enqueued)
        waits = self.running is not None or len(self.queue) > 1 or self.owner_busy is not None or self.journal_held
        if waits and not exempt_from_queue_bounds(delivery):  # a wake's wait is not timed
            self._arm_wait()

    def _arm_wait(self) -> None:
        """Arm the one wait timer for the oldest queued delivery whose wait is timed, unless it is armed already."""
        if self.wait_timer is not None:
            return
        enqueued = self._oldest_timed()
        if enqueued is None:
            return
        remaining = self.deps.config.turn_wait_seconds - (time.monotonic() - enqueued)
        self.wait_timer = self.timers.after(remaining, WaitExpired())

    def _oldest_timed(self) -> float | None:
        """When the oldest queued delivery whose wait is timed (not a wake) was queued; None when there is none."""
        for delivery, enqueued in self.queue.values():
            if not exempt_from_queue_bounds(delivery):
                return enqueued
        return None

    def _pump(self) -> None:
        """Start what can start; arm the idle check once nothing is left."""
        self._maybe_start()
        if self.running is None and not self.queue:
            self._arm_idle()

    def _maybe_start(self) -> None:
        # A loop, not recursion: inline turns finish here, and the next queued one may start at once.
        # The flock taken for the first inline turn is held across the inline turns queued behind it
        # and released once the loop ends: one flock pair per burst, not per turn. A burst is what
        # was queued, each turn non-blocking by the runner's word, so another process waits no longer
        # than that for its own turn.
        holding = False
        try:
            while self.running is None and self.owner_busy is None and not self.journal_held and self.queue:
                delivery, enqueued = next(iter(self.queue.values()))
                gate = self.deps.gates.open(self.info.profile, delivery.delivery_id)
                if gate is None:  # the gateway stops: it stays queued, for the WindDown (or the stop) to settle
                    break
                inline = holding or self._take_inline()
                holding = holding or inline
                if inline and not gate.begin():  # the stop gave up on it just now (TurnGates.give_up_unbegun)
                    self.deps.gates.close(self.info.profile, gate)
                    break
                del self.queue[delivery.delivery_id]
                if exempt_from_queue_bounds(delivery) and self.deps.gauge is not None:
                    # Queued, a wake held no place (LocalIntake._queue); its turn takes the one kept for the turn,
                    # so no more than max_queued DMs are admitted behind it. Freed as it settles (_settle).
                    self.deps.gauge.hold(self.info.profile, delivery.delivery_id)
                # handed describes this turn only: an earlier owner handoff must not make an inline turn's crash
                # (salvage) or give-up (_settle_unbegun) look like an owner's turn
                self.running, self.gate, self.handed = delivery, gate, False
                self.running_since = enqueued
                if inline:
                    self._run_inline(delivery)
                else:
                    self._run_on_worker(delivery, enqueued, gate)
        finally:
            if holding:
                self._release_inline()

    def _take_inline(self) -> bool:
        """Whether the next turn runs here: a non-blocking runner, no live owner, the flock free right now."""
        if not self.inline or self.owner is not None:
            return False
        if self.lock is None:
            return True
        try:
            return self.lock.try_acquire()
        except OSError:
            return False  # the worker path takes the lock again and reports the error as the DM's outcome

    def _release_inline(self) -> None:
        """Release the flock a run of inline turns held (``_take_inline``)."""
        if self.lock is None:
            return
        try:
            self.lock.release()
        except Exception:  # the turns' results stand over an unlock error
            logger.exception("{}: releasing the turn lock failed", self.info.profile)

    def _run_inline(self, delivery: Delivery) -> None:
        """Run a non-blocking runner's turn on this thread, under the flock ``_take_inline`` took."""
        self._turn_done(delivery, run_inline(delivery, self.deps, self.lock))

    def _run_on_worker(self, delivery: Delivery, enqueued: float, gate: TurnGate) -> None:
        """Hand the turn to the worker pool; it comes back as :class:`TurnFinished`."""
        # A DM waits for the flock until its queue wait's budget runs out. A wake's wait is timed from now (it may
        # have waited its turn past that budget: exempt_from_queue_bounds) and lasts as long as another process's
        # turn may hold the flock (wake_lock_wait): nobody resends a wake that fails target_busy. Its turn timer is
        # armed as any turn's, and re-armed while it may still wait or since its turn began late
        # (_on_turn_timeout): a wake that got the flock late still has turn_timeout_seconds for its turn, and a
        # hung one that got it at once is timed out then, not a whole flock wait later, with DMs failing behind it.
        config = self.deps.config
        owner = live_owner_for(self.owner, delivery)  # the live owner takes no flock
        self.handed = owner is not None
        self.wake_waits_until = None
        if exempt_from_queue_bounds(delivery) and owner is None:
            self.wake_waits_until = deadline = (
                time.monotonic() + wake_lock_wait(config.turn_wait_seconds, config.turn_timeout_seconds))
        else:
            deadline = enqueued + config.turn_wait_seconds
        self.deps.pool.submit(worker_job(self.actor_ref, delivery, self.deps, lock=self.lock, owner=owner,
                                         profile=self.info.profile, home=self.info.home, deadline=deadline,
                                         gate=gate))
        timeout = config.turn_timeout_seconds
        self.turn_timer = self.timers.after(timeout, TurnTimeout(delivery.delivery_id)) if timeout > 0 else None

    def _turn_done(self, delivery: Delivery, result: TurnFinished) -> None:
        if result.unrecorded is not None and not self.winding_down:
            self._hold_for_journal(delivery, result.unrecorded)
            return
        if result.unrecorded is not None:  # the stop began while it tried: it never ran, and runs no more here
            outcome = outcomes.cancelled(delivery.delivery_id, delivery.label)
        else:
            outcome = outcome_of_turn(delivery, result)  # before clearing: a crash here leaves it salvageable
        self._end_running()
        self._settle(outcome)

    def _hold_for_journal(self, delivery: Delivery, error: BaseException) -> None:
        """The turn's ``started`` record failed in the delivery journal (a full disk): it never ran, and is no failure.

        It goes back to the head of the queue with the time it was first queued (a DM's wait stays bounded by
        ``turn_wait_seconds``, then it fails ``target_busy`` as any DM that waited too long; a wake waits however
        long), and no turn starts until the Dispatcher, told :class:`TurnHeld`, says the journal may take records
        again (:class:`ResumeTurns`: a commit landed, or its retry timer fired).

        Args:
            delivery: the turn's delivery (the running one).
            error: why its record failed.
        """
        enqueued = self.running_since
        self._end_running()
        key = delivery.delivery_id
        self.queue[key] = (delivery, enqueued)
        self.queue.move_to_end(key, last=False)
        self.journal_held = True
        if self.wait_timer is not None:  # armed for a younger DM: the head's wait runs out first
            self.wait_timer.cancel()
            self.wait_timer = None
        self._arm_wait()
        logger.debug("{}: turn {} queued again: its started record failed ({})", self.info.profile, key, error)
        tell(self.deps.dispatcher, TurnHeld(self.info.profile, error))

    @handles(ResumeTurns)
    def _on_resume_turns(self, msg: ResumeTurns) -> None:
        """The journal may take records again: the held turn starts again (held anew should its record fail)."""
        self.journal_held = False
        self._pump()

    def _end_running(self) -> None:
        """The running turn is over for this actor (finished, or given up on before it began): its gate
        closes, its timer stops, and nothing says it was handed to the owner any more."""
        self._close_gate()
        self.running, self.handed, self.wake_waits_until = None, False, None
        if self.turn_timer is not None:
            self.turn_timer.cancel()
            self.turn_timer = None

    def _close_gate(self) -> None:
        """The running turn is over for this actor: its gate leaves the gateway's :class:`TurnGates`."""
        if self.gate is not None:
            self.deps.gates.close(self.info.profile, self.gate)
            self.gate = None

    @handles(TurnFinished)
    def _on_turn_finished(self, msg: TurnFinished) -> None:
        delivery = self.running
        if delivery is None or delivery.delivery_id != msg.delivery_id:
            ended = self.abandoned.pop(msg.delivery_id, None)
            if msg.delivery_id == self.owner_busy:  # the owner is free again: the DMs queued behind it may run
                logger.info("{}: its live Bot Chat owner returned the turn {} given up on at its timeout (its answer "
                            "is dropped: that DM stays ambiguous); DMs to {} run again", self.info.profile,
                            msg.delivery_id, self.info.profile)
                self.owner_busy = None
                self._pump()
                return
            if ended is not None:
                logger.warning("{}: the timed-out turn {} {}; its result is dropped", self.info.profile,
                               msg.delivery_id, "was ended" if ended else "finished after all")
            elif self.winding_down:  # given up on at the stop before it began (_give_up_unbegun)
                logger.debug("{}: turn {} given up on at the stop ended without running", self.info.profile,
                              msg.delivery_id)
            else:
                logger.warning("{}: TurnFinished for unknown delivery {}", self.info.profile, msg.delivery_id)
            return
        self._turn_done(delivery, msg)
        self._pump()

    @handles(TurnTimeout)
    def _on_turn_timeout(self, msg: TurnTimeout) -> None:
        """A hung turn: report it, make sure it never runs beside the next one, and serve the next DM."""
        delivery = self.running
        if delivery is None or delivery.delivery_id != msg.delivery_id:
            return
        left = self._wake_time_left()
        if left > 0:  # a wake that began late, or may still wait for the flock: one timer, re-armed for the rest
            self.turn_timer = self.timers.after(left, msg)
            return
        config = self.deps.config
        began = self.gate.give_up() if self.gate is not None else True
        handed = self.handed
        seconds = config.turn_timeout_seconds
        if not began and self.wake_waits_until is not None:  # a wake that waited for the flock all that long
            seconds = wake_lock_wait(config.turn_wait_seconds, config.turn_timeout_seconds)
        if began and handed:
            self._owner_timed_out(delivery, seconds)
            return
        self.turn_timer, self.wake_waits_until = None, None  # it fired: nothing to cancel
        runner = self.deps.runner
        ask = began and callable(getattr(runner, "running_turns", None))
        if began and (ask or callable(getattr(runner, "stop_turns", None))):
            # Ends its process if it runs one, and keeps one from starting (a turn between its gate and its
            # process). Runner code, so on a thread of its own, which first asks whether a process of ours runs
            # it (bounded) and tells the answer back as TimedOutTurnPlace.
            threading.Thread(target=end_timed_out_turn, args=(self.actor_ref, runner, delivery.delivery_id),
                             kwargs={"profile": self.info.profile, "ask": ask},
                             name=f"end-timed-out-turn-{self.info.profile}", daemon=True).start()
        if ask:
            return  # it stays the running turn until the answer: nothing starts beside it, the stop waits for it
        # a turn that never began, or a runner without running_turns(): no process of ours is known to run it
        self._give_up_timed_out(delivery, began=began, handed=handed, live=False, seconds=seconds)

    @handles(TimedOutTurnPlace)
    def _on_timed_out_turn_place(self, msg: TimedOutTurnPlace) -> None:
        """Where the timed-out turn ran is known (or will never be): give it up."""
        delivery = self.running
        if delivery is None or delivery.delivery_id != msg.delivery_id:
            return  # its result came first and settled it
        self._give_up_timed_out(delivery, began=True, handed=False, live=msg.live,
                                seconds=self.deps.config.turn_timeout_seconds)

    def _give_up_timed_out(self, delivery: Delivery, *, began: bool, handed: bool, live: bool | None,
                           seconds: float) -> None:
        """Report the timed-out turn, hand the flock on as it allows, and serve the next DM.

        Args:
            delivery: the timed-out turn's delivery (still ``self.running``).
            began: its gate said it began.
            handed: it was to go to the live owner (read before it was cleared).
            live: a turn process of ours runs it (being ended now); None: not known (the runner's
                ``running_turns()`` raised or did not answer).
            seconds: the time it was given, as its outcome says (a wake that never got the flock: its flock wait).
        """
        self.running, self.handed = None, False
        self._close_gate()
        self.abandoned[delivery.delivery_id] = live is True  # a process of ours runs it: ended now, not left to finish
        if self.lock is not None:
            if live is not False:
                # Its process inherited the flock's descriptor and holds the flock for as long as it lives:
                # unlocking now would let the bot's next turn run beside it. The next turn's flock waits for
                # its end; our descriptor closes once the worker's turn returns. Not known is taken as a process
                # of ours: a turn that waits is safe, one beside it is not.
                self.lock.close()
            else:
                # An in-process or warm turn cannot be ended (nor a process not started), and a turn that never
                # began may be waiting on this descriptor (it lets go once it sees the gate): the flock goes.
                self.lock.abandon()
            self.lock = TurnLock(self.lock.path)
        # "was stopped" only when a process of ours is known to run it; otherwise it may still complete
        outcome = timed_out_outcome(delivery, profile=self.info.profile, seconds=seconds, began=began,
                                    live=live is True)
        if began:
            self._settle(outcome)
        else:
            self._settle_unbegun(outcome, handed=handed)
        self._pump()

    def _wake_time_left(self) -> float:
        """Seconds the running wake's turn timer still has as it fires (:func:`wake_turn_time_left`); 0 for any other
        turn (timed out now).

        A wake whose flock wait is over and which has not begun is given up on here (its gate decides once
        against its worker): it never begins now. One that began in between has the rest of its turn.
        """
        gate, waits_until = self.gate, self.wake_waits_until
        if gate is None or waits_until is None:
            return 0.0
        now = time.monotonic()
        if now >= waits_until and not gate.give_up_unbegun():  # a gate that began is left as it is: True
            return 0.0
        return wake_turn_time_left(now, gate.began_at(), waits_until, self.deps.config.turn_timeout_seconds)

    def _owner_timed_out(self, delivery: Delivery, seconds: float) -> None:
        """The live owner's turn outlived ``turn_timeout_seconds``: it cannot be ended, so report it ``ambiguous``
        (its mailbox record too), and start no turn of this profile until it returns or the owner is detached
        (DESIGN 4.1). The DMs queued behind it wait their ``turn_wait_seconds`` as behind any turn, then fail
        ``target_busy`` with a text that says what holds them (``busy_text(owner_hung=True)``); those still
        waiting when it returns run then (as behind a timed-out turn process still holding the flock). An owner
        detached while that turn ran holds nothing: the DMs go on down the normal turn path.
        """
        key = delivery.delivery_id
        outcome = timed_out_outcome(delivery, profile=self.info.profile, seconds=seconds, began=True, live=False,
                                    owner=True)
        if not give_up_on(self.info.home, key, outcome.error):
            return  # the owner answered just now (its record is final): its TurnFinished follows and settles it
        self.running, self.turn_timer, self.handed = None, None, False
        self._close_gate()
        self.abandoned[key] = False
        self._settle(outcome)
        if self.owner is None:  # detached while its turn ran: the embedder no longer waits for that owner
            self._pump()
            return
        self.owner_busy = key
        logger.warning("{}: its live Bot Chat owner did not return the turn {} within {:g}s (reported ambiguous); "
                       "DMs to {} wait until the owner returns it or detach_live_owner('{}') is called, and "
                       "fail target_busy after turn_wait_seconds meanwhile", self.info.profile, key, seconds,
                       self.info.profile, self.info.profile)
        self._arm_wait()

    @handles(WaitExpired)
    def _on_wait_expired(self, msg: WaitExpired) -> None:
        """Fail every queued delivery whose wait ran out (the oldest first), then re-arm for the next.

        A wake stays queued however long it waited (``exempt_from_queue_bounds``): its turn still comes.
        """
        self.wait_timer = None
        budget = self.deps.config.turn_wait_seconds
        now = time.monotonic()
        for key, (delivery, enqueued) in list(self.queue.items()):
            if exempt_from_queue_bounds(delivery):
                continue
            if now - enqueued < budget:
                break
            del self.queue[key]
            text = outcomes.busy_text(self.info.profile, now - enqueued, owner_hung=self.owner_busy is not None)
            self._settle(outcomes.failed(key, delivery.label, text, "target_busy"))
        self._arm_wait()

    def _settle(self, outcome: Outcome) -> None:
        if self.deps.gauge is not None:  # its turn is over (or never ran): the next DM may take its place
            self.deps.gauge.release(outcome.delivery_id)
        self.settled.append(outcome)

    def after_message(self, *, asked: bool) -> None:
        """Hand the outcomes this message settled to the Dispatcher: one message for all of them."""
        if self.settled:
            settled, self.settled = tuple(self.settled), []
            # _settle freed their places in the queue: the Dispatcher need not
            profile = self.info.profile  # whose turns: the Dispatcher's spells of failing turns
            tell(self.deps.dispatcher, OutcomesReady(settled, profile) if len(settled) > 1
                 else OutcomeReady(settled[0], freed=True, profile=profile))

    # ── idle stop and wind-down ─────────────────────────────────────────────

    def _arm_idle(self) -> None:
        # One timer at a time, re-armed lazily: a busy profile does not touch the timer heap per DM.
        self.last_active = time.monotonic()
        if self.deps.config.idle_stop_seconds > 0 and self.idle_timer is None:
            self.idle_timer = self.timers.after(self.deps.config.idle_stop_seconds, IdleCheck())

    @handles(IdleCheck)
    def _on_idle_check(self, msg: IdleCheck) -> None:
        self.idle_timer = None
        idle_for = time.monotonic() - self.last_active
        if self.owner is not None or self.owner_busy is not None:
            # a live owner keeps the profile's actor alive; detach re-arms the idle timer, and so does the owner's
            # timed-out turn returning (a new actor would not know that turn still runs)
            return
        if idle_for < self.deps.config.idle_stop_seconds or self.running is not None or self.queue:
            if self.running is None and not self.queue:
                remaining = self.deps.config.idle_stop_seconds - idle_for
                self.idle_timer = self.timers.after(remaining, IdleCheck())
            return
        if self.running is None and not self.queue:
            # The Dispatcher decides: it stops us only if no Deliver is in flight to us.
            self.deps.dispatcher.tell(ProfileIdle(self.info.profile, self.actor_ref, self.handled))

    @handles(AttachOwner)
    def _on_attach(self, msg: AttachOwner) -> None:
        self.owner = as_runner(msg.owner)

    @handles(DetachOwner)
    def _on_detach(self, msg: DetachOwner) -> None:
        # Deliveries not yet handed over simply take the normal turn path from now on.
        self.owner = None
        if self.owner_busy is not None:  # the DMs waited for that owner only: its late answer is still dropped
            logger.info("{}: live Bot Chat owner detached; DMs to {} no longer wait for its turn {} given up on at "
                        "its timeout", self.info.profile, self.info.profile, self.owner_busy)
            self.owner_busy = None
            self._pump()
        elif self.running is None and not self.queue:
            self._arm_idle()

    @handles(StopProfile)
    def _on_stop_profile(self, msg: StopProfile) -> None:
        self.stop()

    @handles(WindDown)
    def _on_wind_down(self, msg: WindDown) -> str | None:
        """Cancel every queued delivery and a worker turn not begun yet; answer the id of the running one (or None)."""
        self._wind_down(msg)
        self._give_up_unbegun(msg)
        return self.running.delivery_id if self.running else None

    def _give_up_unbegun(self, msg: WindDown) -> None:
        """A worker turn that has not begun (waiting for the flock or a worker) never will: it ends like a queued DM.

        Its gate decides, once, against the worker: a turn that began runs on, its retry and cleanup included
        (the stop waits for it, and reports it ``ambiguous`` past its timeout); one that had not is cancelled,
        or left journaled for the next start, and its worker never calls the runner. Its late result is dropped.
        """
        delivery, handed = self.running, self.handed
        if delivery is None or self.gate is None or self.gate.give_up_unbegun():
            return
        self._end_running()
        if not kept_at_stop(delivery, keep_journaled=msg.keep_journaled):
            self._settle_unbegun(outcomes.cancelled(delivery.delivery_id, delivery.label), handed=handed)
        # else a live-mailbox record its worker may have made stays queued: the next start hands it over

    def _settle_unbegun(self, outcome: Outcome, *, handed: bool) -> None:
        """Settle the turn given up on before it began; a handoff's live-mailbox record says the same.

        Args:
            outcome: its outcome (never ran).
            handed: it was to go to the live owner (the ended turn's ``handed``, read before it was cleared).
        """
        if handed:
            record_not_handed(self.info.home, outcome)
        self._settle(outcome)

    def _wind_down(self, msg: WindDown) -> None:
        """From now on every delivery is cancelled; settle what is queued (journaled ones stay in the journal)."""
        self.winding_down = True
        for key, (delivery, _) in list(self.queue.items()):
            if kept_at_stop(delivery, keep_journaled=msg.keep_journaled):
                continue
            self._settle(outcomes.cancelled(key, delivery.label))
        self.queue.clear()
        if self.wait_timer is not None:
            self.wait_timer.cancel()
            self.wait_timer = None

    # ── crash ───────────────────────────────────────────────────────────────

    def answer_after_crash(self, message: Any) -> tuple[bool, Any]:
        """The stop's ``WindDown`` reaching a crashed instance: nothing runs here any more.

        Its running turn was settled ``ambiguous`` at the crash, and the Dispatcher settles
        what it queued when it restarts it (``ProfileTable.restarting``); the Dispatcher asks
        synchronously, so the answer cannot wait for that restart.
        """
        if isinstance(message, WindDown):
            return True, None
        return False, None

    def salvage(self) -> ProfileSalvage:
        owner_busy = self.owner_busy
        if self.running is not None:
            # The turn ran (or is running): its result is unknown, it must not run again. Its gate is given up
            # on: a worker that had not begun it never does (nor retries it).
            began = self.gate.give_up() if self.gate is not None else True
            outcome = outcomes.ambiguous(
                self.running.delivery_id, self.running.label, "The target's ProfileActor crashed during the turn."
            )
            # Handed to the live owner: its record says ambiguous too, and while its turn runs (it cannot be ended)
            # the restarted instance hands nothing beside it. One the owner settled already keeps its record.
            if self.handed and give_up_on(self.info.home, outcome.delivery_id, outcome.error) and began:
                owner_busy = outcome.delivery_id
            self._settle(outcome)
            self._close_gate()
        # A crash inside a Deliver: its deliveries not yet queued are acked DMs too (pykka's pending list holds
        # only the messages behind the one that crashed); the restarted instance accepts them anew.
        settled = {o.delivery_id for o in self.settled}
        arriving = [(d, time.monotonic()) for d in self.arriving
                    if d.delivery_id not in self.queue and d.delivery_id not in settled
                    and (self.running is None or self.running.delivery_id != d.delivery_id)]
        return ProfileSalvage((*self.queue.values(), *arriving), self.handled, owner_busy)

    def on_crash(self, error: BaseException | None, pending: list[Any], salvage: Any) -> None:
        self.after_message(asked=False)  # what salvage() settled (the running turn: ambiguous)
        if self.wait_timer is not None:
            self.wait_timer.cancel()
        if self.lock is not None:
            self.lock.close()
        super().on_crash(error, pending, salvage)
