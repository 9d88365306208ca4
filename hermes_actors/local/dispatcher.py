"""DispatcherActor: the one entry point of every DM, and the owner of every outcome.

One module of handlers; the state lives in composed objects, each used on this
actor's thread only:

- :class:`~hermes_actors.local.admission.Admission`: routing and the conversation guard;
- :class:`~hermes_actors.local.outcome_book.OutcomeBook`: pending, journaling and settled
  deliveries and the futures waiting for them (the only place that changes them);
- a durability strategy (:mod:`hermes_actors.local.durability`: a journal, or none);
- :class:`~hermes_actors.local.profile_table.ProfileTable`: the ProfileActors (started on
  first use, stopped when idle, supervised);
- :class:`~hermes_actors.local.relay_link.RelayLink`: sends to the relay, answered later
  (``RelayAccepted``), never waited for here;
- :class:`~hermes_actors.local.wake_hook.SenderWaker`: outcomes that wake their sender;
- :class:`~hermes_actors.local.delivery_stats.DeliveryStats`: one log line per DM, the ``deliveries`` view.

A group room's member turn (``RoomTurn``) is queued like a DM; its outcome goes
back to its room, never to the journal or the DM subscribers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, ChildFailed, RestartPolicy, SupervisorActor, ask, handles, tell
from hermes_actors.core import outcomes, reasons
from hermes_actors.core.acks import ack_payload, outcome_from_record, resolve_ack
from hermes_actors.core.failure import HeldDelivery, failure_text, outcomes_after_failure
from hermes_actors.core.guard import check_hops
from hermes_actors.core.names import profile_key
from hermes_actors.core.recovery import known_outcomes, plan_recovery, readable_states
from hermes_actors.core.targets import LocalRoute, PeerRoute, Refusal
from hermes_actors.errors import TurnFailed
from hermes_actors.faults import crashpoint
from hermes_actors.local.admission import Admission, CallerAdmission
from hermes_actors.local.delivery_stats import DeliveryStats, log_settled
from hermes_actors.local.durability import durability_for, live_record
from hermes_actors.local.outcome_book import Answers, DeliveryState, OutcomeBook, Pending, answer
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.profile_table import DELIVER_BATCH, ProfileTable
from hermes_actors.local.relay_link import RelayLink, delivery_from_envelope
from hermes_actors.local.turns import TurnFactory, turn_for
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
    PendingAck,
    ProfileIdle,
    ProfileInfo,
    Recover,
    RelayAccepted,
    RelayDeliver,
    RelayedOutcome,
    RelayResumed,
    RoomTurn,
    RosterChanged,
    RosterSnapshot,
    SendRequest,
    ShutdownProfiles,
    StatsRequest,
    StopAccepting,
    Turn,
)
from hermes_actors.store.journal import Journal

__all__ = ["DispatcherActor"]

_FAILED_DRAIN_SECONDS = 10.0  # a failed Dispatcher waits this long for the journal's last commits
NOTIFY_BATCH = 64  # outcomes per Notifier message at most: subscribers see them without waiting for a quiet moment


class DispatcherActor(SupervisorActor):
    """Accepts DMs and owns their outcomes.

    Args:
        snapshot: the roster at start (then kept current by RosterChanged).
        deps_factory: builds the ProfileActors' shared deps given this actor's ref
            and the turn factory.
        notifier: the Notifier actor (subscriber callbacks).
        peer_submit: runs a peer delivery off-actor; called with (delivery, route, report).
        runner_is_hermes: turns run on the real Hermes (``bot_mode.wake_sender: auto`` wakes senders then).
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
        notifier: pykka.ActorRef[Any],
        peer_submit: Callable[[Delivery, PeerRoute, Callable[[Outcome], None]], None] | None = None,
        policy: RestartPolicy | None = None,
        journal: Journal | None = None,
        runner_is_hermes: bool = False,
        caller_admission: CallerAdmission | None = None,
        on_failing: Callable[[BaseException], None] | None = None,
        on_failed: Callable[[BaseException | None, dict[str, dict[str, Any]], list[str]], None] | None = None,
    ) -> None:
        super().__init__(policy=policy or RestartPolicy(max_restarts=5, within_seconds=10.0))
        self.snapshot = snapshot
        self.notifier = notifier
        self.peer_submit = peer_submit
        self.deps = deps_factory(self.actor_ref, self._make_turn)
        self.accepting = True
        self.book = OutcomeBook()
        self.durability = durability_for(journal, self.actor_ref)
        self.relay = RelayLink(self.actor_ref)
        self.admission = Admission()
        self.counters = {"accepted": 0, "refused": 0, "settled": 0, "profile_starts": 0}
        self.profiles = ProfileTable(self, self.deps, self.counters)
        self.restart_waiters: list[pykka.ThreadingFuture[None]] = []  # AwaitRestarts answers not given yet
        self.waker = SenderWaker(self, mode=self.deps.config.wake_sender, runner_is_hermes=runner_is_hermes,
                                  root=self.deps.root)
        self.stats = DeliveryStats()
        self.caller_admission = caller_admission
        self.on_failing = on_failing
        self.on_failed = on_failed  # (not pykka's on_failure hook)
        self.notes: list[tuple[dict[str, Any], Delivery | None, float]] = []  # published, not yet told to the Notifier

    # ── turns ask back through us ───────────────────────────────────────────

    def _make_turn(self, delivery: Delivery, lock_fd: int | None = None) -> Turn:
        me = self.actor_ref
        info = self.snapshot.index.get(profile_key(delivery.target))
        if info is None:  # removed since it was accepted: never run a turn that would recreate its home
            raise TurnFailed(outcomes.gone_text(delivery.target), reason=reasons.UNKNOWN)

        def send(target: str, message: str) -> dict[str, Any]:
            request = SendRequest(delivery.target, target, message, hop=delivery.hop + 1, session=delivery.session)
            try:
                return resolve_ack(ask(me, request, timeout=30), timeout=30)
            except ActorGone as exc:  # a Turn kept past its gateway's stop: the Gateway's own error
                raise RuntimeError("gateway is not running") from exc

        return turn_for(delivery, home=info.home if info else None, root=self.deps.root, send=send, lock_fd=lock_fd)

    # ── accepting ───────────────────────────────────────────────────────────

    @handles(RosterChanged)
    def _on_roster(self, msg: RosterChanged) -> None:
        self.snapshot = msg.snapshot
        if self.caller_admission is not None:
            self.caller_admission.snapshot = msg.snapshot

    @handles(AttachRelay)
    def _on_attach_relay(self, msg: AttachRelay) -> None:
        self.relay.attach(msg.ref, reaches_peers=msg.reaches_peers)

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
        if isinstance(admitted, Refusal):
            self.counters["refused"] += 1
            return admitted.as_dict()
        route, delivery = admitted
        if isinstance(route, LocalRoute):
            ack = ack_payload(delivery.delivery_id, route.label, now=delivery.accepted_at,
                              live_owner=route.target.profile in self.profiles.owners)
            return self._accept_local(route.target, delivery, ack)
        if isinstance(route, PeerRoute):  # a peer that is a connection on our relay (Redis), else the CLI transport
            return self.relay.send_to_peer(route, delivery) or self._send_to_peer(route, delivery)
        return self.relay.send(route, delivery)

    @handles(AcceptLocal)
    def _on_accept_local(self, msg: AcceptLocal) -> None:
        """A first-hop local DM its sender's thread admitted (and journaled, in durable mode): acked."""
        delivery = msg.delivery
        if not self.accepting:  # the sender passed the running check just before stop began
            if msg.journaled:  # on disk, never started: like the DMs a stop leaves queued
                logger.info("{} arrived as the gateway stopped; the next start re-offers it", delivery.delivery_id)
                return
            self.book.add(delivery.delivery_id, Pending(delivery, "local"))  # acked: it gets an outcome
            self._settle(outcomes.cancelled(delivery.delivery_id, delivery.label))
            return
        self._queue_accepted(msg.target, delivery, journaled=msg.journaled)

    def _accept_local(
        self, target: ProfileInfo, delivery: Delivery, ack: dict[str, Any]
    ) -> dict[str, Any] | PendingAck:
        """Accept a local DM (journaled first in durable mode); the ack, or the PendingAck on its commit."""
        journaled = self.durability.enabled

        def proceed() -> None:
            self._queue_accepted(target, delivery, journaled=journaled)

        return self.durability.accept(delivery, ack, proceed)

    def _queue_accepted(self, target: ProfileInfo, delivery: Delivery, *, journaled: bool) -> None:
        """A newly accepted local DM (acked, or about to be): queue it and count it."""
        self.deliver_local(target, delivery, journaled=journaled)
        self.counters["accepted"] += 1

    def _send_to_peer(self, route: PeerRoute, delivery: Delivery) -> dict[str, Any]:
        """Hand a ``bot_peers`` DM to the peer transport (off this thread); answers the ack or refusal."""
        if self.peer_submit is None:
            return Refusal(
                f"Peer delivery to {route.label} is not available on this gateway.", "runtime_offline"
            ).as_dict()
        self.book.add(delivery.delivery_id, Pending(delivery, "peer"))
        me = self.actor_ref
        self.peer_submit(delivery, route, lambda outcome: me.tell(OutcomeReady(outcome)))
        self.counters["accepted"] += 1
        return ack_payload(delivery.delivery_id, route.label, now=delivery.accepted_at)

    @handles(RelayAccepted)
    def _on_relay_accepted(self, msg: RelayAccepted) -> None:
        """The relay answered a send: book it, and release the caller's ack."""
        waiting = self.relay.landed(msg.delivery_id)
        if waiting is None:
            return
        delivery, route, future = waiting
        if msg.error is not None:
            future.set_exception(exc_info=(type(msg.error), msg.error, msg.error.__traceback__))
            return
        ack = msg.ack
        if ack is None:  # the relay does not reach this peer: the peer transport carries it
            assert isinstance(route, PeerRoute)
            ack = self._send_to_peer(route, delivery)
        elif "delivery_id" in ack:  # booked under the envelope's id: the relay reports its outcome by it
            if not self.book.has_outcome(ack["delivery_id"]):  # its reply may have beaten this ack here
                self.book.add(ack["delivery_id"], Pending(delivery, "relay"))
            self.counters["accepted"] += 1
        future.set(ack)

    def deliver_local(self, info: ProfileInfo, delivery: Delivery, *, journaled: bool = False) -> None:
        """Book ``delivery`` as pending and queue it on the ProfileActor of ``info`` (started if needed).

        Args:
            info: the target profile.
            delivery: the delivery.
            journaled: the journal records its lifecycle.
        """
        self.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=journaled))
        self.profiles.queue(info, delivery)

    @handles(RoomTurn)
    def _on_room_turn(self, msg: RoomTurn) -> None:
        """A room member's turn: queued on its ProfileActor like a DM; the outcome goes back to the room."""
        delivery = msg.delivery
        key, label = delivery.delivery_id, delivery.label
        info = self.snapshot.index.get(profile_key(delivery.target))
        if self.accepting and info is not None:
            self.book.add(key, Pending(delivery, "room", room_reply=msg.reply))
            self.profiles.queue(info, delivery)
        elif not self.accepting:
            _answer_room(msg.reply, outcomes.cancelled(key, label))
        else:
            gone = f"No local profile named {delivery.target!r} any more."
            _answer_room(msg.reply, outcomes.failed(key, label, gone, "runtime_offline"))

    @handles(ProfileIdle)
    def _on_profile_idle(self, msg: ProfileIdle) -> None:
        self.profiles.idle(msg)

    # ── the relay's side ────────────────────────────────────────────────────

    @handles(RelayDeliver)
    def _on_relay_deliver(self, msg: RelayDeliver) -> None:
        """A drained envelope for one of our profiles (idempotent by envelope id)."""
        env = msg.envelope
        key = env["id"]
        if self.book.state(key) is DeliveryState.PENDING:
            return
        record = self.book.record(key)
        label = f"@{env['target_handle']}"
        if not self.accepting and (record is None or record["reason"] == reasons.CANCELLED):
            # Taken as the stop began, or taken again after the stop cancelled it (a reclaim): cancelled
            # unrun, so the relay puts it back for later (it answers it only if its turn had started).
            self.relay.answer_relay_in(outcomes.cancelled(key, label), msg.reply_connection, stopping=True)
            return
        if record is not None:  # delivered before a crash, reply not written yet: write it again
            self.relay.answer_relay_in(outcome_from_record(key, record), msg.reply_connection)
            return
        info = self.snapshot.index.get(profile_key(str(env["target_profile"])))
        if info is None:
            text = f"No agent '{env['target_profile']}' on this gateway; the message was NOT delivered."
            self.relay.answer_relay_in(outcomes.failed(key, label, text, "unknown"), msg.reply_connection)
            return
        delivery = delivery_from_envelope(env, info, label, now=time.time(), origin=msg.reply_connection)
        too_deep = check_hops(delivery.hop, self.deps.config.max_hops)
        if too_deep is not None:  # a peer with a deeper limit, or a forged hop: our limit holds for our bots too
            self.relay.answer_relay_in(outcomes.failed(key, label, too_deep.error, too_deep.reason),
                                       msg.reply_connection)
            return
        self.book.add(key, Pending(delivery, "relay-in", msg.reply_connection))
        self.profiles.queue(info, delivery)

    @handles(RelayResumed)
    def _on_relay_resumed(self, msg: RelayResumed) -> None:
        for entry in msg.entries:
            key = entry.envelope_id
            if self.book.state(key) is DeliveryState.UNKNOWN:  # its sender (when recorded) is woken by the outcome
                placeholder = Delivery(key, entry.sender, entry.sender_handle, "", "", "", label=entry.label,
                                       hop=entry.hop, origin="recovered", wake=entry.wake)
                self.book.add(key, Pending(placeholder, "relay"))

    # ── outcomes ────────────────────────────────────────────────────────────

    @handles(OutcomeReady)
    def _on_outcome(self, msg: OutcomeReady) -> None:
        self._settle(msg.outcome)

    @handles(RelayedOutcome)
    def _on_relayed_outcome(self, msg: RelayedOutcome) -> None:
        """Our envelope settled: the relay clears its record once the outcome is kept (see ``_settle``)."""
        key = msg.outcome.delivery_id
        entry = self.book.entry(key)
        self._settle(msg.outcome)
        if entry is None or entry.route != "relay":
            # Settled before (in this run, or in a previous one whose journal has it) or booked by nobody:
            # nothing more to keep, so nothing for the relay to resume at the next start.
            self.relay.forget(key)

    @handles(OutcomesReady)
    def _on_outcomes(self, msg: OutcomesReady) -> None:
        for outcome in msg.outcomes:
            self._settle(outcome)

    def _settle(self, outcome: Outcome) -> None:
        key = outcome.delivery_id
        if self.book.has_outcome(key):
            logger.debug("second outcome for {} dropped (first one wins)", key)
            return
        # Left pending until it is journaling or published: should anything below fail, the DM is
        # still held, and the failed Dispatcher settles it (on_crash) instead of losing it.
        entry = self.book.entry(key)
        if entry is not None and entry.route == "room":  # never journaled here: the room file records it
            self._publish(outcome)
            return
        self.waker.settling(key, entry)
        if entry is not None and entry.route == "relay-in":
            # The sender is on another connection: the reply goes back through the relay.
            log_settled(entry.delivery, outcome)
            self.relay.answer_relay_in(outcome, entry.reply_connection, stopping=not self.accepting)
            self.book.settle(key, outcome.as_dict())  # a stopping gateway waits for its running turns
            return
        if entry is not None and entry.journaled and self.durability.journal_outcome(outcome):
            # published once durable (JournalDurable); the delivery is kept for the subscribers' details
            self.book.journaling(key, outcome.as_dict(), entry.delivery)
            return
        if entry is not None and entry.route in ("relay", "peer"):
            # Nothing on the root keeps the outcome of a DM sent to another machine over Redis (nor of a peer's;
            # the file relay's replies/ are swept after 6 h): the journal keeps it, as a local DM's, so
            # `hermes-actors outcome` and wait_outcome still know it after this host restarted. Published
            # first: the wake it starts is journaled before it, so a journal that has the outcome has its
            # wake too; the relay keeps the envelope's record until both are on disk (ForgetSent).
            self._publish(outcome)
            forget = ("forget", key) if entry.route == "relay" else None
            self.durability.finished(outcome, then=forget)
            if forget is not None and not self.durability.enabled:
                self.relay.forget(key)
            return
        self._publish(outcome)

    def _publish(self, outcome: Outcome, answers: Answers | None = None) -> None:
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
            _answer_room(entry.room_reply, outcome)
            return
        if self.waker.after_publish(outcome, entry):  # a wake turn's own outcome is nobody's DM outcome
            return
        self.counters["settled"] += 1
        self.stats.published(delivery, outcome)
        self.notes.append((record, delivery, time.time()))

    def after_message(self, *, asked: bool) -> None:
        """Hand on what the handlers gathered once the mailbox is drained (or a batch is full).

        The deliveries go to their ProfileActors (``ProfileTable.flush``) and the published
        outcomes to the Notifier: one message per burst instead of one per DM. An ask flushes
        them too, so whoever waits for its answer finds them told before it.
        """
        if self.restart_waiters:  # a crash report may have just been handled
            self._answer_restart_waiters()
        if not (self.notes or self.profiles.gathered):
            return
        drained = asked or self.mailbox_size() == 0
        if self.profiles.gathered and (drained or self.profiles.gathered_count >= DELIVER_BATCH):
            self.profiles.flush()
        if self.notes and (drained or len(self.notes) >= NOTIFY_BATCH):
            notes, self.notes = tuple(self.notes), []
            tell(self.notifier, NotifyOutcomes(notes))

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
        """One group commit landed: release its acks, publish its outcomes.

        The ``wait_outcome`` callers are answered last: by then the ``delivered`` records
        are appended (and, when no commit runs, written by this thread), so a caller that
        goes on to send finds the journal's write turn free instead of racing this thread
        for it.
        """
        answers: Answers = []
        try:
            self._land(msg, answers)
        finally:  # whatever happened, the outcomes settled so far are answered
            answer(answers)

    def _land(self, msg: JournalDurable, answers: Answers) -> None:
        """Release the acks of one commit and publish its outcomes, their waiters' answers into ``answers``."""
        for kind, value in msg.tokens:
            if kind == "accepted":
                self.durability.accepted_landed(value, msg.error)
                continue
            if kind == "forget":  # a relayed DM's outcome and its wake are on disk: its relay record can go
                if msg.error is None:
                    self.relay.forget(value)
                else:  # kept: the next start settles the DM from the relay's record again
                    logger.error("outcome of {} could not be journaled ({}); the relay keeps its record",
                                 value, msg.error)
                continue
            if msg.error is not None:
                logger.error("outcome of {} could not be journaled ({}); publishing it anyway",
                             value.delivery_id, msg.error)
            self._publish(value, answers)
            crashpoint("after-outcome-before-delivered")
            self.durability.delivered(value.delivery_id)

    @handles(AdoptJournal)
    def _on_adopt_journal(self, msg: AdoptJournal) -> None:
        """Before the relay resumes: learn the previous run's settled outcomes and wakes from the journal.

        The relay settles its resumed sends from its files at once: an outcome the journal already has is
        then a second one (dropped), and a wake the journal holds is not started again. Re-offers and
        re-publishes wait for ``Recover``, once the relay can carry what re-offered turns send.
        """
        states, _unreadable = readable_states(msg.states)  # Recover says which, once
        self.waker.adopt(states)
        self.book.remember(known_outcomes(states))

    @handles(Recover)
    def _on_recover(self, msg: Recover) -> dict[str, int]:
        """Act on the journal of a previous run (see ``recovery.plan_recovery``)."""
        states, unreadable = readable_states(msg.states)
        if unreadable:
            logger.warning("recovery: {} journaled DM(s) skipped, their 'accepted' record cannot be read "
                           "(a corrupt or foreign line in bot_relay/journal/): {}",
                           len(unreadable), ", ".join(map(repr, unreadable)))  # repr: an id may hold a newline
        self.waker.adopt(states)
        index = self.snapshot.index
        plan = plan_recovery(states, idempotent_runner=msg.idempotent_runner,
                             live_record=lambda delivery: live_record(index, delivery))
        self.book.remember(plan.known)
        for outcome in plan.redeliver:
            if self.book.has_outcome(outcome.delivery_id):
                # the relay, resumed before this, already settled it (a relayed DM's reply still in its files):
                # published once in this run, first one wins
                self.durability.delivered(outcome.delivery_id)
                continue
            self.durability.note({"t": "finished", "id": outcome.delivery_id, "o": outcome.as_dict()})
            self._publish(outcome)
            self.durability.delivered(outcome.delivery_id)
        for delivery, outcome in plan.ambiguous:
            self.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=True))
            self._settle(outcome)
        for delivery in plan.reoffer:
            info = index.get(profile_key(delivery.target))
            if info is not None:
                self.deliver_local(info, delivery, journaled=True)
                continue
            self.book.add(delivery.delivery_id, Pending(delivery, "local", journaled=True))
            text = outcomes.gone_text(delivery.target)
            self._settle(outcomes.failed(delivery.delivery_id, delivery.label, text, "unknown"))
        counts = plan.counts()
        if unreadable:
            counts["unreadable"] = len(unreadable)
        if any(counts.values()):
            logger.info(
                "recovery: {reoffered} re-offered, {ambiguous} ambiguous, {redelivered} outcomes re-delivered, "
                "{known} settled outcomes known",
                **counts,
            )
        return counts

    # ── shutdown ────────────────────────────────────────────────────────────

    @handles(ShutdownProfiles)
    def _on_shutdown(self, msg: ShutdownProfiles) -> list[str]:
        """Cancel what is queued everywhere; answer the ids of turns still running."""
        self.accepting = False
        running = self.profiles.wind_down(keep_journaled=self.durability.enabled)
        running += [k for k, p in self.book.pending() if p.route == "peer"]
        return running

    @handles(AwaitRestarts)
    def _on_await_restarts(self, msg: AwaitRestarts) -> pykka.ThreadingFuture[None]:
        """A future set once every crashed ProfileActor has reported and been restarted (or given up)."""
        future: pykka.ThreadingFuture[None] = pykka.ThreadingFuture()
        self.restart_waiters.append(future)
        self._answer_restart_waiters()
        return future

    def _answer_restart_waiters(self, *, stopping: bool = False) -> None:
        """Answer the AwaitRestarts futures once no ProfileActor is down (or the Dispatcher stops)."""
        if self.restart_waiters and (stopping or not any(self.child_down(name) for name in self.children)):
            waiters, self.restart_waiters = self.restart_waiters, []
            for future in waiters:
                future.set(None)

    @handles(FinalizePending)
    def _on_finalize(self, msg: FinalizePending) -> int:
        """Settle what is still pending: ambiguous if it may have run."""
        count = 0
        for key, entry in self.book.pending():
            if entry.route == "relay":
                continue  # our envelopes stay in outbox/: the next start resumes waiting for replies
            if entry.journaled and key not in msg.running:
                continue  # never started: stays journaled and is re-offered by the next start
            outcome = outcomes.ambiguous(key, entry.delivery.label, msg.why)
            # A peer DM's outcome is journaled as it arrives (see _settle): one still under way is, too.
            remember = entry.journaled or entry.route == "peer"
            if remember:  # shutting down: write it now rather than through the async group commit
                self.durability.write_now({"t": "finished", "id": key, "o": outcome.as_dict()})
            if entry.route == "relay-in":  # its sender waits on another connection: tell it too
                self.relay.answer_relay_in(outcome, entry.reply_connection)
            self._publish(outcome)
            if remember:  # published now: the next start must not report it a second time
                self.durability.delivered(key)
            count += 1
        return count

    @handles(ExportOutcomes)
    def _on_export(self, msg: ExportOutcomes) -> dict[str, dict[str, Any]]:
        return self.book.export()

    @handles(StatsRequest)
    def _on_stats(self, msg: StatsRequest) -> dict[str, Any]:
        pending = self.book.pending()
        return {
            **self.counters,
            "pending": len(pending) - self.waker.pending_wakes(pending),
            "active_profiles": self.profiles.active(),
            "deliveries": self.stats.view(pending, self.profiles.owners),
        }

    def on_restart(self, name: str, failure: ChildFailed) -> ChildFailed:
        """A ProfileActor restarts after a crash: during a stop, what it held is cancelled here, not run."""
        restart, cancel = self.profiles.restarting(name, failure)
        for delivery in cancel:
            self._settle(outcomes.cancelled(delivery.delivery_id, delivery.label))
        return restart

    def on_child_restarted(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """A crashed ProfileActor is back, with what it held: the deliveries that waited for it follow."""
        self.profiles.flush()

    def on_held_handed_over(self, name: str, messages: tuple[Any, ...]) -> None:
        """A fresh ProfileActor takes what a crashed one never did: its Delivers count as sent to it."""
        self.profiles.count_sent(name, messages)

    def on_stale_failure(self, name: str, ref: pykka.ActorRef[Any], failure: ChildFailed) -> None:
        """A ProfileActor crashed after a newer one was started: the newer one takes its queue and mailbox."""
        super().on_stale_failure(name, ref, self.profiles.taken_over(name, failure))

    def on_escalation(self, name: str, error: BaseException | None) -> None:
        """A ProfileActor keeps crashing: fail what it held, keep the gateway up.

        Its running turn was settled ``ambiguous`` by its crash report (which comes first),
        so every delivery still pending for it never started: queued, in its mailbox, or
        held here while it was down. They fail as NOT delivered, relayed-in ones too (their
        sender is answered through the relay).
        """
        text = (f"The target's actor failed repeatedly ({error!r}) before this message's turn started; "
                "the message was NOT delivered.")
        for key, entry in self.book.pending():
            if entry.route in ("local", "room", "relay-in") and entry.delivery.target == name:
                self._settle(outcomes.failed(key, entry.delivery.label, text, "unknown"))
        self.profiles.forget(name)

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
        fail with ``ActorDeadError`` (the default); then the DMs acked from memory only get their
        outcome, the acks waiting for a journal commit are answered, and so are the
        ``wait_outcome`` callers. Each step is best effort: the state that failed is the one read.
        """
        super().on_crash(error, pending, salvage)
        running = [key for key, entry in self.book.pending() if entry.route in ("local", "room")]
        reports = [message for message in pending if isinstance(message, JournalDurable)]
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("settle the DMs it held in memory", lambda: self._settle_after_failure(error, pending)),
            ("answer the acks waiting for their journal commit",
             lambda: self.durability.settle_parked(reports, timeout=_FAILED_DRAIN_SECONDS)),
            ("answer the outcome waiters", lambda: self._answer_waiters_after_failure(pending)),
        ]
        for what, step in steps:
            try:
                step()
            except Exception:
                logger.exception("the failed Dispatcher could not {}", what)
        final: dict[str, dict[str, Any]] = {}
        try:
            final = self.book.export()
        except Exception:
            logger.exception("the failed Dispatcher could not export its settled outcomes")
        if self.on_failed is not None:
            try:
                self.on_failed(error, final, running)
            except Exception:
                logger.exception("the gateway's on_failure callback failed")

    def _answer_waiters_after_failure(self, mailbox: list[Any]) -> None:
        """``wait_outcome`` callers: the outcome when it is known now, else 'no outcome yet' at once."""
        for message in mailbox:
            if isinstance(message, AwaitOutcome):
                self._on_await(message)  # answered now, or registered as a waiter below
        self.book.fail_waiters(lambda key: TimeoutError(
            f"delivery {key} has no outcome yet: the gateway's dispatcher failed; the next start on the root "
            "settles it (journaled DMs are re-offered)"))

    def _settle_after_failure(self, error: BaseException | None, mailbox: list[Any]) -> None:
        """Give each DM acked from memory only its outcome (``outcomes_after_failure``): waiters, rooms, subscribers."""
        held = [HeldDelivery(key, entry.delivery.label, entry.route, entry.journaled, started=True)
                for key, entry in self.book.pending()]
        arrived: dict[str, Outcome] = {}
        rooms: dict[str, Callable[[Outcome], None]] = {}
        untaken: dict[str, Delivery] = {}  # acked DMs still in the mailbox (the book never had them)
        for message in mailbox:
            if isinstance(message, AcceptLocal):
                delivery = untaken[message.delivery.delivery_id] = message.delivery
                held.append(HeldDelivery(delivery.delivery_id, delivery.label, "local", message.journaled,
                                         started=False))
            elif isinstance(message, RoomTurn):
                delivery = message.delivery
                rooms[delivery.delivery_id] = message.reply
                held.append(HeldDelivery(delivery.delivery_id, delivery.label, "room", False, started=False))
            elif isinstance(message, OutcomeReady | RelayedOutcome | OutcomesReady):
                # (a relayed one's record stays with its relay: the next start settles it again)
                many = message.outcomes if isinstance(message, OutcomesReady) else (message.outcome,)
                for outcome in many:
                    arrived.setdefault(outcome.delivery_id, outcome)
        settled = outcomes_after_failure(held, arrived, failure_text(error))
        notes: list[tuple[dict[str, Any], Delivery | None, float]] = []
        for outcome in settled:
            key = outcome.delivery_id
            known: Delivery | None = self.book.delivery(key) or untaken.get(key)
            entry = self.book.settle(key, outcome.as_dict())
            room_reply = entry.room_reply if entry is not None else rooms.get(key)
            if room_reply is not None or (entry is not None and entry.route == "room"):
                _answer_room(room_reply, outcome)
                continue
            notes.append((outcome.as_dict(), known, time.time()))
        if settled:
            logger.error("the Dispatcher failed: {} DM(s) held in memory only were settled (ambiguous, or "
                         "failed when they never started)", len(settled))
        if notes:
            tell(self.notifier, NotifyOutcomes(tuple(notes)))

    def on_stop(self) -> None:
        self.after_message(asked=True)
        self.relay.abandon()
        self.profiles.stop_all()
        self._answer_restart_waiters(stopping=True)  # stopping (or crashed): nobody will restart anything now


def _answer_room(reply: Callable[[Outcome], None] | None, outcome: Outcome) -> None:
    """Hand a member turn's outcome back to its room (our own tell: it must never crash the Dispatcher)."""
    try:
        if reply is not None:
            reply(outcome)
    except Exception:
        logger.exception("could not hand the outcome of room turn {} back", outcome.delivery_id)
