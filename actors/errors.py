"""Errors raised by the actor toolkit."""

from __future__ import annotations

__all__ = ["ActorGone", "AskTimeout", "EscalatedFailure", "HandlerAborted", "UnexpectedReply", "UnknownMessageError"]


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


class HandlerAborted(RuntimeError):
    """A handler raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt, ...).

    The asker gets this instead of the raw BaseException, so user code can never
    stop the actor system (pykka would stop every actor in the process).
    """

    def __init__(self, actor: str, cause: BaseException) -> None:
        super().__init__(f"{actor} handler raised {cause!r}")
        self.cause = cause
