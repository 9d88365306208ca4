"""Every message type the toolkit itself sends, in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

from actors.hooks import call_hook

__all__ = ["ChildFailed", "FileAppeared", "FileRemoved", "Relayed", "Request", "Rescan"]


_NO_REPLY: Any = object()  # what a failed make_reply leaves


class Request:
    """An asked message (our own envelope, so no pykka internals are needed).

    ``actors.ask`` sends it with pykka's public ``ref.ask``; the TypedActor answers
    through pykka's reply. When the asked actor crashes before handling it, the
    request is handed to the restarted instance with ``relay`` set: the asker then
    waits on ``relay`` instead (see :class:`actors.asking.Reply`).

    A request sent by :func:`actors.asking.ask_reply_to` has ``reply_to`` set: its
    answer (or error) is told to that actor as ``make_reply(value, error)``, so
    the asker never blocks.
    """

    __slots__ = ("make_reply", "message", "relay", "reply_to")

    def __init__(
        self,
        message: Any,
        relay: pykka.ThreadingFuture[Any] | None = None,
        *,
        reply_to: pykka.ActorRef[Any] | None = None,
        make_reply: Callable[[Any, BaseException | None], Any] | None = None,
    ) -> None:
        self.message = message
        self.relay = relay
        self.reply_to = reply_to
        self.make_reply = make_reply

    def reply(self, value: Any, error: BaseException | None) -> bool:
        """Tell ``reply_to`` the answer, when the asker asked for one; True when it was told.

        Args:
            value: the handler's answer (None on error).
            error: the handler's error, or None.

        Returns:
            False for a request without ``reply_to``, whose asker is gone, or whose
            ``make_reply`` raised (logged; the asker keeps its own deadline).
        """
        make_reply = self.make_reply
        if self.reply_to is None or make_reply is None:
            return False
        reply = call_hook(self, "make_reply", lambda: make_reply(value, error), _NO_REPLY)
        if reply is _NO_REPLY:
            return False
        try:
            self.reply_to.tell(reply)
        except pykka.ActorDeadError:
            return False
        return True

    def fail(self, error: Exception) -> None:
        """Answer the request with ``error``: through ``relay`` if relayed, to ``reply_to`` if set."""
        if self.relay is not None:
            self.relay.set_exception(exc_info=(type(error), error, None))
        self.reply(None, error)

    def __repr__(self) -> str:
        return f"Request({self.message!r})"


@dataclass(frozen=True, slots=True)
class Relayed:
    """The first answer to an ask the actor could not handle itself: wait on ``future`` instead."""

    future: pykka.ThreadingFuture[Any]


@dataclass(frozen=True, slots=True)
class ChildCrashed:
    """Told by a child to its supervisor the moment it crashes, before it stops.

    The supervisor sends it nothing more (its messages would arrive after the child
    stopped, where pykka drops them) and answers :class:`Retire`: what it sent before
    reaches the child ahead of that, and is collected into the :class:`ChildFailed`
    report. ``ref`` is the crashed instance (a stale generation is retired too).
    """

    name: str
    generation: int
    ref: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class Retire:
    """Told by a supervisor to a child that reported :class:`ChildCrashed`: stop collecting, stop."""


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """Told by a crashed child to its supervisor, with its unhandled mailbox.

    ``pending`` holds the told messages and :class:`Request` objects that were
    queued behind the crash, in arrival order.
    """

    name: str
    generation: int
    error: BaseException | None
    pending: tuple[Any, ...]
    salvage: Any = None
    ref: pykka.ActorRef[Any] | None = None  # the crashed instance (a report for another one is stale)


@dataclass(frozen=True, slots=True)
class FileAppeared:
    """A file was created in, moved into, or closed after a write in a watched directory (a hint, not the truth).

    A file written in place after its creation appears twice: once created (possibly still empty), once closed.
    """

    path: Path

    @property
    def directory(self) -> Path:
        return self.path.parent


@dataclass(frozen=True, slots=True)
class FileRemoved:
    """A file was deleted from, or moved out of, a watched directory."""

    path: Path


@dataclass(frozen=True, slots=True)
class Rescan:
    """Reconcile with the directory listing: the listing is the truth, events are hints.

    ``reason`` is "start", "periodic", "observer-restarted" or "manual".
    """

    reason: str = "periodic"
