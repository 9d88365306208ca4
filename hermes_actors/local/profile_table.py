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
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, ChildFailed, Link, SupervisorActor, ask
from hermes_actors.local.profile_actor import ProfileActor, ProfileDeps, ProfileSalvage
from hermes_actors.messages import (
    AttachOwner,
    Deliver,
    Delivery,
    DetachOwner,
    ProfileIdle,
    ProfileInfo,
    StopProfile,
    WindDown,
)

__all__ = ["DELIVER_BATCH", "ProfileTable"]

DELIVER_BATCH = 256  # deliveries gathered at most before they are handed over, however busy the Dispatcher


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
            return ProfileActor.start(info, deps, link=link, salvage=salvage, owner=self.owners.get(info.profile))

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
            message = Deliver(tuple(deliveries))
            ref = self.ref(info)
            try:
                ref.tell(message)
            except pykka.ActorDeadError:  # it died between the check and the tell: start a fresh one
                self.supervisor.forget_child(info.profile)
                ref = self.ref(info)
                ref.tell(message)
            self.sent[info.profile] = self.sent.get(info.profile, 0) + 1

    def taken_over(self, profile: str, failure: ChildFailed) -> ChildFailed:
        """What a newer ProfileActor of ``profile`` takes from one that crashed after it was started.

        The crashed one was found dead (a delivery came in before its ``ChildFailed``), so
        nothing restarts from its salvage: its queued deliveries go to the newer one as one
        ``Deliver``, ahead of its mailbox, and every ``Deliver`` handed over is counted as
        sent to the newer one, so that its idle stop still balances.

        Returns:
            ``failure`` with that ``Deliver`` put ahead of its mailbox.
        """
        pending = failure.pending
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
        self.ref(info).tell(AttachOwner(info.profile, owner))

    def detach_owner(self, info: ProfileInfo) -> None:
        """Return the DMs of ``info`` to the normal turn path."""
        self.flush()
        self.owners.pop(info.profile, None)
        ref = self.supervisor.child_ref(info.profile)
        if ref is not None and ref.is_alive():
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

    def forget(self, profile: str) -> None:
        """The ProfileActor of ``profile`` was given up (it kept crashing); what was gathered for it is dropped
        (the Dispatcher settled it)."""
        self.sent.pop(profile, None)
        dropped = self.gathered.pop(profile, None)
        if dropped is not None:
            self.gathered_count -= len(dropped[1])

    def wind_down(self, *, keep_journaled: bool) -> list[str]:
        """Cancel what is queued on every ProfileActor; returns the ids of the turns still running."""
        self.flush()
        running: list[str] = []
        for name in list(self.supervisor.children):
            ref = self.supervisor.child_ref(name)
            if ref is None:
                continue
            try:
                current = ask(ref, WindDown(keep_journaled=keep_journaled), timeout=10)
            except (ActorGone, AskTimeout):
                continue
            if current:
                running.append(current)
        return running

    def active(self) -> int:
        """How many ProfileActors run."""
        return sum(1 for child in self.supervisor.children.values() if child.ref.is_alive())

    def stop_all(self) -> None:
        """Stop every ProfileActor (the Dispatcher stops)."""
        self.flush()
        for name in list(self.supervisor.children):
            ref = self.supervisor.child_ref(name)
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=5)
                except pykka.Timeout:
                    logger.warning("ProfileActor {} did not stop in time", name)
