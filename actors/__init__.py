"""A small, domain-free actor toolkit on pykka.

Typed dispatch, asks with timeouts, timers, supervision, a worker pool, a
filesystem bridge and a test kit. Nothing here knows about bots.
"""

from loguru import logger

from actors.asking import Reply, ask, ask_later, ask_reply_to, tell
from actors.crash_records import Link
from actors.errors import (
    ActorGone,
    AskTimeout,
    EscalatedFailure,
    HandlerAborted,
    UnexpectedReply,
    UnknownMessageError,
)
from actors.frozen import fast_init
from actors.fsbridge import FsBridge, default_ignore
from actors.handler_table import handles
from actors.messages import ChildFailed, FileAppeared, FileRemoved, Rescan
from actors.supervision import RestartPolicy, SupervisorActor
from actors.testkit import Probe, ProbeLog, await_condition
from actors.timers import ManualScheduler, Scheduler, TimerHandle, TimerSet
from actors.typed import TypedActor
from actors.workers import WorkerPool

logger.disable("actors")

__all__ = [
    "ActorGone",
    "AskTimeout",
    "ChildFailed",
    "EscalatedFailure",
    "FileAppeared",
    "FileRemoved",
    "FsBridge",
    "HandlerAborted",
    "Link",
    "ManualScheduler",
    "Probe",
    "ProbeLog",
    "Reply",
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
    "ask_later",
    "ask_reply_to",
    "await_condition",
    "default_ignore",
    "fast_init",
    "handles",
    "tell",
]
