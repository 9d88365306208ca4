"""DispatcherActor: the one entry point of every DM.

It validates (pure ``targets.plan_send``), applies the conversation guard,
issues the delivery id, routes to the target's ProfileActor (started on first
use, stopped when idle, supervised), to the relay or to a peer, and owns the
table of pending and settled outcomes that ``wait_outcome`` reads.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, Link, RestartPolicy, ask, handles, tell
from hermes_actors.core import outcomes
from hermes_actors.core.acks import (
    ack_payload,
    resolve_ack,
)
from hermes_actors.core.guard import check_hops, check_pair_rate, pair_key
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.names import profile_key
from hermes_actors.core.outcomes import delivery_details
from hermes_actors.core.targets import LocalRoute, PeerRoute, Refusal, RelayRoute, plan_send
from hermes_actors.errors import StoreError
from hermes_actors.local.dispatch_base import Pending
from hermes_actors.local.dispatch_durable import DurableDispatch
from hermes_actors.local.dispatch_relay import RelayDispatch
from hermes_actors.local.profile_actor import ProfileActor, ProfileDeps
from hermes_actors.local.wake_hook import SenderWaker
from hermes_actors.messages import (
    AttachOwner,
    AttachRelay,
    AwaitOutcome,
    Deliver,
    Delivery,
    DetachOwner,
    ExportOutcomes,
    FinalizePending,
    JournalDurable,
    Notify,
    Outcome,
    OutcomeReady,
    PendingAck,
    ProfileIdle,
    ProfileInfo,
    RosterChanged,
    RosterSnapshot,
    SendRequest,
    ShutdownProfiles,
    StatsRequest,
    StopAccepting,
    StopProfile,
    Turn,
    WindDown,
)
from hermes_actors.ops.delivery_log import delivery_line
from hermes_actors.store.journal import Journal

__all__ = ["DispatcherActor"]

SETTLED_KEEP = 100_000  # settled outcomes remembered for wait_outcome (oldest dropped first; bounds memory)
IN_FLIGHT_ROWS = 200  # in-flight deliveries listed by stats() (the oldest; all are counted per profile)


class DispatcherActor(DurableDispatch, RelayDispatch):
    """Accepts DMs and owns their outcomes.

    Args:
        snapshot: the roster at start (then kept current by RosterChanged).
        deps_factory: builds the ProfileActors' shared deps given this actor's ref
            and the turn factory.
        notifier: the Notifier actor (subscriber callbacks).
        peer_submit: runs a peer delivery off-actor; called with (delivery, route, report).
        relay: the RelayActor ref, when the file relay runs.
        runner_is_hermes: turns run on the real Hermes (``bot_mode.wake_sender: auto`` wakes senders then).
    """

    def __init__(
        self,
        snapshot: RosterSnapshot,
        *,
        deps_factory: Callable[[pykka.ActorRef[Any], Callable[[Delivery], Turn]], ProfileDeps],
        notifier: pykka.ActorRef[Any],
        peer_submit: Callable[[Delivery, PeerRoute, Callable[[Outcome], None]], None] | None = None,
        relay: pykka.ActorRef[Any] | None = None,
        policy: RestartPolicy | None = None,
        journal: Journal | None = None,
        runner_is_hermes: bool = False,
    ) -> None:
        super().__init__(policy=policy or RestartPolicy(max_restarts=5, within_seconds=10.0))
        self.snapshot = snapshot
        self.notifier = notifier
        self.peer_submit = peer_submit
        self.relay = relay
        self.deps = deps_factory(self.actor_ref, self._make_turn)
        self.accepting = True
        self.pending: dict[str, Pending] = {}
        self.settled: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.waiters: dict[str, list[pykka.ThreadingFuture[dict[str, Any]]]] = {}
        self.sent: dict[str, int] = {}  # Deliver messages sent to each live ProfileActor
        self.pairs: dict[tuple[str, str], deque[float]] = {}
        self.counters = {"accepted": 0, "refused": 0, "settled": 0, "profile_starts": 0}
        self.by_outcome: Counter[tuple[str, str]] = Counter()  # what "settled" counts, by (status, reason)
        self.journal = journal
        if journal is not None:  # one message per group commit, not one per record
            me = self.actor_ref
            journal.listener = lambda tokens, error: tell(me, JournalDurable(tuple(tokens), error))
        self.owners: dict[str, Any] = {}  # profile → attached live owner
        self.journaled: set[str] = set()  # ids whose lifecycle the journal records
        self.finishing: dict[str, Delivery] = {}  # settled, outcome being journaled: kept for subscribers' details
        self.awaiting_durable: dict[str, tuple[Delivery, ProfileInfo, pykka.ThreadingFuture[Any], dict[str, Any]]] = {}
        self.waker = SenderWaker(self, mode=self.deps.config.wake_sender, runner_is_hermes=runner_is_hermes)

    # ── turns ask back through us ───────────────────────────────────────────

    def _make_turn(self, delivery: Delivery) -> Turn:
        me = self.actor_ref
        info = self.snapshot.index.get(delivery.target.lower())

        def send(target: str, message: str) -> dict[str, Any]:
            request = SendRequest(delivery.target, target, message, hop=delivery.hop + 1)
            return resolve_ack(ask(me, request, timeout=30), timeout=30)

        return Turn(
            profile=delivery.target,
            content=delivery.content,
            delivery_id=delivery.delivery_id,
            handle=delivery.target_handle,
            home=info.home if info else None,
            root=self.deps.root,
            sender=delivery.sender,
            sender_handle=delivery.sender_handle,
            hop=delivery.hop,
            author=dict(delivery.author),
            _send=send,
        )

    # ── accepting ───────────────────────────────────────────────────────────

    @handles(RosterChanged)
    def _on_roster(self, msg: RosterChanged) -> None:
        self.snapshot = msg.snapshot

    @handles(AttachRelay)
    def _on_attach_relay(self, msg: AttachRelay) -> None:
        self.relay = msg.ref

    @handles(AttachOwner)
    def _on_attach_owner(self, msg: AttachOwner) -> None:
        info = self._local(msg.profile)
        self.owners[info.profile] = msg.owner
        self._profile_ref(info).tell(AttachOwner(info.profile, msg.owner))

    @handles(DetachOwner)
    def _on_detach_owner(self, msg: DetachOwner) -> None:
        info = self._local(msg.profile)
        self.owners.pop(info.profile, None)
        ref = self.child_ref(info.profile)
        if ref is not None and ref.is_alive():
            ref.tell(DetachOwner(info.profile))

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
        route = plan_send(
            self.snapshot,
            sender=msg.sender,
            target=msg.target,
            message=msg.message,
            session=msg.session,
            now=time.time(),
        )
        if isinstance(route, Refusal):
            self.counters["refused"] += 1
            return route.as_dict()
        hop = max(1, msg.hop)
        refusal = check_hops(hop, self.deps.config.max_hops)
        target_key = route.target.profile if isinstance(route, LocalRoute) else route.label
        pair = pair_key(route.sender.profile, target_key)
        history = self.pairs.setdefault(pair, deque())
        now_mono = time.monotonic()
        refusal = refusal or check_pair_rate(history, now_mono, self.deps.config.max_pair_rate, hop)
        if refusal is not None:
            self.counters["refused"] += 1
            return refusal.as_dict()
        if hop >= 2:
            history.append(now_mono)
        elif not history:
            del self.pairs[pair]
        now = time.time()
        delivery = Delivery(
            delivery_id=new_delivery_id(),
            sender=route.sender.profile,
            sender_handle=route.sender.handle,
            target=route.target.profile if isinstance(route, LocalRoute) else "",
            target_handle=route.target.handle if isinstance(route, LocalRoute | RelayRoute) else "",
            content=route.content,
            author=route.author,
            hop=hop,
            accepted_at=now,
            label=route.label,
        )
        if isinstance(route, LocalRoute):
            ack = ack_payload(delivery.delivery_id, route.label, now=now)
            if self.journal is not None:
                return self._accept_durably(delivery, route.target, ack)
            self._deliver_local(route.target, delivery)
            self.counters["accepted"] += 1
            return ack
        if isinstance(route, PeerRoute):
            relayed = self._peer_via_relay(route, delivery)  # a peer that is a connection on our relay (Redis)
            if relayed is not None:
                return relayed
            if self.peer_submit is None:
                return Refusal(
                    f"Peer delivery to {route.label} is not available on this gateway.", "runtime_offline"
                ).as_dict()
            self.pending[delivery.delivery_id] = Pending(delivery, "peer")
            me = self.actor_ref
            self.peer_submit(delivery, route, lambda outcome: me.tell(OutcomeReady(outcome)))
        else:
            return self._deliver_relay(route, delivery)
        self.counters["accepted"] += 1
        return ack_payload(delivery.delivery_id, route.label, now=now)

    def _profile_ref(self, info: ProfileInfo) -> pykka.ActorRef[Any]:
        ref = self.child_ref(info.profile)
        if ref is not None and ref.is_alive():
            return ref
        deps = self.deps

        def factory(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
            # Called here and by the supervisor on a crash restart (both in this actor's thread):
            # every instance starts with the profile's current live owner, before its first message.
            return ProfileActor.start(info, deps, link=link, salvage=salvage, owner=self.owners.get(info.profile))

        self.counters["profile_starts"] += 1
        self.sent[info.profile] = 0
        return self.start_child(info.profile, factory)

    def _deliver_local(self, info: ProfileInfo, delivery: Delivery, *, register: bool = True) -> None:
        if register:
            self.pending[delivery.delivery_id] = Pending(delivery, "local")
        ref = self._profile_ref(info)
        try:
            ref.tell(Deliver(delivery))
        except pykka.ActorDeadError:  # it died between the check and the tell: start a fresh one
            self.forget_child(info.profile)
            ref = self._profile_ref(info)
            ref.tell(Deliver(delivery))
        self.sent[info.profile] = self.sent.get(info.profile, 0) + 1

    @handles(ProfileIdle)
    def _on_profile_idle(self, msg: ProfileIdle) -> None:
        if self.child_ref(msg.profile) is not msg.ref and self.child_ref(msg.profile) != msg.ref:
            return
        if self.sent.get(msg.profile, 0) != msg.handled:
            return  # a Deliver is still in flight to it: it stays
        self.forget_child(msg.profile)
        self.sent.pop(msg.profile, None)
        msg.ref.tell(StopProfile())

    # ── outcomes ────────────────────────────────────────────────────────────

    @handles(OutcomeReady)
    def _on_outcome(self, msg: OutcomeReady) -> None:
        self._settle(msg.outcome)

    def _settle(self, outcome: Outcome) -> None:
        key = outcome.delivery_id
        if key in self.settled:
            logger.debug("second outcome for {} dropped (first one wins)", key)
            return
        entry = self.pending.pop(key, None)
        self.waker.settling(key, entry)
        if entry is not None and entry.route == "relay-in":
            # The sender is on another connection: the reply goes back through the relay files.
            self.settled[key] = outcome.as_dict()
            self._log_settled(entry.delivery, outcome)
            self._answer_relay_in(outcome, entry.reply_connection, entry.answer)
            for future in self.waiters.pop(key, ()):  # a stopping gateway waits for its running turns
                future.set(self.settled[key])
            return
        if self.journal is not None and key in self.journaled:
            if entry is not None:
                self.finishing[key] = entry.delivery
            try:
                self.journal.append({"t": "finished", "id": key, "o": outcome.as_dict()}, token=("finished", outcome))
                self.settled[key] = outcome.as_dict()  # a second outcome is dropped from now on
                return
            except StoreError as exc:
                logger.error("journal append failed for the outcome of {}: {}", key, exc)
        self._publish(outcome)

    def _publish(self, outcome: Outcome) -> None:
        """Make an outcome visible: wait_outcome answers, subscribers are called."""
        key = outcome.delivery_id
        entry = self.pending.pop(key, None)
        finished = self.finishing.pop(key, None)  # settled before its outcome was journaled
        self.journaled.discard(key)
        record = outcome.as_dict()
        self.settled[key] = record
        if len(self.settled) > SETTLED_KEEP:
            self.settled.popitem(last=False)
        for future in self.waiters.pop(key, ()):
            future.set(record)
        delivery = entry.delivery if entry is not None else self.waker.sources.get(key)  # before after_publish
        if self.waker.after_publish(outcome, entry):  # a wake turn's own outcome is nobody's DM outcome
            return
        self.counters["settled"] += 1
        delivery = delivery or finished  # a durable DM's entry left pending before its outcome was journaled
        self.by_outcome[(outcome.status, outcome.reason)] += 1
        self._log_settled(delivery, outcome)
        self.notifier.tell(Notify(record, delivery_details(delivery, time.time())))

    @staticmethod
    def _log_settled(delivery: Delivery | None, outcome: Outcome) -> None:
        """Log a DM's one INFO line (never its text)."""
        latency = time.time() - delivery.accepted_at if delivery is not None and delivery.accepted_at else None
        sender = f"@{delivery.sender_handle or delivery.sender}" if delivery is not None else ""
        logger.info("{}", delivery_line(outcome.delivery_id, sender, outcome.from_, outcome.status,
                                        outcome.reason, latency))

    @handles(AwaitOutcome)
    def _on_await(self, msg: AwaitOutcome) -> pykka.ThreadingFuture[dict[str, Any]]:
        future: pykka.ThreadingFuture[dict[str, Any]] = pykka.ThreadingFuture()
        record = self.settled.get(msg.delivery_id)
        if record is not None and msg.delivery_id in self.journaled:
            self.waiters.setdefault(msg.delivery_id, []).append(future)  # its outcome is being journaled
        elif record is not None:
            future.set(record)
        elif msg.delivery_id in self.pending:
            self.waiters.setdefault(msg.delivery_id, []).append(future)
        else:
            raise KeyError(
                f"unknown delivery id {msg.delivery_id!r}: this gateway did not issue it and no journal holds it"
            )
        return future

    # ── shutdown ────────────────────────────────────────────────────────────

    @handles(ShutdownProfiles)
    def _on_shutdown(self, msg: ShutdownProfiles) -> list[str]:
        """Cancel what is queued everywhere; answer the ids of turns still running."""
        self.accepting = False
        running: list[str] = []
        for name in list(self.children):
            ref = self.child_ref(name)
            if ref is None:
                continue
            try:
                current = ask(ref, WindDown(msg.timeout, keep_journaled=self.journal is not None), timeout=10)
            except (ActorGone, AskTimeout):
                continue
            if current:
                running.append(current)
        running += [k for k, p in self.pending.items() if p.route == "peer"]
        return running

    @handles(FinalizePending)
    def _on_finalize(self, msg: FinalizePending) -> int:
        """Settle what is still pending: ambiguous if it may have run."""
        count = 0
        for key, entry in list(self.pending.items()):
            if entry.route == "relay":
                continue  # our envelopes stay in outbox/: the next start resumes waiting for replies
            if key in self.journaled and key not in msg.running:
                continue  # never started: stays journaled and is re-offered by the next start
            outcome = outcomes.ambiguous(key, entry.delivery.label, msg.why)
            journal = self.journal if key in self.journaled else None
            journaled = journal is not None
            if journal is not None:
                try:  # shutting down: write it now rather than through the async group commit
                    journal.append_durably({"t": "finished", "id": key, "o": outcome.as_dict()})
                except StoreError as exc:
                    logger.error("could not journal the outcome of {}: {}", key, exc)
            if entry.route == "relay-in":  # its sender waits on another connection: tell it too
                self._answer_relay_in(outcome, entry.reply_connection, entry.answer)
            self._publish(outcome)
            if journaled:  # published now: the next start must not report it a second time
                self._journal_quietly({"t": "delivered", "id": key})
            count += 1
        return count

    @handles(ExportOutcomes)
    def _on_export(self, msg: ExportOutcomes) -> dict[str, dict[str, Any]]:
        return dict(self.settled)

    @handles(StatsRequest)
    def _on_stats(self, msg: StatsRequest) -> dict[str, Any]:
        return {
            **self.counters,
            "pending": len(self.pending),
            "active_profiles": sum(1 for c in self.children.values() if c.ref.is_alive()),
            "deliveries": self._deliveries_view(),
        }

    def _deliveries_view(self) -> dict[str, Any]:
        """What ``hermes-actors status`` shows of the DMs: the oldest in flight, counts per profile, outcomes."""
        by_outcome: dict[str, dict[str, int]] = {}
        for (status, reason), count in self.by_outcome.items():
            by_outcome.setdefault(status, {})[reason] = count
        return {
            "in_flight": [
                {"delivery_id": key, "sender": p.delivery.sender, "target": p.delivery.label,
                 "profile": p.delivery.target, "route": p.route, "accepted_at": p.delivery.accepted_at}
                for key, p in itertools.islice(self.pending.items(), IN_FLIGHT_ROWS)
            ],
            "per_profile": dict(Counter(p.delivery.target for p in self.pending.values() if p.delivery.target)),
            "live_owners": sorted(self.owners),
            "by_outcome": by_outcome,
        }

    def on_escalation(self, name: str, error: BaseException | None) -> None:
        """A ProfileActor keeps crashing: fail what it held, keep the gateway up."""
        for key, entry in list(self.pending.items()):
            if entry.route == "local" and entry.delivery.target == name:
                self._settle(
                    outcomes.ambiguous(key, entry.delivery.label, f"The target's actor failed repeatedly ({error!r}).")
                )
        self.sent.pop(name, None)

    def on_stop(self) -> None:
        for name in list(self.children):
            ref = self.child_ref(name)
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=5)
                except pykka.Timeout:
                    logger.warning("ProfileActor {} did not stop in time", name)
