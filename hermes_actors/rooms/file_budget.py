"""Keeping a room file within its byte budget: which transcript entries go, which texts are cut.

Pure functions of a :class:`~hermes_actors.rooms.room_record.RoomRecord`: :func:`fit_room`
drops the oldest transcript entries (counted into ``base``) until the file fits
:data:`ROOM_WRITE_BUDGET`, never an acked send whose round has not ended
(:func:`undelivered_from`), and cuts the oldest replies' texts to a note when that is not
enough. The limits on what a room holds (:data:`MAX_PENDING_SENDS`,
:data:`UNDELIVERED_BUDGET`, enforced by the RoomActor) are set here against that budget.
"""

from __future__ import annotations

from typing import Any

import orjson

from hermes_actors.rooms.room_record import RoomRecord

__all__ = [
    "MAX_PENDING_SENDS",
    "ROOM_WRITE_BUDGET",
    "TRANSCRIPT_KEEP",
    "UNDELIVERED_BUDGET",
    "fit_room",
    "undelivered_bytes",
    "undelivered_from",
]

TRANSCRIPT_KEEP = 500  # newest transcript entries kept in the file
# The writer keeps every room file at most this big by dropping the oldest transcript entries: 500
# entries of 16,000 characters can be 24+ MB of UTF-8 (far more escaped), so the count alone bounds nothing.
ROOM_WRITE_BUDGET = 4 << 20
# Acked sends whose rounds have not started (each a small dict): capped so that everything but the
# transcript stays far below ROOM_WRITE_BUDGET (1,000 sends are well under 1 MiB).
MAX_PENDING_SENDS = 1000
# Acked sends whose rounds have not ended are never dropped or cut: room_send refuses a send that would make
# their own text more than this, leaving the rest of ROOM_WRITE_BUDGET to the members' replies (fit_room).
UNDELIVERED_BUDGET = ROOM_WRITE_BUDGET // 2


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
