"""RoomActor: one per room; owns the room's record and file, and runs its rounds.

The decisions are :mod:`hermes_actors.rooms.rules`; this actor applies them.
Every member turn goes to the Dispatcher as a :class:`RoomTurn`, so it runs on
the member's ProfileActor, queued behind its DMs (one turn at a time per bot),
with the same runner. Nothing polls: a turn's outcome arrives as a message.

Exactly once: a send is on disk before its ack; a member turn is on disk as
``running`` before it is submitted; its reply, the member's read position and
the round's next step are written in one atomic replace. After a crash a
``running`` turn that began (its start mark, :class:`~hermes_actors.rooms.store.RoomStartMarks`)
is never run again: it is shown as interrupted and the round goes on; one that
never began (queued behind the member's DMs) runs now.

A write that fails (the directory swapped for a symlink, the disk full) stops
nothing for good: a send it was for is refused and leaves no trace, no member
turn starts until a write succeeds, and the room writes again at its next send
or turn result (the file still holding the last written state, a crash in
between loses nothing acked and runs no turn twice).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pykka
from loguru import logger

from actors import TypedActor, handles, tell
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.targets import MESSAGE_MAX_CHARS, Refusal, refuse, resolve_local
from hermes_actors.errors import HostileFileError, RoomStopped, StoreError
from hermes_actors.local.notifier import Notifier
from hermes_actors.messages import (
    ROOM_ORIGIN,
    AwaitIdle,
    Delivery,
    Disband,
    GetSummary,
    GetTranscript,
    Halt,
    MemberTurnDone,
    Notify,
    Outcome,
    RoomSend,
    RoomTurn,
    RosterSnapshot,
)
from hermes_actors.rooms.file_budget import MAX_PENDING_SENDS, UNDELIVERED_BUDGET, undelivered_bytes
from hermes_actors.rooms.room_record import RoomRecord
from hermes_actors.rooms.rules import (
    USER,
    Round,
    Spoken,
    after_turn,
    failed_turn_text,
    find_mentions,
    interrupted_turn_text,
    not_disbanded,
    open_round,
    room_session,
    send_refusal,
    turn_text,
    unrecorded,
)
from hermes_actors.rooms.store import RoomFiles
from hermes_actors.rooms.turn_author import room_author

__all__ = ["INTERRUPTED_TEXT", "RoomActor", "round_of"]

# What a start posts for a turn its file holds as "running" with a start mark: the gateway that handed it out stopped
# (or was killed) during it, or after it but before its result was written. A turn settled ambiguous while the
# gateway runs (its member's ProfileActor crashed settling it, a stop's grace ran out) gets its outcome's why.
INTERRUPTED_TEXT = interrupted_turn_text("The gateway stopped before this turn's result was recorded.")


def round_of(active: dict[str, Any] | None) -> Round | None:
    """Pure: the :class:`Round` a record's ``active`` dict holds."""
    if active is None:
        return None
    return Round(active["send"], active["round"], tuple(active["queue"]), active["said"], active["posted"],
                 tuple(active["mentioned"]), active["needs_you"])


