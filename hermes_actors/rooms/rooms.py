"""``Rooms``: the rooms of one gateway (composed by :class:`hermes_actors.gateway.Gateway`).

It resolves a room reference (its id, or its name case-insensitively) to the
room's RoomActor and asks it; it creates, resumes and ends RoomActors. The
lock guards only the table of rooms (create / disband / lookup), never a
room's traffic, which each RoomActor serializes itself.

One gateway process drives a root's rooms: :meth:`Rooms.start` takes the flock
``bot_relay/rooms/.owner.lock`` and holds it until the gateway stops; a second gateway on
the same root finds it held and its room calls raise, naming why, until the lock is free:
then it takes the rooms over (:meth:`Rooms.take_over`), at its next rescan tick
(:class:`RoomsTakeover`) or room call, whichever comes first, resuming them from their
files as a start does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, Scheduler, TypedActor, ask, handles
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.targets import refuse, resolve_local
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.local.notifier import Notifier
from hermes_actors.messages import (
    AwaitIdle,
    Disband,
    GetSnapshot,
    GetSummary,
    GetTranscript,
    Halt,
    RoomSend,
    RoomsTick,
    RosterSnapshot,
)
from hermes_actors.rooms.room_actor import RoomActor
from hermes_actors.rooms.room_record import RoomRecord
from hermes_actors.rooms.rules import find_room, name_problem, name_taken, plan_members, unrecorded
from hermes_actors.rooms.store import RoomFiles
from hermes_actors.store.turnlock import TurnLock

__all__ = ["Rooms", "RoomsTakeover"]

_ASK_TIMEOUT = 30.0


class Rooms:
    """The group rooms of a running gateway.

    Args:
        files: the room directory of the root.
        dispatcher: the DispatcherActor.
        roster: the RosterActor.
        notifier: the subscribers' Notifier (room events).
        scheduler: the gateway's timers: while the rooms are unavailable, a :class:`RoomsTakeover` tries to take
            them over every ``retry_seconds`` (None: only room calls try).
        retry_seconds: how often (the gateway's ``bot_mode.rescan_seconds``).
    """

    def __init__(
        self,
        files: RoomFiles,
        *,
        dispatcher: pykka.ActorRef[Any],
        roster: pykka.ActorRef[Any],
        notifier: Notifier,
        scheduler: Scheduler | None = None,
        retry_seconds: float = 2.0,
    ) -> None:
        self.files = files
        self.dispatcher = dispatcher
        self.roster = roster
        self.notifier = notifier
        self.scheduler = scheduler
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._rooms: dict[str, tuple[str, pykka.ActorRef[Any]]] = {}  # room id → (name, RoomActor)
        self._broken: str | None = None  # why the rooms are unavailable (None: this gateway drives them)
        self._owner: TurnLock | None = None  # the rooms owner lock: held while this gateway drives the rooms
        self._driving = False  # set once: this gateway holds the lock and drives the rooms (until it stops)
        self._taking = threading.Lock()  # one take of the rooms at a time: the start, a tick, a room call
        self._closed = False  # halted or stopped: the rooms are taken no more
        self._takeover: pykka.ActorRef[Any] | None = None  # the RoomsTakeover while the rooms are unavailable

    def _snapshot(self) -> RosterSnapshot:
        return ask(self.roster, GetSnapshot(), timeout=_ASK_TIMEOUT, expect=RosterSnapshot)

    def _start_actor(self, record: RoomRecord, snapshot: RosterSnapshot, *, began: bool) -> pykka.ActorRef[Any]:
        return RoomActor.start(record, files=self.files, dispatcher=self.dispatcher, notifier=self.notifier,
                               snapshot=snapshot, began=began)

    def start(self) -> int:
        """Drive the root's rooms: take the rooms owner lock and resume every room on disk (a round cut short by
        a crash goes on).

        While another process holds the lock (or the room directory is refused), room calls raise naming why,
        and the rooms are taken over once they can be (:meth:`take_over`): at each tick of a
        :class:`RoomsTakeover` (every ``retry_seconds``) and at each room call.

        Returns:
            How many rooms were resumed (0 while they are unavailable).

        Raises:
            ActorGone: the RosterActor stopped (the gateway's start fails).
            AskTimeout: it did not answer.
        """
        with self._taking:
            self._take()
        if self._broken is None:
            return len(self._rooms)
        logger.info("rooms are unavailable here for now: {}; this gateway takes them over once it can (tried every "
                    "{:g} s and at each room call)", self._broken, self.retry_seconds)
        if self.scheduler is not None:
            self._takeover = RoomsTakeover.start(self.scheduler, self.retry_seconds, self.take_over)
        return 0

    def take_over(self) -> bool:
        """Drive the root's rooms from now on if the rooms owner lock is free (a no-op once this gateway drives
        them): the rooms load from their files as at a start, the rounds they had in flight resumed, and one INFO
        line says so. Called by the :class:`RoomsTakeover`'s ticks and by room calls while the rooms are
        unavailable; never once the gateway is stopping.

        Returns:
            Whether this gateway drives the rooms now.
        """
        if self._driving:
            return True
        with self._taking:
            if self._closed:
                return False
            was = self._broken
            try:
                taken = self._take()
            except (ActorGone, AskTimeout) as exc:  # the roster is gone (the gateway failed or stops): not now
                logger.warning("rooms of {} could not be taken over ({}); tried again later", self.files.relay.root,
                               exc)
                return False
        if taken:
            logger.info("rooms of {} are now driven here: {} room(s) loaded from their files, the rounds they had "
                        "in flight resumed (until now they were unavailable: {})", self.files.relay.root,
                        len(self._rooms), was)
        return taken

    def _take(self) -> bool:
        """Take the rooms owner lock if it is free and load the rooms (the caller holds ``_taking``).

        Returns:
            Whether this gateway drives the rooms now; if not, ``_broken`` says why.

        Raises:
            ActorGone, AskTimeout: the RosterActor did not answer (the lock is let go again).
        """
        if self._driving:
            return True
        try:
            self.files.ensure()
            if self._owner is None:
                self._owner = self.files.owner_lock()  # kept open while another process holds it
            if not self.files.take_owner_lock(self._owner):
                self._broken = self.files.owned_elsewhere()
                return False
        except (HostileFileError, StoreError, OSError) as exc:
            self._broken = f"the room directory is refused ({exc})"
            return False
        try:
            self._load()
        except BaseException:
            self.files.release_owner_lock(self._owner)
            raise
        self._driving = True
        self._broken = None
        return True

    def _load(self) -> None:
        """Start a RoomActor for every room on disk, as a start does: a round cut short goes on (under the lock)."""
        snapshot = self._snapshot()
        with self._lock:
            records = self.files.load_all()
            running = {r.running["turn_id"] for r in records if r.running is not None}
            # asked before the sweep and before any turn runs: either may put a refused .started right (moved
            # aside with the marks it held), and a turn whose mark is there may have run
            began = {turn_id for turn_id in running if self.files.began(turn_id)}
            # marks a crash left behind (the record that settled their turn was written, the mark not yet removed)
            self.files.sweep_starts(running)
            for record in records:
                self._rooms[record.room_id] = (record.name, self._start_actor(
                    record, snapshot, began=record.running is not None and record.running["turn_id"] in began))

    def _usable(self) -> None:
        """Raise naming why the rooms are unavailable, once a try to take them over (:meth:`take_over`) failed."""
        if not self._driving and not self.take_over():
            raise RuntimeError(f"rooms are unavailable: {self._broken}")

    def _ref(self, room: Any) -> pykka.ActorRef[Any]:
        """The RoomActor of ``room`` (its id or name). Raises KeyError naming the room (:func:`find_room`)."""
        self._usable()
        with self._lock:
            return self._rooms[find_room(((room_id, name) for room_id, (name, _) in self._rooms.items()), room)][1]

    def create(self, name: Any, members: Any) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.create_room`."""
        self._usable()
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        snapshot = self._snapshot()
        planned = plan_members(members, lambda raw: resolve_local(raw, snapshot))
        if isinstance(planned, str):
            raise ValueError(planned)
        clean = str(name).strip()
        record = RoomRecord(new_delivery_id(), clean, list(planned),
                            {m: snapshot.index[m.lower()].handle for m in planned}, time.time())
        with self._lock:
            taken = name_taken((n for n, _ in self._rooms.values()), clean)
            if taken is not None:
                raise ValueError(taken)
            try:
                self.files.write(record)  # on disk before the caller hears of it
            except (StoreError, HostileFileError) as exc:  # a full disk, rooms/ swapped: no file, no actor
                raise unrecorded(clean, "the room", str(exc), "created") from exc
            self._rooms[record.room_id] = (clean, self._start_actor(record, snapshot, began=False))
        return {"room_id": record.room_id, "name": clean, "members": list(record.handles.values())}

    def send(self, room: Any, sender: Any, text: Any) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.room_send`."""
        try:
            ref = self._ref(room)
        except KeyError as exc:
            return refuse(str(exc.args[0])).as_dict()
        try:
            answer: dict[str, Any] = ask(ref, RoomSend(sender, text, self._snapshot()), timeout=_ASK_TIMEOUT,
                                         expect=dict)
        except ActorGone:
            return refuse(f"room {room!r} was disbanded").as_dict()
        return answer

    def transcript(self, room: Any) -> list[dict[str, Any]]:
        """See :meth:`hermes_actors.gateway.Gateway.room_transcript`."""
        entries: list[dict[str, Any]] = ask(self._ref(room), GetTranscript(), timeout=_ASK_TIMEOUT, expect=list)
        return entries

    def wait_idle(self, room: Any, timeout: float) -> str:
        """See :meth:`hermes_actors.gateway.Gateway.wait_room_idle`."""
        future = ask(self._ref(room), AwaitIdle(), timeout=_ASK_TIMEOUT)
        try:
            return str(future.get(timeout=timeout))
        except pykka.Timeout:
            raise TimeoutError(f"room {room!r} did not become idle within {timeout}s") from None

    def list(self) -> list[dict[str, Any]]:
        """See :meth:`hermes_actors.gateway.Gateway.list_rooms`."""
        self._usable()
        with self._lock:
            refs = [ref for _, ref in self._rooms.values()]
        rows = []
        for ref in refs:
            try:
                rows.append(ask(ref, GetSummary(), timeout=_ASK_TIMEOUT, expect=dict))
            except ActorGone:
                continue  # disbanded meanwhile
        return rows

    def disband(self, room: Any) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.disband_room`."""
        ref = self._ref(room)
        summary: dict[str, Any] = ask(ref, Disband(), timeout=_ASK_TIMEOUT, expect=dict)
        with self._lock:
            self._rooms.pop(summary["room_id"], None)
        return summary

    def _close(self) -> None:
        """Take the rooms over no more (the gateway is stopping): the RoomsTakeover ends."""
        with self._taking:  # a take under way finishes first
            self._closed = True
        takeover, self._takeover = self._takeover, None
        if takeover is not None:
            try:
                takeover.stop(block=True, timeout=10)
            except pykka.Timeout:
                pass

    def halt(self) -> None:
        """Start no further member turns (the gateway is stopping); running ones still report."""
        self._close()
        with self._lock:
            refs = [ref for _, ref in self._rooms.values()]
        for ref in refs:
            try:
                ask(ref, Halt(), timeout=_ASK_TIMEOUT)
            except ActorGone:
                continue

    def stop(self) -> None:
        """Stop every RoomActor once it handled what it was told before (their files stay); let go of the rooms
        owner lock."""
        self._close()
        with self._lock:
            refs = [ref for _, ref in self._rooms.values()]
            self._rooms.clear()
        for ref in refs:
            try:
                ref.stop(block=True, timeout=10)
            except (pykka.Timeout, pykka.ActorDeadError):
                continue
        if self._owner is not None:
            if self._driving:
                self.files.release_owner_lock(self._owner)
            self._owner.close()
            self._owner = None


class RoomsTakeover(TypedActor):
    """While a gateway's rooms are unavailable: tries to take them over at each tick, then ends.

    A flock tells nobody when it is let go, so the gateway tries it again at its rescan pace
    (``bot_mode.rescan_seconds``); a thin shell over :meth:`Rooms.take_over`, which does the work.

    Args:
        scheduler: the gateway's timers.
        interval: seconds between two tries.
        take_over: the try; True once the rooms are driven here (the actor then stops).
    """

    def __init__(self, scheduler: Scheduler, interval: float, take_over: Callable[[], bool]) -> None:
        super().__init__()
        self.timers = self.own_timers(scheduler)
        self.interval = interval
        self.take_over = take_over

    def on_start(self) -> None:
        self.timers.every(self.interval, RoomsTick())

    @handles(RoomsTick)
    def _on_tick(self, msg: RoomsTick) -> None:
        if self.take_over():
            self.stop()
