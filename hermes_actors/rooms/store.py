"""Room files: ``<root>/bot_relay/rooms/<room_id>.json``, one per room (format in docs/rooms.md).

Every write replaces the whole file atomically (0600, fsync'd in durable mode)
through :func:`hermes_actors.store.atomic.atomic_write_json`; every read goes
through :func:`hermes_actors.store.atomic.read_json_file`, so a symlink, a file
of another owner, a huge or corrupt file is refused, and then moved aside into
``bot_relay/quarantine/`` like a hostile relay file. The shape of a record is
checked by :func:`parse_room` before anything trusts it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from hermes_actors.core.ids import id_of_file_name, is_delivery_id
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.rooms.rules import MAX_MEMBERS, MIN_MEMBERS, USER, find_room, name_problem, no_room
from hermes_actors.store.atomic import atomic_write_bytes, ensure_private_dir, read_json_file
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_quarantine import quarantine

__all__ = [
    "FORMAT_VERSION",
    "MAX_PENDING_SENDS",
    "ROOMS_DIR",
    "ROOM_MAX_BYTES",
    "ROOM_WRITE_BUDGET",
    "STARTED_DIR",
    "TRANSCRIPT_KEEP",
    "UNDELIVERED_BUDGET",
    "RoomFiles",
    "RoomRecord",
    "RoomStartMarks",
    "RoomsOnDisk",
    "fit_room",
    "parse_room",
    "room_author",
    "room_of_author",
    "undelivered_bytes",
    "undelivered_from",
]

FORMAT_VERSION = 1
ROOMS_DIR = "rooms"  # under bot_relay/
STARTED_DIR = ".started"  # under rooms/: ``<turn_id>.json`` marks a member turn that began (RoomStartMarks)
_AUTHOR_PREFIX = "room:"  # a member turn's ``Delivery.author["id"]`` is ``room:<room_id>``
TRANSCRIPT_KEEP = 500  # newest transcript entries kept in the file
# The writer keeps every room file at most this big by dropping the oldest transcript entries: 500
# entries of 16,000 characters can be 24+ MB of UTF-8 (far more escaped), so the count alone bounds nothing.
ROOM_WRITE_BUDGET = 4 << 20
# The reader refuses a larger file (hostile); 4x the writer's budget, so whatever the writer wrote loads.
ROOM_MAX_BYTES = 16 << 20
# Acked sends whose rounds have not started (each a small dict): capped so that everything but the
# transcript stays far below ROOM_WRITE_BUDGET (1,000 sends are well under 1 MiB).
MAX_PENDING_SENDS = 1000
# Acked sends whose rounds have not ended are never dropped or cut: room_send refuses a send that would make
# their own text more than this, leaving the rest of ROOM_WRITE_BUDGET to the members' replies (fit_room).
UNDELIVERED_BUDGET = ROOM_WRITE_BUDGET // 2


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


def _entry_ok(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("message_id"), str)
            and isinstance(entry.get("author"), str) and isinstance(entry.get("text"), str)
            and isinstance(entry.get("at"), int | float) and isinstance(entry.get("round"), int))


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
    _need(isinstance(transcript, list) and all(_entry_ok(e) for e in transcript), "bad transcript")
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


def _undelivered_ids(record: RoomRecord) -> set[Any]:
    """Pure: the message ids of the sends whose rounds have not ended (the active round's, and those waiting)."""
    waiting = {send.get("message_id") for send in record.sends}
    if record.active is not None:
        waiting.add(record.active.get("send"))
    return waiting


def undelivered_from(record: RoomRecord) -> int:
    """Pure: the index in ``record.transcript`` of the oldest send whose round has not ended (the active
    round's, or one still waiting); ``len(transcript)`` when there is none. No entry from there on is
    dropped (positions are ``base`` + index: only the front can go)."""
    waiting = _undelivered_ids(record)
    for index, entry in enumerate(record.transcript):
        if entry.get("message_id") in waiting:
            return index
    return len(record.transcript)


def undelivered_bytes(record: RoomRecord) -> int:
    """Pure: the JSON bytes of the sends whose rounds have not ended (what the writer keeps whole)."""
    waiting = _undelivered_ids(record)
    return sum(len(orjson.dumps(entry)) + 1 for entry in record.transcript if entry.get("message_id") in waiting)


def _cut_note(chars: int) -> str:
    return f"[{chars:,} characters dropped to keep the room's file small]"


def fit_room(record: RoomRecord, *, keep: int = TRANSCRIPT_KEEP, budget: int = ROOM_WRITE_BUDGET) -> bytes:
    """Drop the oldest transcript entries until the record fits; return its file content.

    At most ``keep`` entries stay, and no more than fit in ``budget`` bytes of JSON
    (the newest ones that fit; the newest one always stays). Dropped entries are
    counted into ``record.base``, so every absolute position (``seen``,
    ``running.upto``: ``base`` + index) still names the same entry. An acked send
    whose round has not ended, and what follows it, is never dropped
    (:func:`undelivered_from`); when that part alone is over ``budget``, the oldest
    replies in it have their text cut to a note instead (the undelivered sends stay
    whole: ``room_send`` refuses past :data:`UNDELIVERED_BUDGET`).

    Args:
        record: the room; its ``transcript`` and ``base`` are changed in place.
        keep: the most entries kept.
        budget: the most bytes of the file, as far as dropping entries and cutting replies can reach it.

    Returns:
        The record as the JSON bytes of its file.

    Raises:
        TypeError: the record is not serializable (orjson).
    """
    droppable = min(undelivered_from(record), len(record.transcript) - 1)
    drop = max(0, min(len(record.transcript) - keep, droppable))
    data = orjson.dumps(record.as_dict()) if drop == 0 else b""
    if drop == 0 and len(data) <= budget:
        return data  # the common case: one serialization
    kept = record.transcript[drop:]
    sizes = [len(orjson.dumps(entry)) + 1 for entry in kept]  # + 1: the comma between entries
    size = len(orjson.dumps({**record.as_dict(), "transcript": []})) + sum(sizes)
    extra = 0
    while size > budget and drop + extra < droppable:
        size -= sizes[extra]
        extra += 1
    drop += extra
    if drop:
        del record.transcript[:drop]
        record.base += drop
    if size > budget:
        # Still too big: members' replies posted after a send still waiting (verbose members, many sends) cannot
        # be dropped from the front. Their texts are cut instead, oldest first, keeping every entry (positions)
        # and every undelivered send whole (room_send keeps those under UNDELIVERED_BUDGET).
        size = _cut_replies(record, size, budget, sizes[extra:])
    return orjson.dumps(record.as_dict())


def _cut_replies(record: RoomRecord, size: int, budget: int, sizes: list[int]) -> int:
    """Replace the texts of the oldest entries that are not undelivered sends by a short note until the record
    fits ``budget`` (``sizes``: the JSON bytes of each entry of ``record.transcript``); returns the new size."""
    waiting = _undelivered_ids(record)
    for index, entry in enumerate(record.transcript[:-1]):  # the newest entry always stays whole
        if size <= budget:
            break
        text = entry.get("text")
        if entry.get("message_id") in waiting or not isinstance(text, str):
            continue
        cut = {**entry, "text": _cut_note(len(text))}
        new_size = len(orjson.dumps(cut)) + 1
        if new_size >= sizes[index]:
            continue  # already short (or a note): cutting saves nothing
        record.transcript[index] = cut
        size -= sizes[index] - new_size
        sizes[index] = new_size
    return size


def room_author(room_id: str, name: str) -> dict[str, Any]:
    """Pure: the ``Delivery.author`` of a member turn of room ``room_id`` (:func:`room_of_author` reads it)."""
    return {"id": f"{_AUTHOR_PREFIX}{room_id}", "name": name, "is_bot": False}


def room_of_author(author: Any) -> str:
    """Pure: the room id in a member turn's ``Delivery.author`` ("" when there is none)."""
    ident = author.get("id") if isinstance(author, dict) else None
    return ident.removeprefix(_AUTHOR_PREFIX) if isinstance(ident, str) and ident.startswith(_AUTHOR_PREFIX) else ""


class RoomFiles:
    """The room directory of one root: list, read (hostile → quarantined), write, remove.

    Args:
        root: the Hermes root.
        fsync: fsync every write (durable mode).
    """

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.relay = RelayPaths.from_root(root)
        self.directory = self.relay.base / ROOMS_DIR
        self.fsync = fsync

    def ensure(self) -> RoomFiles:
        """Create ``rooms/`` and the temp directory (0700), refusing hostile ones.

        Raises:
            HostileFileError: a symlink, a file or a directory of another owner.
            StoreError: it could not be created.
        """
        ensure_private_dir(self.relay.tmp, within=self.relay.root)
        ensure_private_dir(self.directory, within=self.relay.root)
        return self

    def path(self, room_id: str) -> Path:
        """``rooms/<room_id>.json`` for a valid id (ValidationError otherwise: no path tricks)."""
        if not is_delivery_id(room_id):
            raise ValidationError(f"bad room id {room_id!r}: expected 32 lowercase hex characters")
        return self.directory / f"{room_id}.json"

    def write(self, record: RoomRecord) -> None:
        """Replace the room's file atomically, within :data:`ROOM_WRITE_BUDGET` (:func:`fit_room`).

        Args:
            record: the room; its oldest transcript entries may be dropped (``base`` counts them).

        Raises:
            StoreError: it could not be written, or it would be larger than the reader
                accepts (:data:`ROOM_MAX_BYTES`): a file the next start would quarantine is never written.
            HostileFileError: the directory was swapped for a symlink or another uid's.
        """
        path = self.path(record.room_id)
        try:
            data = fit_room(record)
        except TypeError as exc:
            raise StoreError(f"room file {path} could not be serialized: {exc}") from exc
        if len(data) > ROOM_MAX_BYTES:
            raise StoreError(f"room file {path} would be {len(data)} bytes, more than the {ROOM_MAX_BYTES} a room "
                             "file may have; it was not written")
        atomic_write_bytes(path, data, tmp_dir=self.relay.tmp, fsync=self.fsync, within=self.relay.base)

    def start_mark(self, turn_id: str) -> Path:
        """``rooms/.started/<turn_id>.json``: present once the member turn ``turn_id`` began."""
        if not is_delivery_id(turn_id):
            raise ValidationError(f"bad turn id {turn_id!r}: expected 32 lowercase hex characters")
        return self.directory / STARTED_DIR / f"{turn_id}.json"

    def began(self, turn_id: str) -> bool:
        """Whether the member turn ``turn_id`` may have begun: its start mark is there (whatever it is)."""
        try:
            return os.path.lexists(self.start_mark(turn_id))
        except ValidationError:
            return True  # not ours to judge: counted as begun, so it is never run twice

    def forget_start(self, turn_id: str) -> None:
        """Remove the start mark of a member turn the room file no longer holds as ``running``."""
        try:
            os.unlink(self.start_mark(turn_id))
        except FileNotFoundError:
            pass
        except (OSError, ValidationError) as exc:  # a leftover mark is swept at the next start
            logger.warning("room turn {}: its start mark could not be removed ({})", turn_id, exc)

    def sweep_starts(self, running: set[str]) -> None:
        """Remove every start mark but those of the ``running`` turns (a crash left them behind)."""
        try:
            names = os.listdir(self.directory / STARTED_DIR)
        except OSError:
            return
        for name in names:
            turn_id = id_of_file_name(name)
            if turn_id is not None and turn_id not in running:
                self.forget_start(turn_id)

    def load_all(self, *, move_bad: bool = True) -> list[RoomRecord]:
        """Every valid room file; a hostile or invalid one is quarantined and skipped (logged).

        Args:
            move_bad: quarantine what is refused; False (a reader that drives no room) leaves
                it where it is for the gateway to quarantine.

        Returns:
            The records, oldest first.
        """
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        records: list[RoomRecord] = []
        for name in names:
            path = self.directory / name
            room_id = id_of_file_name(name)
            if room_id is None:
                if not name.startswith(".") and move_bad:
                    quarantine(self.relay, path, "not a room file name")
                continue
            try:
                records.append(parse_room(read_json_file(path, max_bytes=ROOM_MAX_BYTES), file_id=room_id))
            except FileNotFoundError:
                continue
            except (HostileFileError, ValidationError, OSError) as exc:
                logger.warning("room file {} refused: {}", path, exc)
                if move_bad:
                    quarantine(self.relay, path, str(exc))
        return self._unique(sorted(records, key=lambda r: (r.created_at, r.room_id)), move_bad=move_bad)

    def _unique(self, records: list[RoomRecord], *, move_bad: bool) -> list[RoomRecord]:
        """Keep the oldest room of each name (names are unique, case-insensitive); set the others aside.

        Args:
            records: the valid rooms, oldest first (ties: by id), so the same one stays at every start.
            move_bad: quarantine the others (else only skip them).

        Returns:
            The rooms with distinct names, oldest first.
        """
        kept: dict[str, RoomRecord] = {}
        for record in records:
            first = kept.setdefault(record.name.lower(), record)
            if first is record:
                continue
            why = (f"room {record.room_id} is named {record.name!r} like the older room {first.room_id} "
                   f"({first.name!r}; names are unique, case-insensitive)")
            logger.warning("room file {} refused: {}", self.path(record.room_id), why)
            if move_bad:  # the file is kept in quarantine/: rename the room there and move it back to keep it
                quarantine(self.relay, self.path(record.room_id), why)
        return list(kept.values())

    def remove(self, room_id: str) -> None:
        """Delete the room's file (gone already: nothing to do)."""
        try:
            os.unlink(self.path(room_id))
        except FileNotFoundError:
            pass


class RoomStartMarks:
    """The journal-shaped recorder a ProfileActor hands to a room's member turn.

    ``execute_turn`` calls ``append_durably({"t": "started", "id": <turn id>})``
    right before the runner runs; here that writes ``rooms/.started/<turn_id>.json``.
    After a kill -9 the room's ``running`` turn with a mark may have run (it is shown
    interrupted, never run twice); one without a mark never began (it was queued
    behind the member's DMs) and runs at the next start. A turn of a room that was
    disbanded while it waited is refused here, so it never runs.

    Args:
        root: the Hermes root.
        room_id: the turn's room (:func:`room_of_author`).
        fsync: flush the mark to stable storage before the turn runs (a kill -9 finds
            it either way: the kernel keeps it).
    """

    def __init__(self, root: Path, room_id: str, *, fsync: bool = True) -> None:
        self.files = RoomFiles(root, fsync=fsync)
        self.room_id = room_id

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None:
        """Record a member turn's start.

        Args:
            record: ``{"t": "started", "id": <turn id>, ...}``; other kinds are ignored.
            timeout: unused (the write is synchronous).

        Raises:
            StoreError: the room is gone (disbanded), or the mark could not be written or
                was refused (a hostile directory): the turn must then not run.
        """
        if record.get("t") != "started":
            return
        turn_id = str(record.get("id"))
        files = self.files
        try:
            if not os.path.lexists(files.path(self.room_id)):  # disbanded while the turn was queued
                raise StoreError(f"room {self.room_id} was disbanded: its member turn {turn_id} does not run")
            mark = files.start_mark(turn_id)
            ensure_private_dir(mark.parent, within=files.relay.root)
            atomic_write_bytes(mark, orjson.dumps({"turn_id": turn_id, "room_id": self.room_id}),
                               tmp_dir=files.relay.tmp, fsync=files.fsync, within=files.relay.base)
        except StoreError:
            raise
        except ValidationError as exc:  # a bad id, or a hostile directory (HostileFileError)
            raise StoreError(f"the start mark of room turn {turn_id} was refused: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"the start mark of room turn {turn_id} could not be written: {exc}") from exc


class RoomsOnDisk:
    """The read-only room calls (``list_rooms``, ``room_transcript``) answered from the room files.

    For a reader with no gateway (``hermes-actors room list|show`` when no host serves
    the root): nothing is started, no round resumes, no turn runs and no file is
    changed. The answers are those of :class:`hermes_actors.gateway.Gateway` as of the
    files' last write.

    Args:
        root: the Hermes root.
    """

    def __init__(self, root: Path) -> None:
        self.files = RoomFiles(root, fsync=False)

    def _records(self) -> list[RoomRecord]:
        """The valid rooms.

        Raises:
            RuntimeError: the room directory is refused (a symlink, another uid's), naming it.
        """
        if not os.path.lexists(self.files.directory):
            return []  # no room was ever made on this root
        try:
            ensure_private_dir(self.files.directory, within=self.files.relay.root)  # it exists: only checked
        except (HostileFileError, StoreError, OSError) as exc:
            raise RuntimeError(f"rooms are unavailable: the room directory is refused ({exc})") from exc
        return self.files.load_all(move_bad=False)

    def list_rooms(self) -> list[dict[str, Any]]:
        """See :meth:`hermes_actors.gateway.Gateway.list_rooms`."""
        return [{**r.summary(), **r.activity()} for r in self._records()]

    def room_transcript(self, room: Any) -> list[dict[str, Any]]:
        """See :meth:`hermes_actors.gateway.Gateway.room_transcript` (KeyError naming an unknown room)."""
        records = {r.room_id: r for r in self._records()}
        room_id = find_room(((r.room_id, r.name) for r in records.values()), room)
        if room_id is None:
            raise no_room(room)
        return [dict(e) for e in records[room_id].transcript]
