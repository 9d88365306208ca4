"""Which method handles which message type: the ``@handles`` mark and the table a class's marks make.

Pure: nothing here touches an actor or pykka. :class:`~actors.typed.TypedActor`
builds its table once per class and looks a message's type up in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from actors.errors import UnknownMessageError

__all__ = ["handler_name", "handler_table", "handles", "unknown_message"]

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


def handler_table(cls: type) -> dict[type, str]:
    """Pure: the message type → method name table of ``cls``'s ``@handles`` marks.

    A subclass's mark for a type wins over its bases' (the MRO is walked base first).

    Args:
        cls: the actor class.

    Returns:
        The table.
    """
    table: dict[type, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            for message_type in getattr(value, _HANDLES_ATTR, ()):
                table[message_type] = attr
    return table


def handler_name(table: Mapping[type, str], message_type: type) -> str | None:
    """Pure: the method that handles ``message_type``: its own class's, else its nearest base's.

    Args:
        table: from :func:`handler_table`.
        message_type: the message's class.

    Returns:
        The method name, or None when no handler accepts the type.
    """
    for klass in message_type.__mro__:
        name = table.get(klass)
        if name is not None:
            return name
    return None


def unknown_message(actor: str, message: Any, table: Mapping[type, str]) -> UnknownMessageError:
    """Pure: the error for a message no handler accepts, naming what the actor does handle.

    Args:
        actor: the actor's class name.
        message: the message.
        table: the actor's table (:func:`handler_table`).

    Returns:
        The error (not raised).
    """
    known = ", ".join(sorted(t.__name__ for t in table)) or "nothing"
    return UnknownMessageError(f"{actor} has no handler for {type(message).__name__}; it handles: {known}")
