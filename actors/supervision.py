"""Supervision: restart crashed children with bounded intensity.

A :class:`SupervisorActor` starts children through factories. When a child
crashes it tells :class:`ChildCrashed` at once; the supervisor sends it nothing
more (:meth:`SupervisorActor.child_down` says so to subclasses that tell it
things) and answers :class:`Retire`, so everything it sent before is collected.
The child then stops and sends :class:`ChildFailed` (with that unhandled mailbox,
what reached it behind its stop included, and any salvaged state); the supervisor
starts a fresh instance from the same factory (state rebuilt from scratch or from
the salvage) and tells it the mailbox, in order, so no ask hangs and no tell is
silently lost (asks are answered by the new instance through their relay future;
if it dies before taking them, the asks fail and the tells wait for the instance
after it). The one gap left is pykka's own, between a sender's alive check and its
put (see :meth:`actors.typed.TypedActor._collect_behind_stop`). More than ``max_restarts`` crashes
of one child within ``within_seconds`` escalate: the child stays down, its
mailbox asks fail, and :meth:`SupervisorActor.on_escalation` decides (the
default crashes the supervisor itself, handing the failure to *its* parent).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pykka
from loguru import logger

from actors.asking import tell
from actors.crash_records import Link, fail_pending
from actors.errors import EscalatedFailure
from actors.handler_table import handles
from actors.messages import ChildCrashed, ChildFailed, Request, Retire
from actors.typed import TypedActor

__all__ = ["ChildFactory", "ChildFailed", "RestartPolicy", "SupervisorActor"]

# factory(link, salvage) -> a started child ref
ChildFactory = Callable[[Link, Any], pykka.ActorRef[Any]]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """At most ``max_restarts`` restarts of one child within ``within_seconds``."""

    max_restarts: int = 3
    within_seconds: float = 5.0

    def allows(self, history: deque[float], now: float) -> bool:
        """Pure decision: may one more restart happen at ``now``?"""
        return self.recent(history, now) < self.max_restarts

    def recent(self, history: deque[float], now: float) -> int:
        """Pure: how many of the restarts in ``history`` fall within the window ending at ``now``."""
        return sum(1 for t in history if now - t <= self.within_seconds)

    def new_history(self) -> deque[float]:
        """An empty restart history for one child, keeping the last ``max_restarts`` restarts.

        That is all :meth:`allows` needs (restarts are appended in time order), and never
        fewer: a shorter history could never count ``max_restarts`` recent ones, so the
        child would be restarted for ever instead of escalating.

        Returns:
            An empty deque bounded to ``max_restarts`` (0 for a policy that allows none).
        """
        return deque(maxlen=max(0, self.max_restarts))


@dataclass
class _Child:
    factory: ChildFactory
    ref: pykka.ActorRef[Any]
    generation: int
    restarts: deque[float]
    # A crashed instance's mailbox that could not be handed over (its successor died first): the
    # successor's own ChildFailed or the next start hands it on, ahead of everything else.
    held: tuple[Any, ...] = ()
    retiring: bool = False  # it crashed (ChildCrashed) and was told to Retire: send it nothing more


class SupervisorActor(TypedActor):
    """Base class for an actor that owns supervised children.

    Args:
        policy: the restart intensity.
        clock: monotonic clock (injectable for tests).
        link: the supervisor's own link to its parent, if any.
    """

    def __init__(
        self,
        *,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        link: Link | None = None,
    ) -> None:
        super().__init__(link=link)
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.children: dict[str, _Child] = {}
        self.escalated: dict[str, BaseException | None] = {}
        # The last generation started per name, kept across forget_child: a forgotten instance's late
        # crash report must never be taken for its successor's.
        self.generations: dict[str, int] = {}

    def start_child(self, name: str, factory: ChildFactory, salvage: Any = None) -> pykka.ActorRef[Any]:
        """Start (or return the running) child ``name``; call from this actor's thread."""
        child = self.children.get(name)
        if child is not None and child.ref.is_alive():
            return child.ref
        generation = self._next_generation(name)
        ref = factory(Link(self.actor_ref, name, generation), salvage)
        fresh = _Child(factory, ref, generation, child.restarts if child else self.policy.new_history())
        self.children[name] = fresh
        self.escalated.pop(name, None)
        if child is not None and child.held:
            self.on_held_handed_over(name, child.held)
            fresh.held = _hand_over(ref, child.held)
        return ref

    def _next_generation(self, name: str) -> int:
        """The generation of the next instance of ``name``: never one an earlier instance had."""
        generation = self.generations.get(name, -1) + 1
        self.generations[name] = generation
        return generation

    def child_ref(self, name: str) -> pykka.ActorRef[Any] | None:
        """The current ref of ``name`` (None when never started or escalated)."""
        child = self.children.get(name)
        return child.ref if child is not None else None

    def child_down(self, name: str) -> bool:
        """Whether ``name`` is in the table but crashed or stopped: what is told to it now would be lost.

        Its ``ChildFailed`` is on the way (a crashed child always reports): hold what is
        meant for it until :meth:`on_child_restarted`.
        """
        child = self.children.get(name)
        return child is not None and (child.retiring or not child.ref.is_alive())

    def forget_child(self, name: str) -> None:
        """Drop a child that stopped on purpose (idle stop) from the table."""
        self.children.pop(name, None)

    @handles(ChildCrashed)
    def _on_child_crashed(self, msg: ChildCrashed) -> None:
        """A child crashed: from now on nothing is sent to it; ``Retire`` ends what it collects."""
        child = self.children.get(msg.name)
        if child is not None and child.generation == msg.generation and child.ref is msg.ref:
            child.retiring = True
        tell(msg.ref, Retire())  # after everything this actor sent it: all of it is in its report

    @handles(ChildFailed)
    def _on_child_failed(self, msg: ChildFailed) -> None:
        child = self.children.get(msg.name)
        if child is None or child.generation != msg.generation or (msg.ref is not None and msg.ref is not child.ref):
            # A stale report: a newer instance was started (by start_child), or the report is for a child of
            # this supervisor's crashed predecessor (handed over with its mailbox); the current one takes them.
            if child is not None:
                self.on_stale_failure(msg.name, child.ref, msg)
            else:
                fail_pending(f"child {msg.name!r}", msg.pending)
            return
        pending, child.held = child.held + msg.pending, ()
        now = self.clock()
        if not self.policy.allows(child.restarts, now):
            logger.error("child {} crashed beyond its restart intensity; escalating", msg.name)
            del self.children[msg.name]
            self.escalated[msg.name] = msg.error
            fail_pending(f"child {msg.name!r}", pending)
            self.on_escalation(msg.name, msg.error)
            return
        child.restarts.append(now)
        logger.warning("restarting crashed child {} after {!r}", msg.name, msg.error)
        restart = self.on_restart(msg.name, replace(msg, pending=pending))
        pending = restart.pending
        generation = self._next_generation(msg.name)
        try:
            ref = child.factory(Link(self.actor_ref, msg.name, generation), restart.salvage)
        except Exception:
            fail_pending(f"child {msg.name!r}", pending)  # nobody will ever answer them: fail, never hang
            raise
        child.ref, child.generation, child.retiring = ref, generation, False
        child.held = _hand_over(ref, pending)  # the mailbox moves to the new instance, order kept
        self.on_child_restarted(msg.name, ref)

    def _on_stopped(self) -> None:
        """A supervisor that stops (or crashes) stops its children: none outlives it.

        A crashed child waits for its supervisor's ``Retire``; one whose ``ChildCrashed``
        this actor never handled would wait for ever. (Without blocking: a subclass that
        must wait for them, as the Dispatcher does, stops them in its own ``on_stop``.)
        """
        for child in self.children.values():
            if child.ref.is_alive():
                child.ref.stop(block=False)
        super()._on_stopped()

    def on_restart(self, name: str, failure: ChildFailed) -> ChildFailed:
        """Hook: what the restarted instance of ``name`` is given; by default all of it.

        Override to take part of it on this actor's thread first (e.g. work that must not
        run any more); what is returned goes to the new instance.

        Args:
            name: the child.
            failure: its report; ``pending``: the mailbox it is handed, held messages first.

        Returns:
            The report to restart from (its ``salvage`` and ``pending``).
        """
        return failure

    def on_child_restarted(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """Hook: a child got a new ref (override to tell watchers)."""

    def on_held_handed_over(self, name: str, messages: tuple[Any, ...]) -> None:
        """Hook: ``start_child`` hands a fresh instance of ``name`` the told messages an earlier one never took.

        Override to count them (the fresh instance handles messages its starter did not send it).
        """

    def on_stale_failure(self, name: str, ref: pykka.ActorRef[Any], failure: ChildFailed) -> None:
        """Hook: an instance of ``name`` crashed after a newer one (``ref``) was started.

        That happens when the child was found dead and started again before its
        ``ChildFailed`` arrived. The default hands its mailbox over to ``ref`` (what a
        newer instance that died too cannot take waits for the instance after it);
        override to hand over the salvage too (nothing restarts from it), then call this.

        Args:
            name: the child.
            ref: the newer instance.
            failure: the stale report (``pending``: its mailbox; ``salvage``: its state).
        """
        child = self.children.get(name)
        held = _hand_over(ref, failure.pending)
        if child is not None and child.ref is ref:
            child.held += held
        else:
            fail_pending(f"child {name!r}", held)

    def on_escalation(self, name: str, error: BaseException | None) -> None:
        """Hook: a child exceeded its intensity. Default: crash this supervisor."""
        raise EscalatedFailure(name, error)


def _hand_over(ref: pykka.ActorRef[Any], pending: tuple[Any, ...]) -> tuple[Any, ...]:
    """Tell the crashed child's mailbox to its successor, in order.

    When the successor died first, the asks it could not take fail now (no ask ever
    hangs on a child that may not come back), and its told messages are returned.

    Returns:
        The told messages it could not take: the caller holds them for the instance after
        it (started by the successor's own ``ChildFailed``, or by the next ``start_child``).
    """
    for index, message in enumerate(pending):
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            left = pending[index:]
            fail_pending(str(ref), [m for m in left if isinstance(m, Request)])
            return tuple(m for m in left if not isinstance(m, Request))
    return ()
