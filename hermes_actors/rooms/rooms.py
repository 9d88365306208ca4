"""``Rooms``: the rooms of one gateway (composed by :class:`hermes_actors.gateway.Gateway`).

It resolves a room reference (its id, or its name case-insensitively) to the
room's RoomActor and asks it; it creates, resumes and ends RoomActors. The
lock guards only the table of rooms (create / disband / lookup), never a
room's traffic, which each RoomActor serializes itself.

One gateway process drives a root's rooms: :meth:`Rooms.start` takes the flock
``bot_relay/rooms/.owner.lock`` for the gateway's lifetime; a second gateway on
the same root finds it held and its room calls raise, naming why.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pykka

from actors import ActorGone, ask
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
    RosterSnapshot,
)
from hermes_actors.rooms.room_actor import RoomActor
from hermes_actors.rooms.room_record import RoomRecord
from hermes_actors.rooms.rules import find_room, name_problem, name_taken, plan_members
from hermes_actors.rooms.store import RoomFiles
from hermes_actors.store.turnlock import TurnLock

__all__ = ["Rooms"]

_ASK_TIMEOUT = 30.0


class Rooms:
    """The group rooms of a running gateway.

    Args:
        files: the room directory of the root.
        dispatcher: the DispatcherActor.
        roster: the RosterActor.
        notifier: the subscribers' Notifier (room events).
    """

    def __init__(
        self,
        files: RoomFiles,
        *,
        dispatcher: pykka.ActorRef[Any],
        roster: pykka.ActorRef[Any],
        notifier: Notifier,
    ) -> None:
        self.files = files
        self.dispatcher = dispatcher
        self.roster = roster
        self.notifier = notifier
        self._lock = threading.Lock()
        self._rooms: dict[str, tuple[str, pykka.ActorRef[Any]]] = {}  # room id → (name, RoomActor)
        self._broken: str | None = None  # why the room directory is refused
        self._owner: TurnLock | None = None  # held while this gateway drives the root's rooms

    def _snapshot(self) -> RosterSnapshot:
        return ask(self.roster, GetSnapshot(), timeout=_ASK_TIMEOUT, expect=RosterSnapshot)

    def _start_actor(self, record: RoomRecord, snapshot: RosterSnapshot, *, began: bool) -> pykka.ActorRef[Any]:
        return RoomActor.start(record, files=self.files, dispatcher=self.dispatcher, notifier=self.notifier,
                               snapshot=snapshot, began=began)

    def start(self) -> int:
        """Resume every room on disk (a round cut short by a crash goes on); returns how many."""
        try:
            self.files.ensure()
            owner = self.files.owner_lock()
            if owner.acquire(time.monotonic()) is None:
                owner.close()
                self._broken = self.files.owned_elsewhere()
                return 0
        except (HostileFileError, StoreError, OSError) as exc:
            self._broken = f"the room directory is refused ({exc})"
            return 0
        self._owner = owner
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
        return len(self._rooms)

    def _usable(self) -> None:
        if self._broken is not None:
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
            self.files.write(record)  # on disk before the caller hears of it
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

    def halt(self) -> None:
        """Start no further member turns (the gateway is stopping); running ones still report."""
        with self._lock:
            refs = [ref for _, ref in self._rooms.values()]
        for ref in refs:
            try:
                ask(ref, Halt(), timeout=_ASK_TIMEOUT)
            except ActorGone:
                continue

    def stop(self) -> None:
        """Stop every RoomActor once it handled what it was told before (their files stay)."""
        with self._lock:
            refs = [ref for _, ref in self._rooms.values()]
            self._rooms.clear()
        for ref in refs:
            try:
                ref.stop(block=True, timeout=10)
            except (pykka.Timeout, pykka.ActorDeadError):
                continue
        if self._owner is not None:
            self._owner.release()
            self._owner.close()
            self._owner = None
