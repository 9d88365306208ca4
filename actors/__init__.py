"""A small, domain-free actor toolkit on pykka.

Typed dispatch, asks with timeouts, timers, supervision, a worker pool, a
filesystem bridge and a test kit. Nothing here knows about bots.
"""

from loguru import logger

from actors.asking import ask, tell
from actors.errors import ActorGone, AskTimeout, EscalatedFailure, UnexpectedReply, UnknownMessageError
from actors.fsbridge import FsBridge, default_ignore
from actors.messages import ChildFailed, ChildRestarted, FileAppeared, FileRemoved, Rescan
from actors.supervision import RestartPolicy, SupervisorActor
from actors.testkit import Probe, await_condition
from actors.timers import ManualScheduler, Scheduler, TimerHandle, TimerSet
from actors.typed import Link, TypedActor, handles
from actors.workers import WorkerPool

logger.disable("actors")

__all__ = [
    "ActorGone",
    "AskTimeout",
    "ChildFailed",
    "ChildRestarted",
    "EscalatedFailure",
    "FileAppeared",
    "FileRemoved",
    "FsBridge",
    "Link",
    "ManualScheduler",
    "Probe",
    "Rescan",
    "RestartPolicy",
    "Scheduler",
    "SupervisorActor",
    "TimerHandle",
    "TimerSet",
    "TypedActor",
    "UnexpectedReply",
    "UnknownMessageError",
    "WorkerPool",
    "ask",
    "await_condition",
    "default_ignore",
    "handles",
    "tell",
]
