"""State and seams shared by the Dispatcher's parts (core, durable mode, relay routing).

The Dispatcher is one actor; its handlers are split by concern across
mixins so each module stays readable. Everything here runs on the
Dispatcher's own thread.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import pykka

from actors import SupervisorActor
from hermes_actors.local.profile_actor import ProfileDeps
from hermes_actors.messages import Delivery, Outcome, ProfileInfo, RosterSnapshot
from hermes_actors.store.journal import Journal

__all__ = ["DispatcherBase", "Pending"]


@dataclass
class Pending:
    """A delivery the Dispatcher accepted and that has no outcome yet."""

    delivery: Delivery
    route: str  # "local" | "relay" (ours, awaiting a reply) | "relay-in" (drained, run here) | "peer" | "room"
    reply_connection: str = ""
    answer: Any = None  # the future of an in-process relay_deliver RPC; a room turn's reply callback


class DispatcherBase(SupervisorActor):
    """The Dispatcher's state (owned by its thread) and the methods its parts share."""

    snapshot: RosterSnapshot
    deps: ProfileDeps
    relay: pykka.ActorRef[Any] | None
    journal: Journal | None
    journaled: set[str]
    pending: dict[str, Pending]
    settled: OrderedDict[str, dict[str, Any]]
    waiters: dict[str, list[pykka.ThreadingFuture[dict[str, Any]]]]
    sent: dict[str, int]
    pairs: dict[tuple[str, str], deque[float]]
    counters: dict[str, int]
    accepting: bool
    owners: dict[str, Any]
    awaiting_durable: dict[str, tuple[Delivery, ProfileInfo, pykka.ThreadingFuture[Any], dict[str, Any]]]

    def _deliver_local(self, info: ProfileInfo, delivery: Delivery, *, register: bool = True) -> None:
        raise NotImplementedError

    def _settle(self, outcome: Outcome) -> None:
        raise NotImplementedError

    def _publish(self, outcome: Outcome) -> None:
        raise NotImplementedError

    def _answer_relay_in(self, outcome: Outcome, reply_connection: str, answer: Any) -> None:
        """Where a relayed-in delivery's outcome goes: the RPC caller, or back through the relay."""
        if answer is not None:
            answer.set(outcome)
        elif self.relay is not None:
            from hermes_actors.messages import RelayOutcome

            self.relay.tell(RelayOutcome(outcome, reply_connection))