class RoomActor(TypedActor):
    """Serializes everything that happens in one room.

    Args:
        record: the room (new, or loaded from its file).
        files: the room directory.
        dispatcher: the DispatcherActor (member turns).
        notifier: the subscribers' Notifier (room events for ``subscribe`` callbacks).
        snapshot: the roster (names resolve against it; each send brings a fresh one).
        began: the record's ``running`` turn may have begun (its start mark was there when
            the gateway started; :meth:`~hermes_actors.rooms.store.RoomFiles.began`).
    """

    def __init__(
        self,
        record: RoomRecord,
        *,
        files: RoomFiles,
        dispatcher: pykka.ActorRef[Any],
        notifier: Notifier,
        snapshot: RosterSnapshot,
        began: bool,
    ) -> None:
        super().__init__()
        self.record = record
        self.files = files
        self.dispatcher = dispatcher
        self.notifier = notifier
        self.snapshot = snapshot
        self.began = began
        self.halted = False  # the gateway is stopping (or the room was disbanded): no turn starts any more
        self.unwritten: str | None = None  # why the last write of the record failed; None: its file holds it
        self.shown = record.copy()  # the record as its file holds it: what transcript and summary answer
        self.waiters: list[pykka.ThreadingFuture[str]] = []
        self.events: list[dict[str, Any]] = []  # published once the record holding them is on disk
        self.done_marks: list[str] = []  # start marks of settled turns: removed once the record saying so is on disk

    def on_start(self) -> None:
        running = self.record.running
        if running is not None:  # the previous process died with this turn handed out
            self.record.running = None
            self.done_marks.append(running["turn_id"])
            member = running["member"]
            if not self.began:
                # No start mark: it was still queued (behind the member's DMs) and never ran. The member is
                # still first in the round's queue and has not read a thing: _advance runs it now.
                logger.info("room {}: the turn of {} never began before the restart; it runs now",
                            self.record.name, member)
            else:  # it may have run: never run it again
                active = round_of(self.record.active)
                self._post(self.record.handles[member], INTERRUPTED_TEXT, active.number if active else 0,
                           "interrupted")
                self.record.seen[member] = running["upto"]
                if active is not None and member in active.queue:
                    self._step(active, member, Spoken(False))
        self._advance()

    def on_stop(self) -> None:
        # A waiter must not sit out its whole timeout on a room nobody will advance any more.
        error = RoomStopped(f"room {self.record.name!r} stopped before it became idle (the gateway stopped, or the "
                            "room's actor failed and restarts); its rounds go on from its file: wait again")
        for future in self.waiters:
            future.set_exception(exc_info=(RoomStopped, error, None))
        self.waiters.clear()

    # ── helpers ─────────────────────────────────────────────────────────────

    def _resolve(self, name: str) -> str | None:
        return resolve_local(name, self.snapshot)

    def _post(self, author: str, text: str, number: int, status: str) -> dict[str, Any]:
        entry = {"message_id": new_delivery_id(), "author": author, "text": text, "at": time.time(),
                 "round": number, "status": status}
        record = self.record
        record.transcript.append(entry)  # the file's writer drops the oldest entries (file_budget.fit_room)
        self.events.append({"event": "message", "message": dict(entry)})
        return entry

    def _end(self) -> int:
        return self.record.base + len(self.record.transcript)

    def _save(self) -> None:
        """Write the record, then drop the settled turns' start marks and publish the events it holds.

        Raises:
            StoreError, HostileFileError: the file could not be written (nothing else was done).
        """
        self.files.write(self.record)
        self.shown = self.record.copy()
        if self.unwritten is not None:
            logger.info("room {}: its file is written again; its rounds go on", self.record.name)
            self.unwritten = None
        for turn_id in self.done_marks:  # only now: a turn still "running" on disk must keep its mark
            self.files.forget_start(turn_id)
        self.done_marks.clear()
        for event in self.events:
            self.notifier.tell(Notify({"kind": "room", "room_id": self.record.room_id, "room": self.record.name,
                                        **event}))
        self.events.clear()

    def _set_state(self, state: str) -> None:
        if state != self.record.state:
            self.record.state = state
            self.events.append({"event": "state", "state": state})

    def _step(self, active: Round, member: str, spoken: Spoken) -> None:
        """Apply one member's turn (or pass) to the round; note ``@user`` for when the send settles."""
        if spoken.mentions_user:
            self.record.needs_you = True
        nxt = after_turn(active, self.record.members, member, spoken)
        self.record.active = nxt.as_dict() if nxt is not None else None

    def _news(self, member: str) -> list[tuple[str, str]]:
        """(author label, text) of the messages ``member`` has not read, its own excluded."""
        record = self.record
        start = max(record.seen.get(member, 0), record.base) - record.base
        mine = record.handles[member]
        return [(e["author"] if e["author"] == USER else f"@{e['author']}", e["text"])
                for e in record.transcript[start:] if e.get("status") == "said" and e["author"] != mine]

    # ── the rounds ──────────────────────────────────────────────────────────

    def _advance(self) -> None:
        """Start the next member turn, or settle; writes the record exactly once either way."""
        record = self.record
        while not self.halted and record.running is None:
            active = round_of(record.active)
            if active is None:
                if not record.sends:
                    self._set_state("needs_you" if record.needs_you else "idle")
                    break
                send = record.sends.pop(0)
                record.active = open_round(send["message_id"], record.members, send["sender"],
                                           send["mentioned"]).as_dict()
                continue
            member = active.queue[0]
            news = self._news(member)
            if not news:  # nothing new since its last turn: a pass without a turn
                self._step(active, member, Spoken(False))
                continue
            self._start_turn(member, news)
            return
        if self._save_quietly() and record.state != "busy":
            for future in self.waiters:
                future.set(record.state)
            self.waiters.clear()

    def _save_quietly(self) -> bool:
        """Write the record (:meth:`_save`) unless its file holds it already; a failure is logged and remembered,
        not raised.

        A record that did not change since it was loaded or last written is not written again (before, every
        start rewrote every room's file, idle ones too: on a full disk each logged a failed write).

        Returns:
            Whether the file now holds the record.
        """
        if self.unwritten is None and self.record == self.shown and not self.events and not self.done_marks:
            return True  # nothing changed: its file holds it as it is
        try:
            self._save()
        except (StoreError, HostileFileError) as exc:
            self._unwritable("could not write its file", exc)
            return False
        return True

    def _unwritable(self, what: str, exc: Exception) -> None:
        """Remember why the record could not be written; log it once per reason.

        The record stays as it is in memory (a member turn that was not recorded was not
        started); the next send or turn result writes it again, and nothing waits in a loop.
        """
        why = str(exc)
        if why != self.unwritten:
            logger.error("room {}: {} ({}); no member turn starts until it is written again, at the room's next "
                         "send or turn result", self.record.name, what, why)
        self.unwritten = why

    def _start_turn(self, member: str, news: list[tuple[str, str]]) -> None:
        record = self.record
        turn_id = new_delivery_id()
        record.running = {"member": member, "turn_id": turn_id, "upto": self._end()}
        self._set_state("busy")
        try:
            self._save()  # on disk before it runs: after a crash it is interrupted, never run twice
        except (StoreError, HostileFileError) as exc:
            record.running = None  # never handed out: a later write records a new turn of the same member
            self._unwritable(f"could not record the turn of {member}", exc)
            return
        handle = record.handles[member]
        handles = [record.handles[m] for m in record.members]
        delivery = Delivery(
            delivery_id=turn_id,
            sender="",
            sender_handle="",
            target=member,
            target_handle=handle,
            content=turn_text(record.name, handles, news),
            author=room_author(record.room_id, record.name),
            accepted_at=time.time(),
            origin=ROOM_ORIGIN,
            label=f"@{handle} in room '{record.name}'",
            session=room_session(record.name),
        )
        me = self.actor_ref

        def reply(outcome: Outcome) -> None:
            tell(me, MemberTurnDone(turn_id, outcome))

        if not tell(self.dispatcher, RoomTurn(delivery, reply)):
            self.halted = True  # the gateway is going away; the turn stays "running" → interrupted on restart

    @handles(MemberTurnDone)
    def _on_turn_done(self, msg: MemberTurnDone) -> None:
        record = self.record
        running = record.running
        if running is None or running["turn_id"] != msg.turn_id:
            logger.debug("room {}: outcome of an unknown turn {} ignored", record.name, msg.turn_id)
            return
        record.running = None
        self.done_marks.append(running["turn_id"])
        outcome = msg.outcome
        if outcome.status == "failed" and outcome.reason == "cancelled":
            self._advance()  # it never ran (the gateway is stopping): it stays first in the round, run next start
            return
        member = running["member"]
        handle = record.handles[member]
        active = round_of(record.active)
        number = active.number if active else 0
        record.seen[member] = running["upto"]
        spoken = Spoken(False)
        if outcome.status == "replied":
            text = outcome.reply.strip()[:MESSAGE_MAX_CHARS]
            # seen stays at what the turn read (upto): what others posted while it ran is still news to it
            # (_news leaves its own reply out)
            self._post(handle, text, number, "said")
            mentioned, user = find_mentions(text, record.members, self._resolve)
            spoken = Spoken(True, mentioned, user)
        elif outcome.status == "ambiguous":  # why it is unknown is the outcome's: a crash here, or a stop
            self._post(handle, interrupted_turn_text(outcome.error), number, "interrupted")
        elif outcome.status == "failed":
            logger.warning("room {}: the turn of {} failed [{}]: {}", record.name, handle, outcome.reason,
                           outcome.error)
            self._post(handle, failed_turn_text(outcome.reason, outcome.error), number, "failed")
        if active is not None and member in active.queue:
            self._step(active, member, spoken)
        self._advance()

    # ── the API ─────────────────────────────────────────────────────────────

    @handles(RoomSend)
    def _on_send(self, msg: RoomSend) -> dict[str, Any]:
        if self.halted:
            raise RuntimeError("gateway is not running")
        record = self.record
        before, published = record.copy(), len(self.events)  # what is restored when the write fails
        self.snapshot = msg.snapshot
        who = send_refusal(msg.sender, msg.text, record.members, self._resolve)
        if isinstance(who, Refusal):
            return who.as_dict()
        if len(record.sends) >= MAX_PENDING_SENDS:  # bounds the file (file_budget.MAX_PENDING_SENDS)
            return refuse(f"Room {record.name!r} already has {len(record.sends)} messages waiting for their rounds; "
                          "wait until it is idle (wait_room_idle), then send again.").as_dict()
        text = str(msg.text).strip()
        waiting = undelivered_bytes(record)
        if waiting + len(orjson.dumps(text)) > UNDELIVERED_BUDGET:  # never dropped from the file before read
            return refuse(f"Room {record.name!r} holds {waiting // 1024:,} KiB of messages its rounds have not "
                          f"delivered yet (at most {UNDELIVERED_BUDGET // 1024:,} KiB); wait until it is idle "
                          "(wait_room_idle), then send again. This message was NOT posted.").as_dict()
        mentioned, _ = find_mentions(text, record.members, self._resolve)
        entry = self._post(USER if who == USER else record.handles[who], text, 0, "said")
        record.sends.append({"message_id": entry["message_id"], "sender": who, "mentioned": list(mentioned)})
        if who == USER:
            record.needs_you = False  # the human answered
        # (a member's own send does not mark what others posted before it as read: _news leaves its own out)
        self._set_state("busy")
        if record.running is None:
            self._advance()  # writes the send (and the first turn's start) before the ack below
        else:
            self._save_quietly()
        if self.unwritten is not None:  # the write failed: nothing was accepted, nothing of it stays
            self.record = before
            del self.events[published:]
            raise unrecorded(record.name, "the message", self.unwritten, "sent")
        return {"status": "queued", "room_id": record.room_id, "message_id": entry["message_id"]}

    @handles(GetTranscript)
    def _on_transcript(self, msg: GetTranscript) -> list[dict[str, Any]]:
        return [dict(e) for e in self.shown.transcript]

    @handles(GetSummary)
    def _on_summary(self, msg: GetSummary) -> dict[str, Any]:
        return {**self.shown.summary(), **self.shown.activity()}

    @handles(AwaitIdle)
    def _on_await_idle(self, msg: AwaitIdle) -> pykka.ThreadingFuture[str]:
        future: pykka.ThreadingFuture[str] = pykka.ThreadingFuture()
        if self.shown.state != "busy":  # as its file says: a settle not written yet is not idle yet
            future.set(self.shown.state)
        else:
            self.waiters.append(future)
        return future

    @handles(Halt)
    def _on_halt(self, msg: Halt) -> None:
        self.halted = True

    @handles(Disband)
    def _on_disband(self, msg: Disband) -> dict[str, Any]:
        try:
            self.files.drop(self.record)  # a member turn still queued now never starts (RoomStartMarks)
        except (OSError, HostileFileError) as exc:  # rooms/ swapped for a symlink: nothing deleted, the room goes on
            logger.warning("room {}: not disbanded: {}", self.record.name, exc)
            raise not_disbanded(self.record.name, self.files.path(self.record.room_id), exc) from exc
        self.halted = True
        for future in self.waiters:
            future.set("disbanded")
        self.waiters.clear()
        self.notifier.tell(Notify({"kind": "room", "room_id": self.record.room_id, "room": self.record.name,
                                    "event": "state", "state": "disbanded"}))
        self.stop()
        return {**self.record.summary(), "state": "disbanded"}
