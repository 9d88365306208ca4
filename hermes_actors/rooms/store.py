"""Room files: ``<root>/bot_relay/rooms/<room_id>.json``, one per room (format in docs/rooms.md).

Every write replaces the whole file atomically (0600, fsync'd in durable mode)
through :func:`hermes_actors.store.atomic.atomic_write_json`; every read goes
through :func:`hermes_actors.store.atomic.read_json_file`, so a symlink, a file
of another owner, a huge or corrupt file is refused, and then moved aside into
``bot_relay/quarantine/`` like a hostile relay file. The shape of a record is
checked by :func:`~hermes_actors.rooms.room_record.parse_room` before anything trusts
it; what a write keeps of the transcript is decided by
:func:`~hermes_actors.rooms.file_budget.fit_room`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from hermes_actors.core.ids import id_of_file_name, is_delivery_id
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.rooms.file_budget import fit_room
from hermes_actors.rooms.room_record import RoomRecord, parse_room
from hermes_actors.rooms.rules import find_room, no_room, not_disbanded
from hermes_actors.store.atomic import atomic_write_bytes, read_json_file
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import lexists_below, relay_dir, remove_below
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_protocol import ROOM_STARTS, ROOMS
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.turnlock import TurnLock

__all__ = [
    "OWNER_LOCK",
    "ROOMS_DIR",
    "ROOM_MAX_BYTES",
    "STARTED_DIR",
    "RoomFiles",
    "RoomStartMarks",
    "RoomsOnDisk",
    "rooms_held_text",
]

ROOMS_DIR = ROOMS  # under bot_relay/
OWNER_LOCK = ".owner.lock"  # under rooms/: flocked by the one process that drives the root's rooms
STARTED_DIR = ROOM_STARTS  # under rooms/: ``<turn_id>.json`` marks a member turn that began (RoomStartMarks)
# The reader refuses a larger file (hostile); 4x the writer's budget (file_budget.ROOM_WRITE_BUDGET), so
# whatever the writer wrote loads.
ROOM_MAX_BYTES = 16 << 20
# One process drives a root's rooms (rooms/.owner.lock); its member turns' threads put a refused .started
# right one at a time, so none moves aside the directory another one has just made (and marked a turn in).
_STARTED_REPAIR = threading.Lock()
# The rooms owner locks a Gateway of this process holds (RoomFiles.take_owner_lock), by their file's
# (st_dev, st_ino), each with the pid that took it (a fork's child is another process). A flock is refused to a
# second open file of this process as to another process's: this is how a second Gateway on the root is told
# which of the two drives the rooms.
_HELD_HERE: dict[tuple[int, int], int] = {}
_HELD_HERE_LOCK = threading.Lock()


def rooms_held_text(root: Path, *, in_this_process: bool) -> str:
    """Pure: why room calls are refused while another holder has the rooms owner lock of ``root``.

    Args:
        root: the Hermes root.
        in_this_process: whether another Gateway of this process holds it.

    Returns:
        The reason (callers prefix ``rooms are unavailable: ``).
    """
    if in_this_process:
        return (f"another Gateway in this process drives the rooms of {root} (one Gateway drives a root's rooms): "
                "make the room calls on that one, or stop it first")
    return f"another gateway process drives the rooms of {root}"


def _file_identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


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
        """Replace the room's file atomically, within the writer's budget (:func:`fit_room`).

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

    def owner_lock(self) -> TurnLock:
        """The flock on ``rooms/.owner.lock``: held by the one process that drives the root's rooms."""
        return TurnLock(self.directory / OWNER_LOCK, what="the rooms owner lock")

    def take_owner_lock(self, owner: TurnLock) -> bool:
        """Take :meth:`owner_lock` if it is free right now, for a Gateway that drives the rooms; noted as this
        process's, so :meth:`owned_elsewhere` tells another Gateway of this process so.

        Args:
            owner: the lock, from :meth:`owner_lock`.

        Returns:
            Whether it was taken (let go of it with :meth:`release_owner_lock`).

        Raises:
            OSError: the lock file could not be opened or locked.
        """
        if not owner.try_acquire():
            return False
        if owner.fd is not None:
            with _HELD_HERE_LOCK:
                _HELD_HERE[_file_identity(os.fstat(owner.fd))] = os.getpid()
        return True

    def release_owner_lock(self, owner: TurnLock) -> None:
        """Let go of the lock :meth:`take_owner_lock` took."""
        if owner.fd is not None:
            identity = _file_identity(os.fstat(owner.fd))
            with _HELD_HERE_LOCK:
                if _HELD_HERE.get(identity) == os.getpid():
                    del _HELD_HERE[identity]
        owner.release()

    def owned_elsewhere(self) -> str:
        """Why room calls are refused while another holder has :meth:`owner_lock`: another Gateway of this
        process (its lock file is one :meth:`take_owner_lock` noted), else another process (:func:`rooms_held_text`).
        """
        try:
            identity = _file_identity(os.lstat(self.directory / OWNER_LOCK))
        except OSError:
            identity = None
        with _HELD_HERE_LOCK:
            here = identity is not None and _HELD_HERE.get(identity) == os.getpid()
        return rooms_held_text(self.relay.base.parent, in_this_process=here)

    def drop(self, record: RoomRecord) -> None:
        """Disband a room on disk: delete its file, then the start mark of its ``running`` turn.

        The file goes first: a member turn of the room still queued then never starts
        (:class:`RoomStartMarks` refuses it: it looks at the file after writing its mark, so
        either it finds the file gone or the mark is removed here), and one running finishes unrecorded.

        Args:
            record: the room, as its driver holds it.

        Raises:
            HostileFileError: ``rooms/`` (or ``bot_relay/``) is a symlink, a file or not ours: nothing was deleted.
            OSError: the file could not be deleted (nothing was).
        """
        self.remove(record.room_id)
        if record.running is not None:
            self.forget_start(record.running["turn_id"])

    def start_mark(self, turn_id: str) -> Path:
        """``rooms/.started/<turn_id>.json``: present once the member turn ``turn_id`` began."""
        if not is_delivery_id(turn_id):
            raise ValidationError(f"bad turn id {turn_id!r}: expected 32 lowercase hex characters")
        return self.directory / STARTED_DIR / f"{turn_id}.json"

    def began(self, turn_id: str) -> bool:
        """Whether the member turn ``turn_id`` may have begun: its start mark is there (whatever it is).

        A ``.started`` that is refused (a symlink, another uid's) is never looked into: the
        turn counts as begun, so it is never run twice.
        """
        try:
            return lexists_below(self.relay.base, self.start_mark(turn_id))
        except (OSError, ValidationError):
            return True  # not ours to judge: counted as begun, so it is never run twice

    def ensure_started(self) -> Path:
        """``rooms/.started``, made (0700) if missing; anything else there is moved to ``quarantine/``
        (logged, naming it) and a new one made, as a refused ``.owner.lock`` is.

        Returns:
            The directory.

        Raises:
            HostileFileError: ``rooms/`` itself (or a directory above it) is refused: nothing is moved.
            StoreError: it could not be made.
        """
        started = self.directory / STARTED_DIR
        try:
            return ensure_private_dir(started, within=self.relay.root)
        except HostileFileError:
            pass
        with _STARTED_REPAIR:
            ensure_private_dir(self.directory, within=self.relay.root)  # rooms/ refused: raised, never repaired here
            try:
                return ensure_private_dir(started, within=self.relay.root)  # put right by another turn meanwhile
            except HostileFileError as exc:
                quarantine(self.relay, started, f"the room turns' start-mark directory is refused ({exc})")
            return ensure_private_dir(started, within=self.relay.root)

    def forget_start(self, turn_id: str) -> None:
        """Remove the start mark of a member turn the room file no longer holds as ``running``
        (through the checked ``.started``: a swapped one is never followed)."""
        try:
            remove_below(self.relay.root, self.start_mark(turn_id))
        except (OSError, ValidationError) as exc:  # a leftover mark is swept at the next start
            logger.warning("room turn {}: its start mark could not be removed ({})", turn_id, exc)

    def sweep_starts(self, running: set[str]) -> None:
        """Remove every start mark but those of the ``running`` turns (a crash left them behind).

        A refused ``.started`` is moved to ``quarantine/`` and made anew (:meth:`ensure_started`):
        ask :meth:`began` about the running turns first.
        """
        try:
            self.ensure_started()
            with relay_dir(self.relay.base, self.directory / STARTED_DIR) as fd:
                names = os.listdir(fd)
        except (OSError, ValidationError) as exc:
            logger.warning("the start marks of room turns in {} cannot be swept: {}", self.directory, exc)
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
        """Delete the room's file (gone already: nothing to do), through the checked ``rooms/`` (:func:`remove_below`).

        Raises:
            HostileFileError: ``rooms/`` (or ``bot_relay/``) is a symlink, a file or not ours: nothing was deleted
                (one swapped while the gateway runs is put back by its next start).
            OSError: the file could not be deleted.
        """
        remove_below(self.relay.root, self.path(room_id))


