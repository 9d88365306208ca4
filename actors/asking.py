"""``ask`` and ``tell`` with timeouts and typed results.

An ask to a :class:`~actors.typed.TypedActor` travels as a :class:`~actors.messages.Request`
through pykka's public ``ref.ask``; when the actor crashed before handling it, the
answer comes from the restarted instance through a relay future. Other pykka actors
are asked plainly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

import pykka

from actors.errors import ActorGone, AskTimeout, UnexpectedReply
from actors.messages import Relayed, Request
from actors.typed import TypedActor

__all__ = ["Reply", "ask", "ask_later", "ask_reply_to", "tell"]

T = TypeVar("T")


class Reply:
    """The answer to come for :func:`ask_later`."""

    __slots__ = ("_future", "_name", "_ref")

    def __init__(self, ref: pykka.ActorRef[Any], name: str, future: pykka.Future[Any]) -> None:
        self._ref = ref
        self._name = name
        self._future = future

    def get(self, *, timeout: float, expect: type[T] | None = None) -> Any:
        """Wait at most ``timeout`` seconds for the answer.

        Args:
            timeout: seconds; there is no "wait forever".
            expect: when given, the answer must be an instance of this type.

        Returns:
            The handler's return value.

        Raises:
            AskTimeout: no answer in time.
            ActorGone: the actor is dead, or died before answering.
            UnexpectedReply: the answer is not an ``expect``.
            Exception: whatever the handler raised, re-raised here.
        """
        deadline = time.monotonic() + timeout
        result = self._wait(self._future, timeout)
        if isinstance(result, Relayed):  # the actor crashed first; its successor answers
            result = self._wait(result.future, max(0.0, deadline - time.monotonic()))
        if expect is not None and not isinstance(result, expect):
            raise UnexpectedReply(
                f"{self._ref} answered {self._name} with {type(result).__name__}, expected {expect.__name__}"
            )
        return result

    def _wait(self, future: pykka.Future[Any], timeout: float) -> Any:
        try:
            return future.get(timeout=timeout)
        except pykka.Timeout as exc:
            raise AskTimeout(f"{self._ref} did not answer {self._name} within {timeout:g}s") from exc
        except pykka.ActorDeadError as exc:
            raise ActorGone(f"{self._ref} died before answering {self._name}: {exc}") from exc


def ask_later(ref: pykka.ActorRef[Any], message: Any) -> Reply:
    """Send ``message`` as an ask without waiting; ``.get(timeout=...)`` the answer later.

    Args:
        ref: the actor to ask.
        message: a typed message.

    Returns:
        The :class:`Reply` to wait on.

    Raises:
        ActorGone: the actor is dead.
    """
    envelope = Request(message) if issubclass(ref.actor_class, TypedActor) else message
    try:
        future = ref.ask(envelope, block=False)
    except pykka.ActorDeadError as exc:
        raise ActorGone(f"cannot ask {type(message).__name__}: {exc}") from exc
    return Reply(ref, type(message).__name__, future)


def ask_reply_to(
    ref: pykka.ActorRef[Any],
    message: Any,
    *,
    reply_to: pykka.ActorRef[Any],
    make_reply: Callable[[Any, BaseException | None], Any],
) -> None:
    """Ask a TypedActor without waiting: its answer is told back to ``reply_to``.

    The asked actor tells ``make_reply(answer, None)`` once its handler returned, or
    ``make_reply(None, error)`` when the handler raised or the actor crashed without a
    successor. This is the reply-later pattern: an actor asks another without blocking
    its own mailbox.

    Args:
        ref: the TypedActor to ask.
        message: a typed message.
        reply_to: the actor that receives the reply message.
        make_reply: builds the reply message (runs on the asked actor's thread: keep it a
            plain constructor).

    An actor that is *stopped* (not crashed) with the request still queued never
    replies (pykka fails its queued asks): the asker keeps its own deadline.

    Raises:
        ActorGone: the actor is dead.
        TypeError: ``ref`` is not a TypedActor (only those tell replies back).
    """
    if not issubclass(ref.actor_class, TypedActor):
        raise TypeError(f"ask_reply_to needs a TypedActor, got {ref.actor_class.__name__}")
    if not ref.is_alive():
        raise ActorGone(f"cannot ask {type(message).__name__}: {ref} is not running")
    ref.ask(Request(message, reply_to=reply_to, make_reply=make_reply), block=False)


@overload
def ask(ref: pykka.ActorRef[Any], message: Any, *, timeout: float, expect: type[T]) -> T: ...
@overload
def ask(ref: pykka.ActorRef[Any], message: Any, *, timeout: float, expect: None = None) -> Any: ...


def ask(ref: pykka.ActorRef[Any], message: Any, *, timeout: float, expect: type[T] | None = None) -> Any:
    """Send ``message`` and wait at most ``timeout`` seconds for the answer.

    Args:
        ref: the actor to ask.
        message: a typed message.
        timeout: seconds; there is no "wait forever".
        expect: when given, the answer must be an instance of this type.

    Returns:
        The handler's return value.

    Raises:
        AskTimeout: no answer in time.
        ActorGone: the actor is dead, or died before answering.
        UnexpectedReply: the answer is not an ``expect``.
        HandlerAborted: the handler raised SystemExit, KeyboardInterrupt or the like.
        Exception: whatever the handler raised, re-raised here.
    """
    return ask_later(ref, message).get(timeout=timeout, expect=expect)


def tell(ref: pykka.ActorRef[Any], message: Any) -> bool:
    """Tell ``message``; returns False (instead of raising) when the actor is gone.

    Args:
        ref: the actor to tell.
        message: a typed message.

    Returns:
        True when it was queued.
    """
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        return False
    return True
