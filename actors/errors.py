"""Errors raised by the actor toolkit."""

from __future__ import annotations

__all__ = ["ActorGone", "AskTimeout", "EscalatedFailure", "UnexpectedReply", "UnknownMessageError"]


class UnknownMessageError(TypeError):
    """An actor received a message type it has no handler for."""


class AskTimeout(TimeoutError):
    """An ``ask`` got no answer within its timeout."""


class ActorGone(RuntimeError):
    """The asked actor is dead or died before answering."""


class UnexpectedReply(TypeError):
    """An ``ask`` got an answer of another type than the one expected."""


class EscalatedFailure(RuntimeError):
    """A supervised child crashed more often than its restart intensity allows."""

    def __init__(self, child: str, cause: BaseException | None) -> None:
        super().__init__(f"child {child!r} exceeded its restart intensity; last error: {cause!r}")
        self.child = child
        self.cause = cause
