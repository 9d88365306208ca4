"""How a ProfileActor's turn is launched: where its start is recorded, and the code that runs it.

The ProfileActor decides which turn starts and where (inline under a flock it holds, or on
the worker pool); the functions here run it there, with a backstop so that an exception
escaping the turn's code still gives the DM its outcome (:func:`turn_escaped`). A worker
job tells its :class:`TurnFinished` back to the ProfileActor; an inline run returns it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from hermes_actors.faults import crashpoint
from hermes_actors.local.live_handoff import hand_to_owner
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.profile_outcomes import turn_escaped
from hermes_actors.local.runners import TurnRunner
from hermes_actors.local.turns import TurnGate, execute_turn, not_begun
from hermes_actors.messages import ROOM_ORIGIN, Delivery, TurnFinished
from hermes_actors.rooms.store import RoomStartMarks
from hermes_actors.rooms.turn_author import room_of_author
from hermes_actors.store.journal import StartRecorder
from hermes_actors.store.relay_marks import TurnStartMarks
from hermes_actors.store.turnlock import TurnLock

__all__ = ["run_inline", "start_recorder", "worker_job"]


def start_recorder(deps: ProfileDeps, delivery: Delivery) -> StartRecorder | None:
    """Where the turn's start is recorded before it runs (None: nowhere).

    Args:
        deps: the ProfileActors' shared deps (the root, the journal).
        delivery: the delivery whose turn starts.

    Returns:
        The journal for a local DM; for a relayed-in turn (not in the journal) its start is
        marked beside the envelope it came in; a room's member turn beside its room's file
        (a restart runs it again only if it never began).
    """
    journal = deps.journal
    fsync = journal is not None and journal.fsync_enabled  # flushed like the journal: a kill -9 finds it anyway
    if delivery.origin == "relay":
        return TurnStartMarks(deps.root, fsync=fsync)
    if delivery.origin == ROOM_ORIGIN:
        return RoomStartMarks(deps.root, room_of_author(delivery.author), fsync=fsync)
    return journal


def run_inline(delivery: Delivery, deps: ProfileDeps, lock: TurnLock | None) -> TurnFinished:
    """Run a non-blocking runner's turn on the calling (ProfileActor's) thread, under the flock it holds.

    Args:
        delivery: the delivery whose turn runs.
        deps: the ProfileActors' shared deps.
        lock: the profile's turn lock, already held by the caller (None: no cross-process lock).

    Returns:
        The turn's result (an escaped exception becomes an ``ambiguous`` one).
    """
    crashpoint("after-ack-before-turn")
    try:
        result = execute_turn(
            delivery, runner=deps.runner, lock=lock, lock_deadline=0.0, make_turn=deps.make_turn,
            journal=start_recorder(deps, delivery), held=True,
        )
    except BaseException as exc:  # a backstop, as on the worker path
        result = turn_escaped(delivery.delivery_id, exc)
    crashpoint("after-turn-before-outcome")
    return result


def worker_job(
    me: pykka.ActorRef[Any],
    delivery: Delivery,
    deps: ProfileDeps,
    *,
    lock: TurnLock | None,
    owner: TurnRunner | None,
    home: Path,
    deadline: float,
    gate: TurnGate,
) -> Callable[[], None]:
    """The worker pool's job for one turn: it runs the turn (or hands it to the live owner) and tells the result.

    Args:
        me: the ProfileActor, told the :class:`TurnFinished`.
        delivery: the delivery whose turn runs.
        deps: the ProfileActors' shared deps.
        lock: the profile's turn lock (taken by the turn, by ``deadline``).
        owner: the live Bot Chat owner attached when the turn was handed over (None: the runner).
        home: the profile's home.
        deadline: monotonic time by which the turn must have the flock.
        gate: decides once between the turn beginning and its timeout.

    Returns:
        The job (it raises nothing: a result told to a stopped ProfileActor is logged and dropped).
    """
    journal = start_recorder(deps, delivery)

    def job() -> None:
        crashpoint("after-ack-before-turn")
        try:
            # The Bot Chat window holds the lease: hand a DM over, don't run a turn. A room's member turn
            # is no Bot Chat message: it runs in its own session with the runner.
            if owner is not None and delivery.origin != ROOM_ORIGIN:
                if gate.begin():  # handed over from here on: a stop or a timeout now finds it begun
                    result = hand_to_owner(delivery, owner=owner, home=home, make_turn=deps.make_turn,
                                           journal=journal)
                else:  # given up on before it came to the worker: never handed over
                    result = not_begun(delivery.delivery_id)
            else:
                result = execute_turn(
                    delivery, runner=deps.runner, lock=lock, lock_deadline=deadline, make_turn=deps.make_turn,
                    journal=journal, gate=gate,
                )
        except BaseException as exc:  # a backstop: the DM gets its outcome now, not at the timeout
            result = turn_escaped(delivery.delivery_id, exc)
        crashpoint("after-turn-before-outcome")
        try:
            me.tell(result)
        except pykka.ActorDeadError:  # stopped (the gateway's stop abandoned the turn) or crashed
            logger.info("turn {} finished after its ProfileActor stopped; its DM was already reported ambiguous, "
                        "this late result is dropped", delivery.delivery_id)

    return job
