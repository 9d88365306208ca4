"""How a room's member turn names its room: the ``Delivery.author`` of the turn.

The RoomActor stamps a member turn with :func:`room_author`; the ProfileActor that runs
it reads the room back with :func:`room_of_author` (to record the turn's start in the
room's start marks rather than in the delivery journal).
"""

from __future__ import annotations

from typing import Any

__all__ = ["room_author", "room_of_author"]

_AUTHOR_PREFIX = "room:"  # a member turn's ``Delivery.author["id"]`` is ``room:<room_id>``


def room_author(room_id: str, name: str) -> dict[str, Any]:
    """Pure: the ``Delivery.author`` of a member turn of room ``room_id`` (:func:`room_of_author` reads it)."""
    return {"id": f"{_AUTHOR_PREFIX}{room_id}", "name": name, "is_bot": False}


def room_of_author(author: Any) -> str:
    """Pure: the room id in a member turn's ``Delivery.author`` ("" when there is none)."""
    ident = author.get("id") if isinstance(author, dict) else None
    return ident.removeprefix(_AUTHOR_PREFIX) if isinstance(ident, str) and ident.startswith(_AUTHOR_PREFIX) else ""
