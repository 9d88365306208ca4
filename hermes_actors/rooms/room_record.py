"""The room record: one room as its file holds it, and the pure check of a decoded room file.

:func:`parse_room` is the only way a decoded file becomes a :class:`RoomRecord`: anything
missing, of the wrong type or inconsistent is a ``ValidationError`` (the reader,
:class:`hermes_actors.rooms.store.RoomFiles`, then quarantines the file). The format is in
docs/rooms.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hermes_actors.core.ids import is_delivery_id
from hermes_actors.errors import ValidationError
from hermes_actors.rooms.rules import MAX_MEMBERS, MAX_ROUNDS, MIN_MEMBERS, USER, name_problem

__all__ = ["FORMAT_VERSION", "RoomRecord", "parse_room"]

FORMAT_VERSION = 1
ENTRY_STATUSES = ("said", "failed", "interrupted")  # a transcript entry's ``status``


@dataclass
class RoomRecord:
    """One room as its file holds it (owned and mutated by its RoomActor only).

    Attributes:
        room_id: 32 lowercase hex chars (the file's name).
        name: the room's name (its members' session is ``Group: <name>``).
        members: the members' folder ids, in order.
        handles: folder id → handle (the author names in the transcript).
        created_at: wall-clock time of creation.
        state: ``idle`` | ``busy`` | ``needs_you``.
        transcript: ``{message_id, author, text, at, round, status}`` entries, oldest first.
        seen: folder id → how many transcript entries (counted by ``base + index``) it had read.
        base: how many entries were trimmed off the front of ``transcript``.
        sends: accepted sends whose rounds have not started: ``{message_id, sender, mentioned}``.
        active: the current round (``rules.Round.as_dict``) or None.
        running: the member turn in flight ``{member, turn_id, upto}`` or None.
        needs_you: a reply mentioned ``@user`` since the human last wrote.
    """

    room_id: str
    name: str
    members: list[str]
    handles: dict[str, str]
    created_at: float
    state: str = "idle"
    transcript: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    base: int = 0
    sends: list[dict[str, Any]] = field(default_factory=list)
    active: dict[str, Any] | None = None
    running: dict[str, Any] | None = None
    needs_you: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION, "room_id": self.room_id, "name": self.name, "members": self.members,
            "handles": self.handles, "created_at": self.created_at, "state": self.state,
            "transcript": self.transcript, "seen": self.seen, "base": self.base, "sends": self.sends,
            "active": self.active, "running": self.running, "needs_you": self.needs_you,
        }

    def copy(self) -> RoomRecord:
        """A copy that later changes to this record leave alone.

        Its lists and dicts are new; the transcript entries, sends, ``active`` and
        ``running`` dicts are shared: the RoomActor and the file's writer only ever
        replace those, never change one in place.
        """
        return replace(self, members=list(self.members), handles=dict(self.handles),
                       transcript=list(self.transcript), seen=dict(self.seen), sends=list(self.sends))

    def summary(self) -> dict[str, Any]:
        """The public room dict: ``room_id``, ``name``, ``members`` (handles), ``state``."""
        return {"room_id": self.room_id, "name": self.name,
                "members": [self.handles[m] for m in self.members], "state": self.state}

    def activity(self) -> dict[str, Any]:
        """``messages`` (every transcript entry ever posted, trimmed ones too) and ``last_activity``
        (the newest entry's ``at``, else ``created_at``)."""
        last = self.transcript[-1]["at"] if self.transcript else self.created_at
        return {"messages": self.base + len(self.transcript), "last_activity": last}


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ValidationError(f"room file: {what}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _entry_ok(entry: Any, authors: set[str]) -> bool:
    """Pure: whether a transcript entry is one the RoomActor could have posted.

    Args:
        entry: the decoded entry.
        authors: ``user`` and the members' handles.
    """
    if not isinstance(entry, dict):
        return False
    number = entry.get("round")
    return (is_delivery_id(entry.get("message_id")) and entry.get("author") in authors
            and isinstance(entry.get("text"), str) and _number(entry.get("at"))
            and isinstance(number, int) and not isinstance(number, bool) and 0 <= number <= MAX_ROUNDS
            and entry.get("status") in ENTRY_STATUSES)


def parse_room(data: Any, *, file_id: str | None = None) -> RoomRecord:
    """Pure: check a decoded room file and build its record.

    Args:
        data: the decoded JSON.
        file_id: the id in the file's name (must match ``room_id``).

    Returns:
        The record.

    Raises:
        ValidationError: anything is missing, of the wrong type or inconsistent.
    """
    _need(isinstance(data, dict), "not an object")
    _need(data.get("version") == FORMAT_VERSION, f"unsupported version {data.get('version')!r}")
    room_id = data.get("room_id")
    _need(is_delivery_id(room_id), "bad room_id")
    _need(file_id is None or room_id == file_id, "room_id does not match the file name")
    name = data.get("name")
    _need(name_problem(name, new=False) is None, f"bad name ({name_problem(name, new=False)})")
    members, handles = data.get("members"), data.get("handles")
    _need(isinstance(members, list) and all(isinstance(m, str) for m in members), "bad members")
    _need(MIN_MEMBERS <= len(members) <= MAX_MEMBERS and len(set(members)) == len(members), "bad member count")
    _need(isinstance(handles, dict) and all(isinstance(handles.get(m), str) for m in members), "bad handles")
    _need(data.get("state") in ("idle", "busy", "needs_you"), "bad state")
    transcript = data.get("transcript")
    authors = {USER, *(handles[m] for m in members)}
    _need(isinstance(transcript, list), "bad transcript")
    for index, entry in enumerate(transcript):
        _need(_entry_ok(entry, authors), f"bad transcript entry {index} (message_id, author, text, at, round "
                                         f"0-{MAX_ROUNDS} and status {'/'.join(ENTRY_STATUSES)} expected)")
    seen = data.get("seen")
    _need(isinstance(seen, dict) and all(isinstance(v, int) and k in members for k, v in seen.items()), "bad seen")
    base = data.get("base")
    _need(isinstance(base, int) and base >= 0, "bad base")
    sends = data.get("sends")
    _need(isinstance(sends, list) and all(
        isinstance(s, dict) and isinstance(s.get("message_id"), str)
        and (s.get("sender") == USER or s.get("sender") in members)
        and isinstance(s.get("mentioned"), list) and all(m in members for m in s["mentioned"])
        for s in sends), "bad sends")
    active = data.get("active")
    _need(active is None or (
        isinstance(active, dict) and isinstance(active.get("send"), str) and isinstance(active.get("round"), int)
        # an active round always has a member to take the next turn (rules.open_round / after_turn)
        and isinstance(active.get("queue"), list) and active["queue"] and all(m in members for m in active["queue"])
        and isinstance(active.get("mentioned"), list) and all(m in members for m in active["mentioned"])
        and isinstance(active.get("said"), int) and isinstance(active.get("posted"), int)
        and isinstance(active.get("needs_you"), bool)), "bad active round")
    running = data.get("running")
    _need(running is None or (
        isinstance(running, dict) and running.get("member") in members and is_delivery_id(running.get("turn_id"))
        and isinstance(running.get("upto"), int)), "bad running turn")
    _need(isinstance(data.get("needs_you"), bool), "bad needs_you")
    created = data.get("created_at")
    _need(isinstance(created, int | float), "bad created_at")
    return RoomRecord(room_id, name.strip(), list(members), dict(handles), float(created), data["state"],
                      list(transcript), dict(seen), base, list(sends), active, running, data["needs_you"])
