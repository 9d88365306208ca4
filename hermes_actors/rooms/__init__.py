"""Group rooms: several bots deliberate together, event-driven and durable (docs/rooms.md).

``rules`` (pure decisions), ``store`` (the room files), ``room_record`` (the record
and its validation), ``file_budget`` (what a write keeps of the transcript),
``turn_author`` (how a member turn names its room), ``protocol`` (the
RoomActor's messages), ``room_actor`` (one actor per room), ``rooms`` (the
``Rooms`` object the Gateway composes).
"""

from __future__ import annotations

from hermes_actors.rooms.rooms import Rooms

__all__ = ["Rooms"]
