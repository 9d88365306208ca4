"""Typed dispatch: an actor whose handlers are chosen by the message's type.

A handler is a method decorated with ``@handles(SomeMessage)``. The message's
class (and its bases, most specific first) selects the handler. A message no
handler accepts is an error: the asker gets :class:`UnknownMessageError`; for a
tell it is logged and dropped, and the actor keeps running.

A crash (an exception from a handler of a *tell*) stops the actor; before it
stops, the messages still in its mailbox are handed to :meth:`on_crash`, so a
supervisor can pass them to the restarted actor instead of losing them.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import pykka
from loguru import logger
from pykka._envelope import Envelope

from actors.errors import UnknownMessageError

__all__ = ["Link", "TypedActor", "handles"]

M = TypeVar("M")
F = TypeVar("F", bound=Callable[..., Any])

_HANDLES_ATTR = "__handles_types__"


def handles(*message_types: type) -> Callable[[F], F]:
    """Mark a method as the handler of one or more message types.

    Args:
        message_types: the classes (usually frozen dataclasses) it handles.

    Returns:
        The decorator; the method itself is returned unchanged.
    """

    def mark(fn: F) -> F:
        setattr(fn, _HANDLES_ATTR, (*getattr(fn, _HANDLES_ATTR, ()), *message_types))
        return fn

    return mark


@dataclass(frozen=True, slots=True)
class Link:
    """How a supervised child reports its crash: its name and its supervisor."""

    supervisor: pykka.ActorRef[Any]
    name: str
    generation: int = 0


class _TrackingInbox:
    """The actor's mailbox: a C-level ``SimpleQueue`` (no Python-level Condition per put/get),
    remembering the envelope being handled so a told unknown message can be told from an asked one."""

    __slots__ = ("_queue", "current")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Envelope[Any]] = queue.SimpleQueue()
        self.current: Envelope[Any] | None = None

    def put(self, envelope: Envelope[Any], block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(envelope)

    def get(self, block: bool = True, timeout: float | None = None) -> Envelope[Any]:
        envelope = self._queue.get(block, timeout)
        self.current = envelope
        return envelope

    def get_nowait(self) -> Envelope[Any]:
        return self.get(False)

    def empty(self) -> bool:
        return self._queue.empty()

    def qsize(self) -> int:
        return self._queue.qsize()


class TypedActor(pykka.ThreadingActor):
    """A pykka actor with handlers selected by message type.

    Args:
        link: set by a supervisor; the child reports crashes through it.
    """

    _handler_table: ClassVar[dict[type, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                for message_type in getattr(value, _HANDLES_ATTR, ()):
                    table[message_type] = attr
        cls._handler_table = table

    @staticmethod
    def _create_actor_inbox() -> _TrackingInbox:
        return _TrackingInbox()

    def __init__(self, *, link: Link | None = None) -> None:
        super().__init__()
        self.link = link
        self._dispatch_cache: dict[type, Callable[[Any], Any] | None] = {}

    # ── dispatch ────────────────────────────────────────────────────────────

    def _handler_for(self, message_type: type) -> Callable[[Any], Any] | None:
        try:
            return self._dispatch_cache[message_type]
        except KeyError:
            pass
        handler: Callable[[Any], Any] | None = None
        for klass in message_type.__mro__:
            name = self._handler_table.get(klass)
            if name is not None:
                handler = getattr(self, name)
                break
        self._dispatch_cache[message_type] = handler
        return handler

    def on_receive(self, message: Any) -> Any:
        """Route ``message`` to the handler registered for its type."""
        handler = self._handler_for(type(message))
        if handler is not None:
            return handler(message)
        known = ", ".join(sorted(t.__name__ for t in self._handler_table)) or "nothing"
        error = UnknownMessageError(
            f"{type(self).__name__} has no handler for {type(message).__name__}; it handles: {known}"
        )
        inbox = self.actor_inbox
        current = inbox.current if isinstance(inbox, _TrackingInbox) else None
        if current is not None and current.reply_to is None:
            logger.warning("{} dropped a told message: {}", self, error)
            return None
        raise error

    # ── crash handling ──────────────────────────────────────────────────────

    def mailbox_size(self) -> int:
        """How many messages wait in this actor's mailbox (approximate, like any queue size)."""
        inbox = self.actor_inbox
        return inbox.qsize() if isinstance(inbox, _TrackingInbox) else 0

    def drain_mailbox(self) -> list[Envelope[Any]]:
        """Take every envelope still queued in the mailbox (used on crash)."""
        pending: list[Envelope[Any]] = []
        while True:
            try:
                pending.append(self.actor_inbox.get_nowait())  # type: ignore[attr-defined]
            except queue.Empty:
                return pending

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Hand the mailbox to :meth:`on_crash`; never lose it silently."""
        pending: list[Envelope[Any]] = []
        for envelope in self.drain_mailbox():
            if isinstance(envelope.message, pykka.messages._ActorStop):
                if envelope.reply_to is not None:  # a blocking ref.stop() waits on this: it is stopped now
                    envelope.reply_to.set(None)
                continue
            pending.append(envelope)
        try:
            self.on_crash(exception_value, pending)
        except Exception:
            logger.opt(exception=sys.exc_info()).error("{} on_crash failed", self)
            _fail_envelopes(self, pending)

    def on_crash(self, error: BaseException | None, pending: list[Envelope[Any]]) -> None:
        """Called in the actor's thread after a handler crashed, before it stops.

        The default reports to the supervisor (when linked), passing the
        mailbox along; unsupervised, pending asks fail with ``ActorDeadError``.

        Args:
            error: the exception that crashed the actor.
            pending: the envelopes that were still in the mailbox.
        """
        self.stop_timers()
        if self.link is not None:
            from actors.messages import ChildFailed

            try:
                self.link.supervisor.tell(
                    ChildFailed(self.link.name, self.link.generation, error, tuple(pending), self.salvage())
                )
                return
            except pykka.ActorDeadError:
                logger.error("{} crashed and its supervisor is gone", self)
        logger.error("{} crashed unsupervised: {!r}", self, error)
        _fail_envelopes(self, pending)

    def salvage(self) -> Any:
        """State worth handing to the restarted instance (override). Default None."""
        return None

    def stop_timers(self) -> None:
        """Cancel this actor's timers (override in actors that own timers)."""


def _fail_envelopes(actor: pykka.Actor, pending: list[Envelope[Any]]) -> None:
    for envelope in pending:
        if envelope.reply_to is not None:
            error = pykka.ActorDeadError(f"{actor} crashed before handling {type(envelope.message).__name__}")
            envelope.reply_to.set_exception(exc_info=(pykka.ActorDeadError, error, None))
