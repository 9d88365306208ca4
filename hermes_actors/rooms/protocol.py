"""The RoomActor's messages (the Dispatcher's side, ``RoomTurn``, is in :mod:`hermes_actors.messages`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes_actors.messages import Outcome, RosterSnapshot

__all__ = ["AwaitIdle", "Disband", "GetSummary", "GetTranscript", "Halt", "MemberTurnDone", "RoomSend"]


@dataclass(frozen=True, slots=True)
class RoomSend:
    """Ask a RoomActor to accept a message; answered with the ack or refusal dict once it is on disk.

    ``snapshot`` is the roster now: names in the text (and the sender's) resolve against it.
    """

    sender: str
    text: Any
    snapshot: RosterSnapshot


@dataclass(frozen=True, slots=True)
class MemberTurnDone:
    """Told to the RoomActor (through the Dispatcher) when a member's turn settled."""

    turn_id: str
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class GetTranscript:
    """Ask for the transcript: a list of ``{message_id, author, text, at, round, status}`` dicts."""


@dataclass(frozen=True, slots=True)
class GetSummary:
    """Ask for the room's ``list_rooms`` row: ``room_id``, ``name``, ``members``, ``state``, ``messages``,
    ``last_activity``."""


@dataclass(frozen=True, slots=True)
class AwaitIdle:
    """Ask for a future resolved with the room's state once it is not ``busy``."""


@dataclass(frozen=True, slots=True)
class Halt:
    """Ask the RoomActor to start no further member turns (the gateway is stopping)."""


@dataclass(frozen=True, slots=True)
class Disband:
    """Ask the RoomActor to delete its file and end; answered with the room dict."""
