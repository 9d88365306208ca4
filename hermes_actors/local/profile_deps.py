"""What a ProfileActor is started with: the dependencies every one shares, and a crashed one's salvage.

Value records only: the Dispatcher builds :class:`ProfileDeps` once (``ActorSystem``) and
hands it to every ProfileActor it starts; a crashed ProfileActor's :class:`ProfileSalvage`
goes to its restarted instance (``ProfileTable`` reads it to settle what it held at a stop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka

from actors import Scheduler, WorkerPool
from hermes_actors.core.config import BotModeConfig
from hermes_actors.local.queue_gauge import QueueGauge
from hermes_actors.local.runners import TurnRunner
from hermes_actors.local.turns import TurnFactory, TurnGates
from hermes_actors.messages import Delivery
from hermes_actors.store.journal import Journal

__all__ = ["ProfileDeps", "ProfileSalvage"]


@dataclass(frozen=True)
class ProfileDeps:
    """What every ProfileActor shares (given by the Dispatcher)."""

    root: Path
    config: BotModeConfig
    runner: TurnRunner
    pool: WorkerPool
    scheduler: Scheduler
    dispatcher: pykka.ActorRef[Any]
    make_turn: TurnFactory
    cross_process_lock: bool = True
    journal: Journal | None = None
    gauge: QueueGauge | None = None  # the admission's count of waiting DMs: a started turn frees its place
    gates: TurnGates = field(default_factory=TurnGates)  # every turn's gate: the stop decides stuck ones there


@dataclass(frozen=True)
class ProfileSalvage:
    """What a crashed ProfileActor hands to its restarted instance."""

    queued: tuple[tuple[Delivery, float], ...]  # (delivery, monotonic enqueue time)
    handled: int
    # The live owner's turn still running (timed out, or handed over when the actor crashed): it cannot be ended,
    # so the restarted instance starts no turn until it returns (its result is routed there: OwnerTurnReturned)
    owner_busy: str | None = None
