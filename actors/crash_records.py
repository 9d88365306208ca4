"""What a crash of a :class:`~actors.typed.TypedActor` leaves behind: the link it reports through,
what it collects until it stops, and how the asks nobody will answer fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger

from actors.messages import Request

__all__ = ["CrashRecord", "EndOfMailbox", "Link", "fail_pending"]


@dataclass(frozen=True, slots=True)
class Link:
    """How a supervised child reports its crash: its name and its supervisor."""

    supervisor: pykka.ActorRef[Any]
    name: str
    generation: int = 0


@dataclass(frozen=True, slots=True)
class EndOfMailbox:
    """Told by a crashed actor to itself: everything queued before it is the unhandled mailbox."""


class CrashRecord:
    """What a crashed actor collects until it stops: the error, its salvage and the messages held."""

    __slots__ = ("error", "held", "salvage")

    def __init__(self, error: BaseException, salvage: Any) -> None:
        self.error = error
        self.salvage = salvage
        self.held: list[Any] = []


def fail_pending(who: str, pending: list[Any] | tuple[Any, ...]) -> None:
    """Fail the asks among ``pending`` with ``ActorDeadError``; log the dropped tells.

    Args:
        who: the actor that can no longer answer them (for the message).
        pending: told messages and :class:`Request` objects.
    """
    for message in pending:
        if isinstance(message, Request):
            message.fail(pykka.ActorDeadError(f"{who} crashed before handling {type(message.message).__name__}"))
        else:
            logger.error("{} crashed; told {} dropped", who, type(message).__name__)
