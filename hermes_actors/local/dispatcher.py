"""DispatcherActor: the one entry point of every DM, and the owner of every outcome.

One module of handlers; the state lives in composed objects, each used on this
actor's thread only:

- :class:`~hermes_actors.local.admission.Admission`: routing and the conversation guard;
- :class:`~hermes_actors.local.outcome_book.OutcomeBook`: pending, journaling and settled
  deliveries and the futures waiting for them (the only place that changes them);
- a durability strategy (:mod:`hermes_actors.local.durability`: a journal, or none);
- :class:`~hermes_actors.local.profile_table.ProfileTable`: the ProfileActors (first use, idle stop);
- :class:`~hermes_actors.local.local_intake.LocalIntake`: a local delivery booked and queued;
- :class:`~hermes_actors.local.remote_sends.RemoteSends` over
  :class:`~hermes_actors.local.relay_link.RelayLink`: DMs to the relay or a peer;
- :class:`~hermes_actors.local.outcome_flow.OutcomeFlow`: each outcome settled, then published;
- :class:`~hermes_actors.local.wake_hook.SenderWaker`: outcomes that wake their sender;
- :class:`~hermes_actors.local.delivery_stats.DeliveryStats`: one log line per DM, the ``deliveries`` view;
- :class:`~hermes_actors.local.restart_waiters.RestartWaiters`: the ``AwaitRestarts`` answers;
- one :class:`~hermes_actors.core.spell.Spell` per local profile whose turns fail
  (:func:`~hermes_actors.core.failing_turns.turn_ended`: said once at WARNING, and when they run again).

Beside them: :mod:`~hermes_actors.local.relay_in` (a drained envelope's step, pure),
:mod:`~hermes_actors.local.journal_replay` (a previous run's journal) and
:mod:`~hermes_actors.local.dispatcher_failure` (what a failed Dispatcher still owes).
A room member's turn (``RoomTurn``) is queued like a DM; its outcome goes back to its room,
never to the journal or the DM subscribers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pykka
from loguru import logger

from actors import ChildFailed, RestartPolicy, SupervisorActor, handles
from hermes_actors.core import outcomes
from hermes_actors.core.failing_turns import turn_ended
from hermes_actors.core.names import profile_key
from hermes_actors.core.recovery import running_at_stop_text
from hermes_actors.core.spell import Spell
from hermes_actors.core.targets import LocalRoute, Refusal
from hermes_actors.errors import TurnFailed
from hermes_actors.local.admission import Admission, CallerAdmission
from hermes_actors.local.asking_turn import asking_turn
from hermes_actors.local.delivery_stats import DeliveryStats
from hermes_actors.local.dispatcher_failure import FailedCallback, answer_after_failure
from hermes_actors.local.durability import durability_for, live_gave_up
from hermes_actors.local.journal_replay import adopt_journal, replay_journal
from hermes_actors.local.local_intake import LocalIntake
from hermes_actors.local.notifier import Notifier
from hermes_actors.local.outcome_book import DeliveryState, KeptOutcomes, OutcomeBook
from hermes_actors.local.outcome_flow import OutcomeFlow
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.profile_table import DELIVER_BATCH, ProfileTable
from hermes_actors.local.relay_in import RelayInAnswer, relay_in_step
from hermes_actors.local.relay_link import RelayLink
from hermes_actors.local.remote_sends import PeerSubmit, RemoteSends
from hermes_actors.local.restart_waiters import RestartWaiters
from hermes_actors.local.turns import TurnFactory, turn_never_reached, turn_runs_apart
from hermes_actors.local.wake_hook import SenderWaker
from hermes_actors.messages import (
    AcceptLocal,
    AdoptJournal,
    AttachOwner,
    AttachRelay,
    AwaitOutcome,
    AwaitRestarts,
    CheckOutcome,
    Delivery,
    DetachOwner,
    ExportOutcomes,
    FinalizePending,
    JournalDurable,
    NotifyOutcomes,
    Outcome,
    OutcomeReady,
    OutcomesReady,
    OwnerTurnReturned,
    PendingAck,
    ProfileIdle,
    ProfileInfo,
    Recover,
    RefusalAnswered,
    RelayAccepted,
    RelayDeliver,
    RelayedOutcome,
    RelayResumed,
    RetryJournal,
    RoomTurn,
    RosterChanged,
    RosterSnapshot,
    SendRequest,
    ShutdownProfiles,
    StatsRequest,
    StopAccepting,
    Turn,
    TurnHeld,
    WakeDue,
)
from hermes_actors.store.journal import Journal

__all__ = ["DispatcherActor"]


class DispatcherActor(SupervisorActor):
    """Accepts DMs and owns their outcomes.

    Args:
        snapshot: the roster at start (then kept current by RosterChanged).
        deps_factory: builds the ProfileActors' shared deps given this actor's ref
            and the turn factory.
        notifier: the subscribers' Notifier (their callbacks).
        peer_submit: runs a peer delivery off-actor; called with (delivery, route, report).
        runner_is_hermes: turns run on the real Hermes (``bot_mode.wake_sender: auto`` wakes senders then).
        hermes_turns: turns run on a hermes, the real one or a Bot Mode release's CLI (a bot whose turns keep
            failing is told about its model and provider, not about the runner).
        caller_admission: where senders' threads read the roster snapshot (published here on every change).
        on_failing: called on this actor's thread the moment an error escapes a handler: stop the
            acks (see :meth:`on_crashing`).
        on_failed: called once, on this actor's thread, after that error (this actor then stops:
            nothing restarts it, as every part of the gateway holds its ref): with the error, the
            outcomes a stopped Gateway keeps answering and the ids of the deliveries whose turns
            may still run. Before it runs, every DM acked from memory only got its outcome
            (:func:`~hermes_actors.core.failure.outcomes_after_failure`).
    """

    def __init__(
        self,
        snapshot: RosterSnapshot,
        *,
        deps_factory: Callable[[pykka.ActorRef[Any], TurnFactory], ProfileDeps],
        notifier: Notifier,
        peer_submit: PeerSubmit | None = None,
        policy: RestartPolicy | None = None,
        journal: Journal | None = None,
        runner_is_hermes: bool = False,
        hermes_turns: bool = False,
        caller_admission: CallerAdmission | None = None,
        on_failing: Callable[[BaseException], None] | None = None,
        on_failed: FailedCallback | None = None,
    ) -> None:
        super().__init__(policy=policy or RestartPolicy(max_restarts=5, within_seconds=10.0))
        self.snapshot = snapshot
        self.notifier = notifier
        self.deps = deps_factory(self.actor_ref, self._make_turn)
        self.accepting = True
        self.book = OutcomeBook()
        self.timers = self.own_timers(self.deps.scheduler)
        # While outcome records wait for the journal (a full disk), a timer writes them again: no polling otherwise
        self.durability = durability_for(journal, self.actor_ref,
                                         retry_after=lambda delay: self.timers.after(delay, RetryJournal()),
                                         resume_turns=lambda profiles: self.profiles.resume_turns(profiles))
        self.relay = RelayLink(self.actor_ref)
        gauge = caller_admission.gauge if caller_admission is not None else None  # shared with the senders
        self.admission = Admission(gauge)
        self.counters = {"accepted": 0, "refused": 0, "settled": 0, "profile_starts": 0}
        self.refused_by_reason: Counter[str] = Counter()  # the refusals of "refused", by reason
        self.profiles = ProfileTable(self, self.deps, self.counters)
        self.restart_waiters = RestartWaiters(self)
        config = self.deps.config
        self.waker = SenderWaker(self, mode=config.wake_sender, runner_is_hermes=runner_is_hermes,
                                 root=self.deps.root, retry_window=config.reply_wait_seconds,
                                 retry_first=config.wake_retry_seconds)
        self.stats = DeliveryStats()
        self.hermes_turns = hermes_turns or runner_is_hermes
        self.turn_spells: dict[str, Spell] = {}  # local profiles whose last turns failed (turn_ended), by folder id
        self.caller_admission = caller_admission
        self.on_failing = on_failing
        self.on_failed = on_failed  # (not pykka's on_failure hook)
        self.flow = OutcomeFlow(book=self.book, durability=self.durability, relay=self.relay, waker=self.waker,
                                stats=self.stats, counters=self.counters, stopping=lambda: not self.accepting,
                                gauge=gauge)
        self.intake = LocalIntake(book=self.book, profiles=self.profiles, durability=self.durability, flow=self.flow,
                                  counters=self.counters, gauge=gauge)
        self.remote = RemoteSends(dispatcher=self.actor_ref, relay=self.relay, book=self.book, counters=self.counters,
                                  peer_submit=peer_submit, durability=self.durability, settle=self.flow.settle,
                                  stopping=lambda: not self.accepting)

    # ── turns ask back through us ───────────────────────────────────────────

    def _make_turn(self, delivery: Delivery, lock_fd: int | None = None) -> Turn:
        """The ProfileActors' turn factory: a Turn whose ``message_agent`` asks this actor (``asking_turn``)."""
        return asking_turn(self.actor_ref, self.snapshot.index, self.deps.root, delivery, lock_fd,
                           admission=self.caller_admission)

    # ── accepting ───────────────────────────────────────────────────────────

    @handles(RosterChanged)
    def _on_roster(self, msg: RosterChanged) -> None:
        self.snapshot = msg.snapshot
        if self.caller_admission is not None:
            self.caller_admission.snapshot = msg.snapshot

    @handles(AttachRelay)
    def _on_attach_relay(self, msg: AttachRelay) -> None:
        self.relay.attach(msg.ref, reaches_peers=msg.reaches_peers, journals_sends=msg.journals_sends)

    @handles(AttachOwner)
    def _on_attach_owner(self, msg: AttachOwner) -> None:
        self.profiles.attach_owner(self._local(msg.profile), msg.owner)
        self._publish_owners()

    @handles(DetachOwner)
    def _on_detach_owner(self, msg: DetachOwner) -> None:
        self.profiles.detach_owner(self._local(msg.profile))
        self._publish_owners()

    def _publish_owners(self) -> None:
        """Tell the senders' threads which profiles have a live owner (their DMs' acks are the Dispatcher's)."""
        if self.caller_admission is not None:
            self.caller_admission.live_owners = frozenset(self.profiles.owners)

    def _local(self, profile: str) -> ProfileInfo:
        info = self.snapshot.index.get(profile_key(profile))
        if info is None:
            raise KeyError(f"no local profile named {profile!r}")
        return info

    @handles(StopAccepting)
    def _on_stop_accepting(self, msg: StopAccepting) -> None:
        self.accepting = False

    @handles(SendRequest)
    def _on_send(self, msg: SendRequest) -> dict[str, Any] | PendingAck:
        if not self.accepting:
            raise RuntimeError("gateway is not running")
        config = self.deps.config
        admitted = self.admission.admit(
            self.snapshot, msg, max_hops=config.max_hops, max_pair_rate=config.max_pair_rate, wake=self.waker.enabled
        )
        if isinstance(admitted, Refusal):  # counted when its sender's thread returns it (RefusalAnswered)
            return admitted.as_dict()
        route, delivery = admitted
        if isinstance(route, LocalRoute):
            return self.intake.accept(route, delivery)
        return self.remote.send(route, delivery)

    @handles(RefusalAnswered)
    def _on_refusal_answered(self, msg: RefusalAnswered) -> None:
        """A sender was answered a refusal (whichever step made it): count it, once, by reason."""
        self.counters["refused"] += 1
        self.refused_by_reason[msg.reason] += 1

    @handles(AcceptLocal)
    def _on_accept_local(self, msg: AcceptLocal) -> None:
        """A first-hop local DM its sender's thread admitted (and journaled, in durable mode): acked."""
        self.intake.taken(msg, accepting=self.accepting)

    @handles(RelayAccepted)
    def _on_relay_accepted(self, msg: RelayAccepted) -> None:
        """The relay answered a send: book it, and release the caller's ack."""
        self.remote.landed(msg)

    def deliver_local(self, info: ProfileInfo, delivery: Delivery, *, journaled: bool = False) -> None:
        """Book ``delivery`` as pending and queue it on the ProfileActor of ``info`` (``LocalIntake.deliver``)."""
        self.intake.deliver(info, delivery, journaled=journaled)

    def settle(self, outcome: Outcome) -> None:
        """Settle a booked delivery with ``outcome`` (``OutcomeFlow.settle``: journaled first when it is)."""
        self.flow.settle(outcome)

    def tell_later(self, delay: float, message: Any) -> None:
        """Tell this actor ``message`` after ``delay`` seconds (its own timer: cancelled when it stops)."""
        self.timers.after(delay, message)

    @handles(WakeDue)
    def _on_wake_due(self, msg: WakeDue) -> None:
        """A wake attempt's back-off is over: run it (``SenderWaker.due``)."""
        self.waker.due(msg)

    @handles(RoomTurn)
    def _on_room_turn(self, msg: RoomTurn) -> None:
        """A room member's turn: queued on its ProfileActor like a DM; the outcome goes back to the room."""
        self.intake.room_turn(msg, accepting=self.accepting, index=self.snapshot.index)

    @handles(ProfileIdle)
    def _on_profile_idle(self, msg: ProfileIdle) -> None:
        self.profiles.idle(msg)

    @handles(OwnerTurnReturned)
    def _on_owner_turn_returned(self, msg: OwnerTurnReturned) -> None:
        """A live owner's turn returned to a crashed ProfileActor: its restarted instance learns the owner is free."""
        self.profiles.owner_turn_returned(msg.profile, msg.result)

    # ── the relay's side ────────────────────────────────────────────────────

    @handles(RelayDeliver)
    def _on_relay_deliver(self, msg: RelayDeliver) -> None:
        """A drained envelope for one of our profiles (idempotent by envelope id: ``relay_in_step``)."""
        key = msg.envelope["id"]
        step = relay_in_step(msg.envelope, pending=self.book.state(key) is DeliveryState.PENDING,
                             record=self.book.record(key), accepting=self.accepting, index=self.snapshot.index,
                             max_hops=self.deps.config.max_hops, now=time.time(), reply_connection=msg.reply_connection,
                             dead_why=msg.dead_why)
        if isinstance(step, RelayInAnswer):
            self.relay.answer_relay_in(step.outcome, msg.reply_connection, stopping=step.stopping)
        elif step is not None:
            self.intake.relay_in(step, msg.reply_connection)

    @handles(RelayResumed)
    def _on_relay_resumed(self, msg: RelayResumed) -> None:
        self.remote.resumed(msg)

    # ── outcomes ────────────────────────────────────────────────────────────

    @handles(OutcomeReady)
    def _on_outcome(self, msg: OutcomeReady) -> None:
        self.flow.settle(msg.outcome, freed=msg.freed)
        if msg.profile:  # a ProfileActor's
            self._turns_ended(msg.profile, (msg.outcome,))

    @handles(RelayedOutcome)
    def _on_relayed_outcome(self, msg: RelayedOutcome) -> None:
        self.flow.settle_relayed(msg.outcome)

    @handles(OutcomesReady)
    def _on_outcomes(self, msg: OutcomesReady) -> None:
        for outcome in msg.outcomes:
            self.flow.settle(outcome, freed=True)  # a ProfileActor's: it freed their places
        if msg.profile:
            self._turns_ended(msg.profile, msg.outcomes)

    def _turns_ended(self, profile: str, settled: Iterable[Outcome]) -> None:
        """Outcomes the ProfileActor of ``profile`` settled, in order: its spell of failing turns (``turn_ended``)
        says its WARNING at ``SAY_AFTER`` failures in a row, and its INFO when a turn of it succeeds again."""
        for outcome in settled:
            before = self.turn_spells.get(profile)
            if before is None and outcome.status != "failed":  # no spell, and none begins: the common case
                continue
            info = self.snapshot.index.get(profile_key(profile))
            spell, said = turn_ended(before or Spell(), outcome, handle=info.handle if info else profile,
                                     profile=profile, root=self.deps.root, hermes=self.hermes_turns)
            if spell.failures:
                self.turn_spells[profile] = spell
            else:
                self.turn_spells.pop(profile, None)
            if said is not None:
                logger.log(said.level, "{}", said.text)

    def after_message(self, *, asked: bool) -> None:
        """Hand on what the handlers gathered once the mailbox is drained (or a batch is full).

        The deliveries go to their ProfileActors (``ProfileTable.flush``) and the published
        outcomes to the Notifier: one message per burst instead of one per DM. An ask flushes
        them too, so whoever waits for its answer finds them told before it.
        """
        if self.restart_waiters:  # a crash report may have just been handled
            self.restart_waiters.answer()
        if not (self.flow.notes or self.profiles.gathered):
            return
        drained = asked or self.mailbox_size() == 0
        if self.profiles.gathered and (drained or self.profiles.gathered_count >= DELIVER_BATCH):
            self.profiles.flush()
        notes = self.flow.take_notes(drained=drained)
        if notes is not None:
            self.notifier.tell(NotifyOutcomes(notes))

    @handles(AwaitOutcome)
    def _on_await(self, msg: AwaitOutcome) -> None:
        try:
            self.book.wait(msg.delivery_id, msg.reply)
        except KeyError as exc:
            msg.reply.set_exception(exc_info=(KeyError, exc, None))

    @handles(CheckOutcome)
    def _on_check(self, msg: CheckOutcome) -> dict[str, Any] | None:
        return self.book.published(msg.delivery_id)

    # ── durability ──────────────────────────────────────────────────────────

    @handles(JournalDurable)
    def _on_journal_durable(self, msg: JournalDurable) -> None:
        """One group commit landed: release its acks, publish its outcomes (``OutcomeFlow.commit_landed``)."""
        self.flow.commit_landed(msg)

    @handles(RetryJournal)
    def _on_retry_journal(self, msg: RetryJournal) -> None:
        """The retry timer: write the held-back outcome records again (``OutcomeFlow.retry_held``)."""
        self.flow.retry_held()

    @handles(TurnHeld)
    def _on_turn_held(self, msg: TurnHeld) -> None:
        """A ProfileActor queued a turn again, its started record not written: hold the profile's turns until the
        journal may take records again (``JournalDurability.hold_turns``)."""
        self.durability.hold_turns(msg.profile, msg.error)

    @handles(AdoptJournal)
    def _on_adopt_journal(self, msg: AdoptJournal) -> dict[str, int]:
        """Before the relay resumes: learn the previous run's settled outcomes and wakes, and settle its relayed-in
        DMs (``adopt_journal``); answers the relayed-in counts. Once a stop began, they are only remembered."""
        return adopt_journal(msg.states, flow=self.flow, idempotent_runner=msg.idempotent_runner,
                             index=self.snapshot.index, never_reached=self._never_reached,
                             runs_apart=self._runs_apart, settle_relayed_in=self.accepting)

    @handles(Recover)
    def _on_recover(self, msg: Recover) -> dict[str, int]:
        """Act on the journal of a previous run, or one a running gateway adopted (``journal_replay.replay_journal``).

        A running gateway's adoption that arrives once its stop began acts on nothing: the adopted records are
        in our journal, which the stop keeps for the next start (or a gateway running beside it).
        """
        if msg.adopted_from and not self.accepting:
            logger.info("recovery: the journal {} adopted as the gateway stops stays journaled for the next start",
                        ", ".join(msg.adopted_from))
            return {}
        return replay_journal(msg.states, idempotent_runner=msg.idempotent_runner, index=self.snapshot.index,
                              flow=self.flow, requeue=lambda info, dm: self.deliver_local(info, dm, journaled=True),
                              never_reached=self._never_reached, runs_apart=self._runs_apart,
                              adopted_from=msg.adopted_from, relayed=msg.relayed,
                              relay_reported=msg.relay_reported, relay_resumed=self.remote.relay_resumed,
                              await_resume=self.remote.await_resume)

    def _never_reached(self, delivery: Delivery) -> bool:
        """At a start: whether a wake the previous run started provably never reached its bot (the runner says)."""
        try:
            turn = self._make_turn(delivery)
        except TurnFailed:  # its profile is gone: cannot tell
            return False
        return turn_never_reached(self.deps.runner, turn, delivery.accepted_at)

    def _runs_apart(self, delivery: Delivery) -> bool:
        """At a start: whether a turn the previous run lost ran warm in a hermes gateway apart from this host."""
        try:
            turn = self._make_turn(delivery)
        except TurnFailed:  # its profile is gone: cannot tell
            return False
        return turn_runs_apart(self.deps.runner, turn)

    # ── shutdown ────────────────────────────────────────────────────────────

    @handles(ShutdownProfiles)
    def _on_shutdown(self, msg: ShutdownProfiles) -> list[str]:
        """Cancel what is queued everywhere; answer the ids of turns still running."""
        self.accepting = False
        running = self.profiles.wind_down(keep_journaled=self.durability.keeps_at_stop(),
                                          answer_within=msg.answer_within)
        running += [k for k, p in self.book.pending() if p.route == "peer"]
        return running

    @handles(AwaitRestarts)
    def _on_await_restarts(self, msg: AwaitRestarts) -> pykka.ThreadingFuture[None]:
        """A future set once every crashed ProfileActor has reported and been restarted (or given up)."""
        return self.restart_waiters.add()

    @handles(FinalizePending)
    def _on_finalize(self, msg: FinalizePending) -> int:
        """Settle what is still pending: ambiguous if it may have run, else cancelled (``OutcomeFlow.finalize``).

        A running turn's outcome says what became of it (``running_at_stop_text``): ended with its process,
        going on in hermes' gateway, or only still running, as ``msg.places`` says (asked of the runner by the
        stopping thread: runner code never runs in this actor).
        """
        self.profiles.stop_waiting()
        whys = {key: running_at_stop_text(msg.places.get(key, "here")) for key in msg.running}
        for key, why in whys.items():
            entry = self.book.entry(key)
            if entry is not None:  # still running: a live owner's DM has its mailbox record say ambiguous too
                live_gave_up(self.snapshot.index, entry.delivery, why)
        return self.flow.finalize(whys)

    @handles(ExportOutcomes)
    def _on_export(self, msg: ExportOutcomes) -> KeptOutcomes:
        return self.book.export()

    @handles(StatsRequest)
    def _on_stats(self, msg: StatsRequest) -> dict[str, Any]:
        pending = self.book.pending()
        return {
            **self.counters,
            "refused_by_reason": dict(sorted(self.refused_by_reason.items())),
            "pending": self.waker.pending_dms(pending),
            "active_profiles": self.profiles.active(),
            "deliveries": self.stats.view(pending, self.profiles.owners),
        }

    def on_restart(self, name: str, failure: ChildFailed) -> ChildFailed:
        """A ProfileActor restarts after a crash: during a stop, what it held is cancelled here, not run."""
        restart, cancel = self.profiles.restarting(name, failure)
        for delivery in cancel:
            self.flow.settle(outcomes.cancelled(delivery.delivery_id, delivery.label))
        return restart

    def on_child_restarted(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """A crashed ProfileActor is back, with what it held: the deliveries (and owner results) that waited follow."""
        self.profiles.flush()
        self.profiles.hand_returned(name)

    def on_held_handed_over(self, name: str, messages: tuple[Any, ...]) -> None:
        """A fresh ProfileActor takes what a crashed one never did: its Delivers count as sent to it."""
        self.profiles.count_sent(name, messages)

    def on_stale_failure(self, name: str, ref: pykka.ActorRef[Any], failure: ChildFailed) -> None:
        """A ProfileActor crashed after a newer one was started: the newer one takes its queue and mailbox."""
        super().on_stale_failure(name, ref, self.profiles.taken_over(name, failure))

    def on_escalation(self, name: str, error: BaseException | None) -> None:
        """A ProfileActor keeps crashing: fail what it held (``LocalIntake.give_up``), keep the gateway up."""
        self.intake.give_up(name, error)

    def on_crashing(self, error: BaseException) -> None:
        """An error escaped a handler: the gateway stops acking now, before the mailbox is collected.

        The senders' threads ack first-hop DMs themselves and tell them here (``AcceptLocal``);
        ``on_failing`` returns once those already past their check have told theirs, so each one
        is collected and settled by :meth:`on_crash`, never dropped behind the stop.
        """
        if self.on_failing is not None:
            self.on_failing(error)

    def on_crash(self, error: BaseException | None, pending: list[Any], salvage: Any) -> None:
        """This actor failed: answer everyone still waiting on it, then tell the gateway (``on_failed``).

        Runs after :meth:`on_stop` (the ProfileActors are stopped). Asks queued behind the failure
        fail with ``ActorDeadError`` (the default); then ``dispatcher_failure.answer_after_failure``.
        """
        super().on_crash(error, pending, salvage)
        answer_after_failure(book=self.book, durability=self.durability, notifier=self.notifier, error=error,
                             mailbox=pending, on_await=self._on_await, on_failed=self.on_failed)

    def on_stop(self) -> None:
        self.after_message(asked=True)
        self.relay.abandon()
        self.profiles.stop_all()
        self.restart_waiters.answer(stopping=True)  # stopping (or crashed): nobody will restart anything now

