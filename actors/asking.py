"""``ask`` and ``tell`` with timeouts and typed results."""

from __future__ import annotations

from typing import Any, TypeVar, overload

import pykka

from actors.errors import ActorGone, AskTimeout, UnexpectedReply

__all__ = ["ask", "tell"]

T = TypeVar("T")


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
        Exception: whatever the handler raised, re-raised here.
    """
    try:
        future = ref.ask(message, block=False)
    except pykka.ActorDeadError as exc:
        raise ActorGone(f"cannot ask {type(message).__name__}: {exc}") from exc
    try:
        result = future.get(timeout=timeout)
    except pykka.Timeout as exc:
        raise AskTimeout(f"{ref} did not answer {type(message).__name__} within {timeout}s") from exc
    except pykka.ActorDeadError as exc:
        raise ActorGone(f"{ref} died before answering {type(message).__name__}: {exc}") from exc
    if expect is not None and not isinstance(result, expect):
        raise UnexpectedReply(
            f"{ref} answered {type(message).__name__} with {type(result).__name__}, expected {expect.__name__}"
        )
    return result


def tell(ref: pykka.ActorRef[Any], message: Any) -> bool:
    """Tell ``message``; returns False (instead of raising) when the actor is gone."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        return False
    return True
