"""The Dispatcher's table of ProfileActors: started on first use, stopped when idle, supervised.

:class:`ProfileTable` is owned by the DispatcherActor and used on its thread.
It starts each ProfileActor as a supervised child of the Dispatcher (with the
profile's current live owner), counts the ``Deliver`` messages sent to it so
an idle one is stopped only when nothing is in flight to it, and winds them
all down at stop.

Deliveries are handed over in batches: :meth:`ProfileTable.queue` gathers them per
profile and :meth:`ProfileTable.flush` sends one ``Deliver`` per profile. The
Dispatcher flushes after every message its mailbox has nothing behind (and after
an ask, or every ``DELIVER_BATCH`` deliveries), so a quiet gateway hands each DM
over at once while a busy one wakes each ProfileActor once per burst. Every other
message to a ProfileActor flushes first: it never overtakes a delivery queued before it.
Deliveries for a ProfileActor that crashed wait here for its restart, which hands the new
instance what the crashed one held first: a profile's turns keep their order across a crash.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, ChildFailed, Link, Reply, SupervisorActor, ask_later, tell
from hermes_actors.local.profile_actor import ProfileActor
from hermes_actors.local.profile_deps import ProfileDeps, ProfileSalvage
from hermes_actors.local.profile_outcomes import kept_at_stop
from hermes_actors.messages import (
    AttachOwner,
    Deliver,
    Delivery,
    DetachOwner,
    ProfileIdle,
    ProfileInfo,
    ResumeTurns,
    StopProfile,
    TurnFinished,
    WindDown,
)

__all__ = ["DELIVER_BATCH", "ProfileTable"]

DELIVER_BATCH = 256  # deliveries gathered at most before they are handed over, however busy the Dispatcher
_ANSWER_FLOOR = 0.05  # seconds the ProfileActors get, together, to answer the stop's WindDown, however late in the stop


class ProfileTable:
    """The ProfileActors of one Dispatcher, keyed by folder id.

    Args:
        supervisor: the Dispatcher (their supervisor; its children are the table's actors).
        deps: what every ProfileActor shares.
        counters: the Dispatcher's counters (``profile_starts`` is counted here).
    """

    def __init__(self, supervisor: SupervisorActor, deps: ProfileDeps, counters: dict[str, int]) -> None:
        self.supervisor = supervisor
        self.deps = deps
        self.counters = counters
        self.sent: dict[str, int] = {}  # Deliver messages sent to each live ProfileActor
        self.owners: dict[str, Any] = {}  # profile → attached live owner
        self.gathered: dict[str, tuple[ProfileInfo, list[Delivery]]] = {}  # profile → deliveries not yet sent
        self.gathered_count = 0
        # Set once the gateway stops: every ProfileActor started after that (a crash restart, whose
        # predecessor missed the WindDown) starts winding down instead of running what it salvaged.
        self.winding: WindDown | None = None
        self.unanswered: set[str] = set()  # ProfileActors that did not answer the WindDown in time
        # profile → live owner results that came back while its ProfileActor was down (OwnerTurnReturned)
        self.returned: dict[str, list[TurnFinished]] = {}

    def ref(self, info: ProfileInfo) -> pykka.ActorRef[Any]:
        """The running ProfileActor of ``info``, started now when there is none."""
        sup = self.supervisor
        ref = sup.child_ref(info.profile)
        if ref is not None and ref.is_alive():
            return ref
        deps = self.deps

        def factory(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
            # Called here and by the supervisor on a crash restart (both in the Dispatcher's thread):
            # every instance starts with the profile's current live owner, before its first message.
            return ProfileActor.start(info, deps, link=link, salvage=salvage, owner=self.owners.get(info.profile),
                                      wind_down=self.winding)

        self.counters["profile_starts"] += 1
        self.sent[info.profile] = 0
        return sup.start_child(info.profile, factory)

    def queue(self, info: ProfileInfo, delivery: Delivery) -> None:
        """Queue ``delivery`` on the ProfileActor of ``info`` (sent at the next :meth:`flush`)."""
        entry = self.gathered.get(info.profile)
        if entry is None:
            self.gathered[info.profile] = (info, [delivery])
        else:
            entry[1].append(delivery)
        self.gathered_count += 1

    def flush(self) -> None:
        """Send what :meth:`queue` gathered: one ``Deliver`` per profile, deliveries in their order."""
        if not self.gathered:
            return
        gathered, self.gathered, self.gathered_count = self.gathered, {}, 0
        for info, deliveries in gathered.values():
            if self.supervisor.child_down(info.profile):
                self._hold(info, deliveries)
                continue
            ref = self.ref(info)
            try:
                ref.tell(Deliver(tuple(deliveries)))
            except pykka.ActorDeadError:  # it crashed between the check and the tell
                self._hold(info, deliveries)
                continue
            self.sent[info.profile] = self.sent.get(info.profile, 0) + 1

    def _hold(self, info: ProfileInfo, deliveries: list[Delivery]) -> None:
        """Keep ``deliveries`` gathered: the ProfileActor of ``info`` crashed, its restart is on the way.

        A crashed ProfileActor always reports (``ChildCrashed``, then ``ChildFailed``) to the
        Dispatcher, which restarts it with what it had queued and its mailbox, then flushes
        (``on_child_restarted``):
        these come after them, in arrival order. Starting a fresh instance now instead would run
        them ahead of the older deliveries the crashed one held.
        """
        self.gathered[info.profile] = (info, deliveries)
        self.gathered_count += len(deliveries)

    def _take_gathered(self, profile: str) -> list[Delivery]:
        """Remove and return the deliveries gathered (or held) for ``profile``, in their order."""
        entry = self.gathered.pop(profile, None)
        if entry is None:
            return []
        self.gathered_count -= len(entry[1])
        return entry[1]

    def taken_over(self, profile: str, failure: ChildFailed) -> ChildFailed:
        """What a newer ProfileActor of ``profile`` takes from one that crashed after it was started.

        The crashed one was found dead (a delivery came in before its ``ChildFailed``), so
        nothing restarts from its salvage: its queued deliveries go to the newer one as one
        ``Deliver``, ahead of its mailbox, and every ``Deliver`` handed over is counted as
        sent to the newer one, so that its idle stop still balances.

        Returns:
            ``failure`` with that ``Deliver`` put ahead of its mailbox.
        """
        pending = _without_owner_changes(failure.pending)
        salvage = failure.salvage
        if isinstance(salvage, ProfileSalvage) and salvage.queued:
            pending = (Deliver(tuple(delivery for delivery, _ in salvage.queued)), *pending)
        self.count_sent(profile, pending)
        return replace(failure, pending=pending)

    def count_sent(self, profile: str, messages: tuple[Any, ...]) -> None:
        """The ``Deliver`` messages among ``messages`` go to the current ProfileActor of ``profile``: count them."""
        self.sent[profile] = self.sent.get(profile, 0) + sum(1 for m in messages if isinstance(m, Deliver))

    def attach_owner(self, info: ProfileInfo, owner: Any) -> None:
        """Hand the DMs of ``info`` to a live owner (this instance and every restarted one)."""
        self.flush()
        self.owners[info.profile] = owner
        if not self.supervisor.child_down(info.profile):  # down: its restart starts with the owner
            self.ref(info).tell(AttachOwner(info.profile, owner))

    def detach_owner(self, info: ProfileInfo) -> None:
        """Return the DMs of ``info`` to the normal turn path."""
        self.flush()
        self.owners.pop(info.profile, None)
        ref = self.supervisor.child_ref(info.profile)
        if ref is not None and not self.supervisor.child_down(info.profile):
            ref.tell(DetachOwner(info.profile))

    def idle(self, msg: ProfileIdle) -> None:
        """An idle ProfileActor offers to stop: stop it when nothing is in flight to it."""
        if msg.profile in self.gathered:
            return  # a delivery for it waits to be sent: it stays
        current = self.supervisor.child_ref(msg.profile)
        if current is not msg.ref and current != msg.ref:
            return
        if self.sent.get(msg.profile, 0) != msg.handled:
            return  # a Deliver is still in flight to it: it stays
        self.supervisor.forget_child(msg.profile)
        self.sent.pop(msg.profile, None)
        msg.ref.tell(StopProfile())

    def owner_turn_returned(self, profile: str, result: TurnFinished) -> None:
        """A live owner's turn returned after the ProfileActor that handed it crashed: tell the one that took over.

        That one waits for it before it hands the owner another DM (``ProfileSalvage.owner_busy``).
        While it is down (its restart is on the way) the result waits for :meth:`hand_returned`; with
        no ProfileActor of ``profile`` (given up on, or the gateway stops) nobody waits for it.
        """
        if self.supervisor.child_down(profile):
            self.returned.setdefault(profile, []).append(result)
            return
        ref = self.supervisor.child_ref(profile)
        if ref is None:
            logger.info("the live owner's turn {} of {} returned; no ProfileActor waits for it",
                        result.delivery_id, profile)
            return
        try:
            ref.tell(result)
        except pykka.ActorDeadError:  # crashed again just now: its restart takes it
            self.returned.setdefault(profile, []).append(result)

    def resume_turns(self, profiles: Iterable[str]) -> None:
        """Tell the ProfileActors of ``profiles``, holding their turns for the journal, that it may take records
        again (``JournalDurability.write_held``). One that is down or gone holds nothing: its restart, or the next
        one started, starts its turns anyway (and is held again should a started record fail)."""
        self.flush()
        for profile in profiles:
            ref = self.supervisor.child_ref(profile)
            if ref is not None and not self.supervisor.child_down(profile):
                tell(ref, ResumeTurns())

    def hand_returned(self, profile: str) -> None:
        """Tell the restarted ProfileActor of ``profile`` the owner results that waited for it (see above)."""
        for result in self.returned.pop(profile, []):
            self.owner_turn_returned(profile, result)

    def forget(self, profile: str) -> None:
        """The ProfileActor of ``profile`` was given up (it kept crashing); what was gathered for it is dropped
        (the Dispatcher settled it)."""
        self.sent.pop(profile, None)
        self.returned.pop(profile, None)
        self._take_gathered(profile)

    def wind_down(self, *, keep_journaled: bool, answer_within: float) -> list[str]:
        """Cancel what is queued on every ProfileActor; returns the ids of the turns still running.

        Args:
            keep_journaled: leave journaled deliveries for the next start (durable mode).
            answer_within: seconds the ProfileActors get, together, to answer (at least
                ``_ANSWER_FLOOR``): every one is asked first, then the answers are collected
                against that one deadline, so stuck ones do not add up. One that does not answer
                (its thread is stuck in a turn of a "non-blocking" runner, say) is wound down
                without its thread: its turn's gate says whether it began, nothing more of it
                starts, and the stop settles what it holds (``FinalizePending``).
        """
        self.flush()
        self.winding = WindDown(keep_journaled=keep_journaled)
        self.deps.gates.stop()  # no turn starts from now on, whether or not its ProfileActor answers
        asked: list[tuple[str, Reply | None]] = []
        for name in list(self.supervisor.children):
            ref = self.supervisor.child_ref(name)
            if ref is None or self.supervisor.child_down(name):
                continue  # crashed: its restart settles what it held (see restarting)
            try:
                asked.append((name, ask_later(ref, self.winding)))
            except ActorGone:
                asked.append((name, None))
        answer_by = time.monotonic() + max(_ANSWER_FLOOR, answer_within)
        running: list[str] = []
        for name, reply in asked:
            try:
                if reply is None:
                    raise ActorGone(f"ProfileActor {name} is gone")
                current = reply.get(timeout=max(0.0, answer_by - time.monotonic()))
            except (ActorGone, AskTimeout):
                self.unanswered.add(name)
                current = self.deps.gates.give_up_unbegun(name)
            if current:
                running.append(current)
        return running

    def stop_waiting(self) -> None:
        """The stop waited what it may for the turns still running: they are reported ``ambiguous`` now, so none
        of them starts its retry (nor takes its DM back from the session) after that (``TurnGates.give_up_all``).
        Until then a turn that began keeps both (``wind_down`` gives up only on those that had not)."""
        self.deps.gates.give_up_all()

    def restarting(self, profile: str, failure: ChildFailed) -> tuple[ChildFailed, list[Delivery]]:
        """What a ProfileActor of ``profile`` restarted after a crash is given, and what it is not.

        While the gateway runs, all of it but the owner changes in its mailbox (the new
        instance starts with the current owner). Once the gateway stops (the crashed instance missed the
        ``WindDown``), none of the deliveries it had queued, was sent or that wait for it
        here: they must not run, and the caller settles them now, on its own thread, ahead
        of the stop's next step.

        Returns:
            ``(failure to restart from, deliveries to cancel)``; a delivery the stop keeps
            for the next start (see :func:`kept_at_stop`) is in neither.
        """
        failure = replace(failure, pending=_without_owner_changes(failure.pending))
        if self.winding is None:
            return failure, []
        salvage = failure.salvage
        taken: list[Delivery] = []
        if isinstance(salvage, ProfileSalvage):
            taken += [delivery for delivery, _ in salvage.queued]
            salvage = replace(salvage, queued=())
        delivers = [m for m in failure.pending if isinstance(m, Deliver)]
        for message in delivers:
            taken += message.deliveries
        if profile in self.sent:  # they are never handled: the idle-stop count must not wait for them
            self.sent[profile] -= len(delivers)
        taken += self._take_gathered(profile)  # sent while it was down (see _hold): they come last
        pending = tuple(m for m in failure.pending if not isinstance(m, Deliver))
        keep = self.winding.keep_journaled
        cancel = [delivery for delivery in taken if not kept_at_stop(delivery, keep_journaled=keep)]
        return replace(failure, pending=pending, salvage=salvage), cancel

    def active(self) -> int:
        """How many ProfileActors run."""
        return sum(1 for child in self.supervisor.children.values() if child.ref.is_alive())

    def stop_all(self) -> None:
        """Stop every ProfileActor (the Dispatcher stops)."""
        self.flush()
        for name in list(self.supervisor.children):
            ref = self.supervisor.child_ref(name)
            if ref is not None and name in self.unanswered:  # maybe stuck in a turn: never waited for again
                ref.stop(block=False)
            elif ref is not None:
                try:
                    ref.stop(block=True, timeout=5)
                except pykka.Timeout:
                    logger.warning("ProfileActor {} did not stop in time", name)


def _without_owner_changes(pending: tuple[Any, ...]) -> tuple[Any, ...]:
    """A crashed ProfileActor's mailbox without its ``AttachOwner``/``DetachOwner``.

    The instance that takes it over starts with the profile's current owner (the table's
    ``owners``); an older change handed over after that would undo a newer one.
    """
    return tuple(m for m in pending if not isinstance(m, AttachOwner | DetachOwner))
