"""How a ProfileActor's turn is launched: where its start is recorded, and the code that runs it.

The ProfileActor decides which turn starts and where (inline under a flock it holds, or on
the worker pool); the functions here run it there, with a backstop so that an exception
escaping the turn's code still gives the DM its outcome (:func:`turn_escaped`). A worker
job tells its :class:`TurnFinished` back to the ProfileActor; an inline run returns it. A turn
given up on at its timeout is ended off the actor too (:func:`end_timed_out_turn`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import tell
from hermes_actors.core.acks import accepted_record
from hermes_actors.errors import StoreError
from hermes_actors.faults import crashpoint
from hermes_actors.local.live_handoff import hand_to_owner
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.profile_outcomes import turn_escaped
from hermes_actors.local.runners import TurnRunner
from hermes_actors.local.shutdown import end_running_turns
from hermes_actors.local.turns import TurnGate, execute_turn, turn_process_running
from hermes_actors.messages import (
    RELAY_ORIGIN,
    ROOM_ORIGIN,
    Delivery,
    OwnerTurnReturned,
    TimedOutTurnPlace,
    TurnFinished,
)
from hermes_actors.rooms.store import RoomStartMarks
from hermes_actors.rooms.turn_author import room_of_author
from hermes_actors.store.journal import Journal, StartRecorder
from hermes_actors.store.relay_marks import TurnStartMarks
from hermes_actors.store.turnlock import TurnLock

__all__ = ["RelayedInStart", "end_timed_out_turn", "live_owner_for", "run_inline", "start_recorder", "worker_job"]


def live_owner_for(owner: TurnRunner | None, delivery: Delivery) -> TurnRunner | None:
    """Pure: the live owner ``delivery`` is handed to, or None when its turn runs on the runner.

    The Bot Chat window holds the lease: a DM is handed over, not run as a turn. A room's
    member turn is no Bot Chat message: it runs in its own session with the runner.
    """
    return owner if delivery.origin != ROOM_ORIGIN else None


class RelayedInStart:
    """Where a relayed-in turn's start is recorded in durable mode: the journal, then the envelope's start mark.

    The DM's ``accepted`` record and its ``started`` one go into the journal in one batch (both or
    neither), on disk before the turn runs: the next start finds a DM that started and never finished
    and settles it ``ambiguous``, so a retry of its envelope (the Desktop's ``relay_deliver``, a
    reclaim, a post to ``inbox/`` again) is answered so and never runs it twice; its outcome is
    journaled with its ``delivered`` record as it settles (``OutcomeFlow.settle``). A relayed-in DM
    that never started has no journal record at all: its transport offers it again and it runs then.
    The start mark (:class:`~hermes_actors.store.relay_marks.TurnStartMarks`) is what the file relay's
    adoption of a dead shelf and the Redis transport read, as without a journal.

    Args:
        journal: the gateway's delivery journal.
        delivery: the relayed-in delivery whose turn starts.
        marks: its envelope's start mark.
    """

    def __init__(self, journal: Journal, delivery: Delivery, marks: TurnStartMarks) -> None:
        self.journal = journal
        self.delivery = delivery
        self.marks = marks

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None:
        """Record the turn's start (a ``started`` record; other kinds are ignored), durably, before it runs.

        Args:
            record: ``{"t": "started", "id": …, "attempt": …}`` (``"live": true`` for a live owner's).
            timeout: seconds to wait for the journal's commit.

        Raises:
            StoreError: the journal or the mark could not take it: the turn must not run.
        """
        if record.get("t") != "started":
            return
        batch = self.journal.append_together([accepted_record(self.delivery), record])
        if not batch.done.wait(timeout):
            raise StoreError(0, f"the delivery journal did not confirm the start of {self.delivery.delivery_id} "
                                f"within {timeout}s")
        batch.raise_error()
        self.marks.append_durably(record, timeout)


def start_recorder(deps: ProfileDeps, delivery: Delivery) -> StartRecorder | None:
    """Where the turn's start is recorded before it runs (None: nowhere).

    Args:
        deps: the ProfileActors' shared deps (the root, the journal).
        delivery: the delivery whose turn starts.

    Returns:
        The journal for a local DM; for a relayed-in turn its start is marked beside the
        envelope it came in, and journaled first in durable mode (:class:`RelayedInStart`); a
        room's member turn beside its room's file (a restart runs it again only if it never began).
    """
    journal = deps.journal
    fsync = journal is not None and journal.fsync_enabled  # flushed like the journal: a kill -9 finds it anyway
    if delivery.origin == RELAY_ORIGIN:
        marks = TurnStartMarks(deps.root, fsync=fsync)
        return marks if journal is None else RelayedInStart(journal, delivery, marks)
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
    profile: str,
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
        owner: the live Bot Chat owner the DM is handed to (:func:`live_owner_for`; None: the runner).
        profile: the profile's folder id (an owner's result that finds ``me`` crashed goes to its successor).
        home: the profile's home.
        deadline: monotonic time by which the turn must have the flock.
        gate: decides once between the turn (or the handoff to the owner) beginning and its timeout.

    Returns:
        The job (it raises nothing: a result told to a stopped ProfileActor is logged and dropped).
    """
    journal = start_recorder(deps, delivery)

    def job() -> None:
        crashpoint("after-ack-before-turn")
        try:
            if owner is not None:
                result = hand_to_owner(delivery, owner=owner, home=home, make_turn=deps.make_turn, journal=journal,
                                       gate=gate)
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
            return
        except pykka.ActorDeadError:  # stopped (the gateway's stop abandoned the turn) or crashed
            pass
        if owner is not None:  # a crashed one's successor waits for the owner to be free (ProfileSalvage.owner_busy)
            try:
                deps.dispatcher.tell(OwnerTurnReturned(profile, result))
                return
            except pykka.ActorDeadError:  # the gateway stopped
                pass
        logger.info("turn {} finished after its ProfileActor stopped; its DM was already reported ambiguous, "
                    "this late result is dropped", delivery.delivery_id)

    return job


def end_timed_out_turn(me: pykka.ActorRef[Any], runner: TurnRunner, delivery_id: str, *, profile: str,
                       ask: bool) -> None:
    """On a thread of its own: end the timed-out turn of ``delivery_id``, first telling ``me`` whether a turn
    process of ours ran it.

    Both are runner code, so neither runs in the ProfileActor: ``running_turns()`` is asked bounded
    (:func:`~hermes_actors.local.turns.turn_process_running`, the stop's rule) before ``stop_turns`` ends the
    process (it would not list it after), and the answer goes back as :class:`TimedOutTurnPlace`. The end takes
    seconds (bounded), on this thread rather than the worker pool, which may be full of hung turns.

    Args:
        me: the ProfileActor (told nothing when it is gone: its crash settled the turn).
        runner: the gateway's runner.
        delivery_id: the timed-out turn's delivery.
        profile: its bot (named in the log).
        ask: whether the actor waits for the answer (the runner has ``running_turns``).
    """
    if ask:
        tell(me, TimedOutTurnPlace(delivery_id, turn_process_running(runner, delivery_id, profile=profile)))
    end_running_turns(runner, [delivery_id])