class RoomStartMarks:
    """The journal-shaped recorder a ProfileActor hands to a room's member turn.

    ``execute_turn`` calls ``append_durably({"t": "started", "id": <turn id>})``
    right before the runner runs; here that writes ``rooms/.started/<turn_id>.json``.
    After a kill -9 the room's ``running`` turn with a mark may have run (it is shown
    interrupted, never run twice); one without a mark never began (it was queued
    behind the member's DMs) and runs at the next start. A turn of a room that was
    disbanded while it waited is refused here, so it never runs: the room's file is looked
    at after the mark is written, the reverse of a disband's order (:meth:`RoomFiles.drop`),
    so no disband lands between the look and the mark.

    Args:
        root: the Hermes root.
        room_id: the turn's room (:func:`~hermes_actors.rooms.turn_author.room_of_author`).
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
            mark = files.start_mark(turn_id)
            files.ensure_started()
            atomic_write_bytes(mark, orjson.dumps({"turn_id": turn_id, "room_id": self.room_id}),
                               tmp_dir=files.relay.tmp, fsync=files.fsync, within=files.relay.base)
            # Only now, the mark there: a disband deletes the room's file, then its running turn's mark
            # (RoomFiles.drop). Either the file is still here and the disband comes after this look (it removes the
            # mark; the turn runs as one already running), or it is gone and the mark is withdrawn here.
            self._check_room_after_mark(turn_id)
        except StoreError:
            raise
        except ValidationError as exc:  # a bad id, or a hostile directory (HostileFileError)
            raise StoreError(f"the start mark of room turn {turn_id} was refused: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"the start mark of room turn {turn_id} could not be written: {exc}") from exc


    def _check_room_after_mark(self, turn_id: str) -> None:
        """The room's file, looked at once the turn's start mark is on disk; the mark withdrawn if the turn cannot run.

        Looked up through the checked ``rooms/`` (a swapped one is refused, never followed). A look that fails
        (a refused directory, out of descriptors) withdraws the mark too: the turn does not run, and a kill
        before the room records it failed must not leave a mark that makes the next start call it interrupted.

        Raises:
            StoreError: the room is gone (disbanded), or the look failed.
        """
        files = self.files
        try:
            there = lexists_below(files.relay.base, files.path(self.room_id))
        except (OSError, ValidationError) as exc:  # HostileFileError included
            files.forget_start(turn_id)
            raise StoreError(f"room {self.room_id}'s file could not be looked at for member turn {turn_id} ({exc}): "
                             "the turn does not run") from exc
        if not there:  # disbanded while the turn was queued
            files.forget_start(turn_id)
            raise StoreError(f"room {self.room_id} was disbanded: its member turn {turn_id} does not run")


class RoomsOnDisk:
    """The room calls that need no gateway, on the room files: ``list_rooms``, ``room_transcript``, ``disband_room``.

    For a command run with no host on the root (``hermes-actors room list|show|disband``):
    nothing is started, no round resumes and no turn runs. The reads change no file; their
    answers are those of :class:`hermes_actors.gateway.Gateway` as of the files' last
    write. ``disband_room`` deletes the room's file under the rooms owner lock, as the
    gateway's disband would.

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
        return [dict(e) for e in records[room_id].transcript]

    def disband_room(self, room: Any) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.disband_room`, for a root no gateway drives.

        A gateway started to disband would first resume the room's pending round and start its member turns;
        here none runs: the room's file (and its ``running`` turn's start mark) is deleted under the rooms owner
        lock (:meth:`RoomFiles.drop`), so no gateway starting meanwhile drives it.

        Args:
            room: the room's id or name.

        Returns:
            The room dict with ``state: "disbanded"``.

        Raises:
            KeyError: no such room, or a reference naming two rooms (rooms.rules.find_room), naming it.
            RuntimeError: the room directory is refused, another gateway process drives the rooms, or the file
                could not be deleted (:func:`~hermes_actors.rooms.rules.not_disbanded`: the room stays).
        """
        if not os.path.lexists(self.files.directory):
            raise no_room(room)  # no room was ever made on this root: nothing is created to say so
        owner = self.files.owner_lock()
        try:
            held = owner.try_acquire()
        except OSError as exc:
            owner.close()
            raise RuntimeError(f"rooms are unavailable: the room directory is refused ({exc})") from exc
        if not held:
            owner.close()
            raise RuntimeError(f"rooms are unavailable: {self.files.owned_elsewhere()}")
        try:
            records = {r.room_id: r for r in self._records()}  # read under the lock: as its last driver left it
            room_id = find_room(((r.room_id, r.name) for r in records.values()), room)
            try:
                self.files.drop(records[room_id])
            except (OSError, HostileFileError) as exc:  # one line for the command, not a traceback
                logger.warning("room {}: not disbanded: {}", records[room_id].name, exc)
                raise not_disbanded(records[room_id].name, self.files.path(room_id), exc) from exc
        finally:
            owner.release()
            owner.close()
        return {**records[room_id].summary(), "state": "disbanded"}
