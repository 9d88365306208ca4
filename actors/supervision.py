"""Supervision: restart crashed children with bounded intensity.

A :class:`SupervisorActor` starts children through factories. When a child
crashes it sends :class:`ChildFailed` (with its unhandled mailbox and any
salvaged state); the supervisor starts a fresh instance from the same factory
(state rebuilt from scratch or from the salvage) and re-queues the mailbox, so
no ask hangs and no tell is silently lost. More than ``max_restarts`` crashes
of one child within ``within_seconds`` escalate: the child stays down, its
mailbox asks fail, and :meth:`SupervisorActor.on_escalation` decides (the
default crashes the supervisor itself, handing the failure to *its* parent).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger
from pykka._envelope import Envelope

from actors.errors import EscalatedFailure
from actors.messages import ChildFailed, ChildRestarted
from actors.typed import Link, TypedActor, _fail_envelopes, handles

__all__ = ["ChildFactory", "ChildFailed", "ChildRestarted", "RestartPolicy", "SupervisorActor"]

# factory(link, salvage) -> a started child ref
ChildFactory = Callable[[Link, Any], pykka.ActorRef[Any]]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """At most ``max_restarts`` restarts of one child within ``within_seconds``."""

    max_restarts: int = 3
    within_seconds: float = 5.0

    def allows(self, history: deque[float], now: float) -> bool:
        """Pure decision: may one more restart happen at ``now``?"""
        recent = [t for t in history if now - t <= self.within_seconds]
        return len(recent) < self.max_restarts


@dataclass
class _Child:
    factory: ChildFactory
    ref: pykka.ActorRef[Any]
    generation: int
    restarts: deque[float]


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

    def start_child(self, name: str, factory: ChildFactory, salvage: Any = None) -> pykka.ActorRef[Any]:
        """Start (or return the running) child ``name``; call from this actor's thread."""
        child = self.children.get(name)
        if child is not None and child.ref.is_alive():
            return child.ref
        generation = child.generation + 1 if child else 0
        ref = factory(Link(self.actor_ref, name, generation), salvage)
        self.children[name] = _Child(factory, ref, generation, child.restarts if child else deque(maxlen=64))
        self.escalated.pop(name, None)
        return ref

    def child_ref(self, name: str) -> pykka.ActorRef[Any] | None:
        """The current ref of ``name`` (None when never started or escalated)."""
        child = self.children.get(name)
        return child.ref if child is not None else None

    def forget_child(self, name: str) -> None:
        """Drop a child that stopped on purpose (idle stop) from the table."""
        self.children.pop(name, None)

    @handles(ChildFailed)
    def _on_child_failed(self, msg: ChildFailed) -> None:
        child = self.children.get(msg.name)
        if child is None or child.generation != msg.generation:
            _fail_envelopes(self, list(msg.pending))  # a stale generation: nobody to hand them to
            return
        now = self.clock()
        if not self.policy.allows(child.restarts, now):
            logger.error("child {} crashed beyond its restart intensity; escalating", msg.name)
            del self.children[msg.name]
            self.escalated[msg.name] = msg.error
            _fail_envelopes(self, list(msg.pending))
            self.on_escalation(msg.name, msg.error)
            return
        child.restarts.append(now)
        logger.warning("restarting crashed child {} after {!r}", msg.name, msg.error)
        try:
            ref = child.factory(Link(self.actor_ref, msg.name, child.generation + 1), msg.salvage)
        except Exception:
            _fail_envelopes(self, list(msg.pending))  # nobody will ever answer them: fail, never hang
            raise
        child.ref, child.generation = ref, child.generation + 1
        for envelope in msg.pending:  # the mailbox moves to the new instance, order kept
            _requeue(ref, envelope)
        self.on_child_restarted(msg.name, ref)

    def on_child_restarted(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        """Hook: a child got a new ref (override to tell watchers)."""

    def on_escalation(self, name: str, error: BaseException | None) -> None:
        """Hook: a child exceeded its intensity. Default: crash this supervisor."""
        raise EscalatedFailure(name, error)


def _requeue(ref: pykka.ActorRef[Any], envelope: Envelope[Any]) -> None:
    """Put an envelope (keeping its reply future) into another actor's mailbox."""
    try:
        if not ref.is_alive():
            raise pykka.ActorDeadError(f"{ref} is not alive")
        ref.actor_inbox.put(envelope)
    except pykka.ActorDeadError as exc:
        if envelope.reply_to is not None:
            envelope.reply_to.set_exception(exc_info=(pykka.ActorDeadError, exc, None))
